"""Tiny Hugging Face causal LMs built from configs (random init), with a byte-level BPE tokenizer trained locally.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on a small built-in corpus, the model is
initialised from a seed, and both are saved with ``save_pretrained`` into a cache folder (built once, atomically,
and reused). ``model_name: tiny:qwen2-tiny`` in a config resolves here (``rl_core.data.models``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rl_core.base.errors import InputError
from rl_core.base.paths import cache_root
from rl_core.data.quiet import no_progress_bars

_TINY = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
_SMALL = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
)

#: name -> (architecture family, model config overrides). "tiny" ~1M parameters, "small" ~25M.
TINY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2-tiny": ("qwen2", _TINY),
    "llama-tiny": ("llama", _TINY),
    # the other families the megatron backend converts, and tied embeddings (as in small Qwen2 checkpoints)
    "qwen3-tiny": ("qwen3", {**_TINY, "head_dim": 32}),
    "mistral-tiny": ("mistral", _TINY),
    "qwen2-tiny-tied": ("qwen2", {**_TINY, "tie_word_embeddings": True}),
    "qwen2-small": ("qwen2", _SMALL),
    "llama-small": ("llama", _SMALL),
}
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]
_VERSION = "4"


def _corpus() -> list[str]:

    rng = random.Random(0)
    lines = []
    for _ in range(4000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        lines.append(f"Q: {a} {op} {b} = ? A: {eval(f'{a}{op}{b}')}")
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 8)))
        lines.append(f"Sort the digits {digits}. Answer: {''.join(sorted(digits))}")
        spaced = " ".join(digits)
        lines.append(f"Even or odd? {spaced} {'even' if int(digits[-1]) % 2 == 0 else 'odd'}")
    words = [
        "the",
        "a",
        "of",
        "to",
        "and",
        "is",
        "in",
        "that",
        "it",
        "for",
        "you",
        "was",
        "with",
        "on",
        "as",
        "have",
        "be",
        "at",
        "one",
        "this",
        "what",
        "answer",
        "question",
    ]
    lines += [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    return lines


def build_tokenizer(path: Path) -> Any:
    """Train a byte-level BPE tokenizer on the built-in corpus and save it as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[1])
    fast.save_pretrained(path)
    return fast


def build_model(name: str, path: Path, seed: int = 0) -> Path:
    """Build the tiny model ``name`` (random init from ``seed``) with its tokenizer into ``path``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    family, overrides = TINY_MODELS[name]
    tok = build_tokenizer(path)
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        **{
            "max_position_embeddings": 1024,
            "tie_word_embeddings": False,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.eos_token_id,
            **overrides,
        },
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    with no_progress_bars():
        model.save_pretrained(path, safe_serialization=True)
    return path


def ensure_tiny_model(name: str, seed: int = 0, root: Path | None = None) -> Path:
    """The folder of tiny model ``name``, built on first use (atomically: a half-built folder is never used)."""
    if name not in TINY_MODELS:
        raise InputError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_MODELS)}")
    key = hashlib.sha256(json.dumps([_VERSION, name, TINY_MODELS[name], VOCAB_SIZE, seed]).encode()).hexdigest()[:12]
    final = (root or cache_root()) / "models" / f"{name}-{key}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        build_model(name, tmp, seed)
        try:
            tmp.rename(final)
        except OSError:  # built concurrently by another process: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final

"""Hugging Face <-> Megatron weights for the Llama / Qwen2 / Qwen3 / Mistral family, and the one-time conversion
folder.

Names: ``embed_tokens -> embedding.word_embeddings``, ``lm_head -> output_layer``, norms ->
``input_layernorm`` / ``pre_mlp_layernorm`` / ``decoder.final_layernorm``, ``o_proj -> linear_proj``,
``down_proj -> linear_fc2``; q, k, v -> ``linear_qkv`` interleaved per KV group ``[q heads of group g | k_g | v_g]``
(biases likewise); ``cat(gate, up) -> linear_fc1``. Tensor parallelism splits row-parallel weights
(``linear_proj``, ``linear_fc2``) on dim 1 and the rest on dim 0 (``linear_fc1`` as ``cat(gate_r, up_r)``).

The conversion is written once per source checkpoint (keyed by the hash of its config and weight files) into
``RL_MEGATRON_CHECKPOINT_DIR``, else ``$HF_HOME/rl_core``, else ``~/.cache/huggingface/rl_core``, atomically:
a crash mid-way leaves a temporary folder that is never used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_core.api import InputError

SUPPORTED = {"llama", "qwen2", "qwen3", "mistral"}
CONVERTED = "megatron_weights.safetensors"


def conversion_root() -> Path:
    """``RL_MEGATRON_CHECKPOINT_DIR``, else ``$HF_HOME/rl_core``, else ``~/.cache/huggingface/rl_core``."""
    if os.environ.get("RL_MEGATRON_CHECKPOINT_DIR"):
        return Path(os.environ["RL_MEGATRON_CHECKPOINT_DIR"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "rl_core"
    return Path.home() / ".cache" / "huggingface" / "rl_core"


def check_architecture(hf_config: Any) -> None:
    if hf_config.model_type not in SUPPORTED:
        raise InputError(
            f"the megatron backend converts {', '.join(sorted(SUPPORTED))} models; this checkpoint is a "
            f"{hf_config.model_type!r} ({', '.join(hf_config.architectures or [])})"
        )


def source_key(hf_dir: Path) -> str:
    """Hash of the source checkpoint's config and weight files: a changed source gets a new conversion."""
    digest = hashlib.sha256()
    for path in sorted(hf_dir.iterdir()):
        if path.name == "config.json" or path.suffix in (".safetensors", ".bin"):
            digest.update(path.name.encode())
            with path.open("rb") as f:
                for block in iter(functools.partial(f.read, 1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


#: tensors that only change their names: (Hugging Face, Megatron), for the model and for each layer; the query and
#: key norms are Qwen3's only.
_MODEL_NAMES = (
    ("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
    ("model.norm.weight", "decoder.final_layernorm.weight"),
)
_UNTIED_HEAD = ("lm_head.weight", "output_layer.weight")  # tied: the model shares the embedding
_LAYER_NAMES = (
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)
_OPTIONAL_LAYER_NAMES = (
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
)


def _renamed(cfg: Any) -> list[tuple[str, str, bool]]:
    """Every renamed tensor: (Hugging Face name, Megatron name, whether the model may lack it)."""
    pairs = [(h, m, False) for h, m in _MODEL_NAMES]
    if not cfg.tie_word_embeddings:
        pairs.append((*_UNTIED_HEAD, False))
    for i in range(cfg.num_hidden_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        pairs += [(hf + h, mg + m, False) for h, m in _LAYER_NAMES]
        pairs += [(hf + h, mg + m, True) for h, m in _OPTIONAL_LAYER_NAMES]
    return pairs


def _qkv_shape(cfg: Any) -> tuple[int, int, int]:
    """Query-key-value groups, query heads per group, head size."""
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    return groups, heads // groups, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def hf_to_megatron(state: Mapping[str, Any], cfg: Any) -> dict[str, Any]:
    """Full (unsharded) Megatron-named weights from a Hugging Face state dict: renamed tensors, and the fused
    query-key-value (grouped by key-value head) and gate-up projections."""
    import torch

    groups, per_group, d = _qkv_shape(cfg)
    out = {m: state[h] for h, m, optional in _renamed(cfg) if not optional or h in state}
    for i in range(cfg.num_hidden_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            q = state.get(f"{hf}self_attn.q_proj.{kind}")
            if q is None:
                continue
            k, v = state[f"{hf}self_attn.k_proj.{kind}"], state[f"{hf}self_attn.v_proj.{kind}"]
            rest = q.shape[1:]
            qg = q.reshape(groups, per_group * d, *rest)
            kg, vg = k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)
            out[f"{mg}self_attention.linear_qkv.{kind}"] = torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)
        gate_up = [state[hf + "mlp.gate_proj.weight"], state[hf + "mlp.up_proj.weight"]]
        out[mg + "mlp.linear_fc1.weight"] = torch.cat(gate_up)
    return out


def megatron_to_hf(state: Mapping[str, Any], cfg: Any) -> dict[str, Any]:
    """The inverse of ``hf_to_megatron`` (full weights, Hugging Face names)."""
    groups, per_group, d = _qkv_shape(cfg)
    out = {h: state[m] for h, m, optional in _renamed(cfg) if not optional or m in state}
    for i in range(cfg.num_hidden_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = state.get(f"{mg}self_attention.linear_qkv.{kind}")
            if qkv is None:
                continue
            rest = qkv.shape[1:]
            grouped = qkv.reshape(groups, (per_group + 2) * d, *rest)
            q, k, v = grouped.split([per_group * d, d, d], dim=1)
            out[f"{hf}self_attn.q_proj.{kind}"] = q.reshape(-1, *rest).contiguous()
            out[f"{hf}self_attn.k_proj.{kind}"] = k.reshape(-1, *rest).contiguous()
            out[f"{hf}self_attn.v_proj.{kind}"] = v.reshape(-1, *rest).contiguous()
        gate, up = state[mg + "mlp.linear_fc1.weight"].chunk(2)
        out[hf + "mlp.gate_proj.weight"], out[hf + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
    return out


def _split_dim(name: str) -> int | None:
    """The dimension tensor parallelism splits ``name`` on (None: replicated)."""
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")) or name in (
        "embedding.word_embeddings.weight",
        "output_layer.weight",
    ):
        return 0
    return None


def shard(name: str, full: Any, rank: int, size: int) -> Any:
    """This TP rank's part of a full Megatron weight (``linear_fc1``: ``cat(gate_r, up_r)``)."""
    import torch

    dim = _split_dim(name)
    if dim is None or size == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]]).contiguous()
    return full.chunk(size, dim=dim)[rank].contiguous()


def unshard(name: str, parts: list[Any]) -> Any:
    """The full weight from all TP ranks' parts (the inverse of ``shard``)."""
    import torch

    dim = _split_dim(name)
    if dim is None or len(parts) == 1:
        return parts[0]
    if name.endswith("linear_fc1.weight"):
        gates, ups = zip(*(p.chunk(2) for p in parts), strict=True)
        return torch.cat([torch.cat(gates), torch.cat(ups)])
    return torch.cat(parts, dim=dim)


def convert_once(hf_dir: Path, *, force: bool = False, log: Any = print) -> Path:
    """The conversion folder of ``hf_dir``: reused when complete, else written (atomically)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    hf_dir = Path(hf_dir)
    cfg = AutoConfig.from_pretrained(hf_dir)
    check_architecture(cfg)
    final = conversion_root() / f"{hf_dir.name}-{source_key(hf_dir)}"
    if (final / "meta.json").is_file() and not force:
        log(f"megatron: reusing the conversion of {hf_dir} at {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        state: dict[str, Any] = {}
        for path in sorted(hf_dir.glob("*.safetensors")):
            state.update(load_file(str(path)))
        if not state:
            raise InputError(f"{hf_dir} has no safetensors weights to convert")
        save_file(hf_to_megatron(state, cfg), str(tmp / CONVERTED))
        shutil.copy(hf_dir / "config.json", tmp / "hf_config.json")
        (tmp / "meta.json").write_text(json.dumps({"source": str(hf_dir), "key": source_key(hf_dir)}))
        if force and final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:  # converted meanwhile by another start (backends starting at once): theirs, the same
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"megatron: reusing the conversion of {hf_dir} at {final}")
            return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"megatron: converted {hf_dir} into {final}")
    return final

"""The start-up check of the shortcuts (``dtensor_cfg.check_shortcuts``) on the model it is given: every model the
suite builds passes with float-rounding gaps; a model that reads positions from its cache (planted, and MPT's ALiBi
for real) has prompt sharing turned off, with the gap, and then runs whole rows.

The forward runs in-process (one rank, no process group): the same code each rank runs under Ray."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_loss_positions import VOCAB, tiny
from transformers import LlamaConfig, LlamaForCausalLM

from rl_backend_dtensor.config import DTensorConfig
from rl_backend_dtensor.exactness import TOLERANCE, _compare, check_shortcuts, synthetic_batch
from rl_backend_dtensor.forward import ModelForward, Paths
from rl_core.base.schema import LoraConfig
from rl_core.contracts import lora


class CachePositions(LlamaForCausalLM):
    """A Llama that, given a cache, ignores ``position_ids`` and counts positions from the cache's length (as models
    whose attention reads a position from the key's index in the cache do): a planted position bug."""

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, logits_to_keep=0, **kw
    ):
        if past_key_values is not None:
            position_ids = None
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            logits_to_keep=logits_to_keep,
            **kw,
        )


def planted() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=0.2,  # logits far from uniform: a position error shows in the logprobs
    )
    return CachePositions(config)


def mpt() -> Any:
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(0)
    return MptForCausalLM(
        MptConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=128, initializer_range=0.2)
    )


def checked(model: Any, **cfg: Any) -> tuple[ModelForward, list]:
    fwd = ModelForward(model, DTensorConfig(**cfg), "lm", torch.device("cpu"))
    checks, seconds = check_shortcuts(fwd, VOCAB, gradients=True)
    assert seconds < 5
    return fwd, checks


@pytest.mark.parametrize("kind", ["llama", "gemma2", "llama-lora", "llama-packed"])
def test_every_model_the_suite_builds_passes_with_rounding_gaps(kind):
    model = tiny(kind.split("-")[0])
    if kind.endswith("lora"):
        model = lora.wrap(model, LoraConfig(enabled=True, rank=4, alpha=8), trainable=True)
        for name, p in model.named_parameters():  # adapters start at B = 0: move them so their gradients show
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    fwd, checks = checked(model, sequence_packing=kind.endswith("packed"))
    expected = {
        "llama": ["logits_at_loss_positions", "shared_prefix"],
        "gemma2": ["logits_at_loss_positions"],  # sliding-window layers: no sharing to check
        "llama-lora": ["logits_at_loss_positions", "shared_prefix"],
        "llama-packed": ["logits_at_loss_positions", "sequence_packing"],
    }[kind]
    assert [c.name for c in checks] == expected
    assert all(c.exact and c.logprob_gap < 1e-5 and c.grad_gap < 1e-5 for c in checks), checks
    assert all(getattr(fwd.paths, name) for name in expected) and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("make", [planted, mpt], ids=["planted-cache-positions", "mpt-alibi"])
def test_a_model_that_reads_positions_from_its_cache_gets_sharing_turned_off(make):
    model = make()
    fwd, checks = checked(model)
    by_name = {c.name: c for c in checks}
    assert by_name["logits_at_loss_positions"].exact
    shared = by_name["shared_prefix"]
    assert not shared.exact and shared.logprob_gap > 0.01 and shared.grad_gap > 0.01, shared
    assert not fwd.paths.shared_prefix and fwd.off["shared_prefix"].startswith("the start-up check found it")
    assert shared.metrics()["shortcut/shared_prefix/on"] == 0.0
    # what runs now is the plain path: the same as whole rows
    batch = synthetic_batch(VOCAB)
    mask = batch["loss_mask"].bool()
    with torch.no_grad():
        ours, whole = fwd.logprobs(batch), fwd.logprobs(batch, Paths())
    assert float((ours - whole)[mask].abs().max()) < 1e-5


@pytest.mark.parametrize("family", ["opt", "gpt2"])
def test_right_padded_rows_get_the_logprobs_of_each_row_alone_with_learned_positions(family):
    """Models with learned absolute positions (OPT counts them from the mask, GPT-2 from the row's start): a row in
    a right-padded batch, on the plain path and every shortcut, has the logprobs it has alone, unpadded."""
    from transformers import AutoModelForCausalLM, GPT2Config, OPTConfig

    torch.manual_seed(0)
    if family == "opt":
        config = OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=128,
            init_std=0.2,
        )
    else:
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2)
    model = AutoModelForCausalLM.from_config(config).eval()
    batch = synthetic_batch(VOCAB)
    fwd = ModelForward(model, DTensorConfig(logits_at_loss_positions=False), "lm", torch.device("cpu"))
    with torch.no_grad():
        padded = fwd.logprobs(batch)
        for i, length in enumerate(batch["attention_mask"].sum(1).tolist()):
            alone = {k: v[i : i + 1, :length] for k, v in batch.items()}
            assert float((fwd.logprobs(alone)[0] - padded[i, :length]).abs().max()) < 1e-5, i


def test_a_shortcut_whose_gradients_alone_differ_is_inexact():
    """The logprobs can agree while the gradients do not (a shortcut that detaches or rescales a path): the
    gradient gap alone must turn it off, and float rounding must not."""
    forward = SimpleNamespace(device=torch.device("cpu"), cfg=SimpleNamespace(mixed_precision=False))
    logprobs = torch.randn(3, 5)
    grads = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    bound = TOLERANCE[False][1]
    off = _compare(
        forward, "x", (logprobs, grads), (logprobs.clone(), {"w": grads["w"] * (1 + 3 * bound), "b": grads["b"]})
    )
    assert off.logprob_gap == 0.0 and off.grad_gap > bound and not off.exact
    rounding = {k: g + 1e-7 for k, g in grads.items()}
    assert _compare(forward, "x", (logprobs, grads), (logprobs + 1e-7, rounding)).exact


def test_turning_off_logits_at_loss_positions_turns_prompt_sharing_off_with_the_reason():
    fwd = ModelForward(planted(), DTensorConfig(), "lm", torch.device("cpu"))
    assert fwd.paths.logits_at_loss_positions and fwd.paths.shared_prefix
    fwd.turn_off("logits_at_loss_positions", "planted")
    assert not fwd.paths.logits_at_loss_positions and not fwd.paths.shared_prefix
    assert fwd.off == {
        "logits_at_loss_positions": "planted",
        "shared_prefix": "it needs logits_at_loss_positions, which is off",
    }


def test_a_model_with_a_local_attention_window_under_any_name_gets_no_prompt_sharing():
    """GPT-Neo declares its local layers' window as attention_types / window_size (not sliding_window): with
    150-300-token prompts sharing was wrong (8e-3 nats) while the start-up check's short rows never reached the
    window. The gate reads the window under any of the names models use and turns sharing off, saying why."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    neo = GPTNeoForCausalLM(
        GPTNeoConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=256,
            max_position_embeddings=512,
        )
    )
    fwd = ModelForward(neo, DTensorConfig(), "lm", torch.device("cpu"))
    assert not fwd.paths.shared_prefix and fwd.off["shared_prefix"] == "local attention (config.window_size=256)"
    assert fwd.paths.logits_at_loss_positions

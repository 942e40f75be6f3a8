"""Rows that begin alike (a GRPO group's samples of one prompt) run their beginning once
(``dtensor_cfg.shared_prefix``, the default): the same logprobs, losses and gradients as the whole rows, with fewer
tokens through the model; and the plain path where sharing cannot apply.

The forward runs in-process (one rank, no process group): the same code each rank runs under Ray; two
FSDP2 ranks are compared in test_dtensor.py."""

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_loss_positions import VOCAB, tiny

from rl_backend_dtensor.config import DTensorConfig
from rl_backend_dtensor.forward import ModelForward
from rl_backend_dtensor.worker import DTensorWorker
from rl_core.base.schema import LoraConfig, LossConfig, PolicyConfig
from rl_core.contracts import batch as B
from rl_core.contracts import lora
from rl_core.contracts import tokens as T
from rl_core.training.losses import ClippedPGLoss


def grouped_batch() -> B.Batch:
    """Three prompts (20, 9 and 14 tokens) with three sampled responses each (2-8 tokens), one of them a
    multi-turn row whose loss skips a tool's reply, plus a row of its own; rows shuffled, right-padded."""
    g = torch.Generator().manual_seed(1)
    rows, masks = [], []
    for prompt_len, responses in [(20, (3, 8, 2)), (9, (8, 5, 6)), (14, (5, 5, 7))]:
        prompt = torch.randint(1, VOCAB, (prompt_len,), generator=g).tolist()
        for n in responses:
            rows.append(prompt + torch.randint(1, VOCAB, (n,), generator=g).tolist())
            masks.append([0] * prompt_len + [1] * n)
    masks[4][9 + 2 : 9 + 4] = [0, 0]  # a tool's reply inside the response: no loss there
    rows.append(torch.randint(1, VOCAB, (12,), generator=g).tolist())
    masks.append([0] * 7 + [1] * 5)
    order = torch.randperm(len(rows), generator=g).tolist()
    ids, attn = B.pad_rows([rows[i] for i in order], 0)
    loss_mask = B.pad_rows([masks[i] for i in order], 0)[0].float()
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "advantages": torch.randn(ids.shape[0], 1, generator=g) * loss_mask,
        "prev_logprobs": -torch.rand(ids.shape, generator=g) * 3 * attn,
        "reference_logprobs": -torch.rand(ids.shape, generator=g) * 3 * attn,
    }


def worker(**cfg: Any) -> DTensorWorker:
    config = DTensorConfig(threads_per_worker=torch.get_num_threads(), **cfg)
    policy = PolicyConfig(model_name="unused")
    return DTensorWorker(rank=0, world_size=1, model_path="unused", policy=policy, cfg=config, seed=0, device="cpu")


@contextlib.contextmanager
def counting_tokens(model: Any) -> Iterator[list[int]]:
    """The number of tokens of each forward pass through ``model``."""
    embed = (model.get_base_model() if hasattr(model, "get_base_model") else model).get_input_embeddings()
    tokens: list[int] = []
    hook = embed.register_forward_hook(lambda _m, inputs, _out: tokens.append(inputs[0].numel()))
    try:
        yield tokens
    finally:
        hook.remove()


def forward_of(model: Any, **cfg: Any) -> ModelForward:
    return ModelForward(model, DTensorConfig(**cfg), "lm", torch.device("cpu"))


def step(fwd: ModelForward, batch: B.Batch) -> tuple[torch.Tensor, torch.Tensor, dict, int]:
    """One loss and backward at loss positions; also how many tokens went through the model."""
    model = fwd.model
    model.zero_grad(set_to_none=True)
    loss_fn = ClippedPGLoss(cfg=LossConfig(reference_policy_kl_penalty=0.1))
    with counting_tokens(model) as tokens:
        logprobs = fwd.logprobs(batch)
    loss, _ = loss_fn(batch, logprobs, loss_fn.count(batch))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), loss.detach(), grads, sum(tokens)


def assert_same(shared: tuple, plain: tuple, mask: torch.Tensor) -> None:
    lp, loss, grads, _ = shared
    plain_lp, plain_loss, plain_grads, _ = plain
    assert float((lp - plain_lp).abs().max()) < 1e-5
    assert (lp[~mask] == 0).all() and float(plain_lp[mask].abs().sum()) > 0
    assert float((loss - plain_loss).abs()) < 1e-6
    assert grads.keys() == plain_grads.keys() and grads
    worst = max(float((grads[k] - plain_grads[k]).abs().max()) for k in grads)
    scale = max(float(g.abs().max()) for g in plain_grads.values())
    assert worst <= 1e-5 * max(scale, 1.0), f"largest gradient difference {worst:.2e}"


@pytest.mark.parametrize(
    ("adapters", "chunk"), [(False, None), (False, 3), (True, None)], ids=["plain", "chunked", "lora"]
)
def test_shared_prefixes_give_the_same_loss_and_gradients_from_fewer_tokens(adapters, chunk):
    model = tiny("llama")
    if adapters:
        model = lora.wrap(model, LoraConfig(enabled=True, rank=4, alpha=8), trainable=True)
        for name, p in model.named_parameters():  # adapters start at B = 0: move them so their gradients show
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    batch = grouped_batch()
    shared = step(forward_of(model, logprob_chunk_tokens=chunk), batch)
    plain = step(forward_of(model, logprob_chunk_tokens=chunk, shared_prefix=False), batch)
    assert_same(shared, plain, batch["loss_mask"].bool())
    # each distinct beginning once (4: three prompts and the lone row's, padded to the longest, 19 tokens: a
    # prompt's last token starts its rows' suffixes), then the rows' suffixes (padded to the longest, 9)
    rows, width = batch["input_ids"].shape
    assert (plain[3], shared[3]) == (rows * width, 4 * 19 + rows * 9)


def test_the_logprob_pass_shares_prefixes_too():
    """``logprobs()`` (previous and reference policies) at loss positions, in fixed micro-batches and by token
    budget (rows longest first, put back in order), against Hugging Face's logits over the whole rows."""
    model, batch = tiny("llama"), grouped_batch()
    mask = batch["loss_mask"].bool()
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = T.token_logprobs(logits, batch["input_ids"])
    for cfg in ({}, {"dynamic_batching": True, "max_tokens_per_microbatch": 64}):
        w = worker(**cfg)
        w.model, w.forward = model, forward_of(model, **cfg)
        with counting_tokens(model) as tokens:
            ours = w.logprobs(batch)
        assert sum(tokens) < batch["attention_mask"].sum(), "fewer tokens than the rows' own: prompts shared"
        assert float((ours[mask] - expected[mask]).abs().max()) < 1e-5
        assert (ours[~mask] == 0).all()


def test_sharing_is_decided_once_per_model_with_the_reason_when_it_cannot_apply():
    """Gemma 2 alternates sliding-window layers: its rows run whole (and agree with the plain path)."""
    model, batch = tiny("gemma2"), grouped_batch()
    gemma = forward_of(model)
    assert not gemma.paths.shared_prefix and "local attention (config.sliding_window=" in gemma.off["shared_prefix"]
    assert forward_of(tiny("llama")).paths.shared_prefix and not forward_of(tiny("llama")).off
    everywhere = forward_of(tiny("llama"), logits_at_loss_positions=False)  # logits everywhere: prompts are needed
    assert everywhere.off == {"shared_prefix": "it needs logits_at_loss_positions"}
    checkpointed = tiny("llama")
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert forward_of(checkpointed).off == {"shared_prefix": "activation_checkpointing"}
    shared, plain = step(gemma, batch), step(forward_of(model, shared_prefix=False), batch)
    assert shared[3] == plain[3]
    assert_same(shared, plain, batch["loss_mask"].bool())

"""Conformance suites: the behaviour every ``TrainingBackend``, ``RolloutEngine`` and ``RewardSource`` must show.

Plugin authors call these from their own tests with a real instance of their component, e.g.
``check_rollout_engine(engine, tokenizer)``. Each raises ``AssertionError`` with a message on a violation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.base.errors import InputError
from rl_core.contracts.batch import TokenBatch, pad_rows
from rl_core.contracts.protocols import RewardSource, RolloutEngine, SamplingParams, TrainingBackend
from rl_core.contracts.refit import RefitRoute, receive_weights
from rl_core.contracts.tokens import token_logprobs
from rl_core.training.losses import NLLLoss

PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "the answer is"]


def sample_batch(tokenizer: Any, prompts: Sequence[str] = PROMPTS, response: str = " 7 and 8") -> TokenBatch:
    """Prompt + response rows, right-padded, with the loss on the response."""
    import torch

    rows, starts = [], []
    for p in prompts:
        ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        starts.append(len(ids))
        rows.append(ids + tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    ids, attn = pad_rows(rows, tokenizer.pad_token_id)
    loss_mask = torch.zeros(ids.shape)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        loss_mask[i, start : len(row)] = 1.0
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}


def hf_logprobs(model_path: str | Path, batch: TokenBatch) -> Any:
    """``[B, T]`` logprobs of ``batch`` under a plain Hugging Face forward pass (fp32), zero on padding: the
    reference every training backend is compared with."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return token_logprobs(logits, batch["input_ids"]) * batch["attention_mask"]


def check_training_backend(backend: TrainingBackend, tokenizer: Any, tmp_path: Path) -> None:
    import torch

    assert isinstance(backend, TrainingBackend), "does not implement the TrainingBackend protocol"
    batch = sample_batch(tokenizer)
    before = backend.logprobs(batch)
    assert before.shape == batch["input_ids"].shape, f"logprobs shape {tuple(before.shape)} != input shape"
    assert torch.isfinite(before).all() and (before <= 0).all(), "logprobs must be finite and <= 0"
    assert (before[batch["attention_mask"] == 0] == 0).all(), "logprobs must be 0 on padding"
    ref = backend.reference_logprobs(batch)
    assert torch.allclose(ref, before, atol=1e-5), "before training, reference logprobs equal the policy's"
    backend.save_checkpoint(tmp_path / "ckpt")
    metrics = backend.train(batch, NLLLoss())
    assert "loss" in metrics and math.isfinite(metrics["loss"]), f"train() metrics need a finite 'loss': {metrics}"
    after = backend.logprobs(batch)
    assert not torch.allclose(after, before), "a training step must change the policy"
    mask = batch["loss_mask"].bool()
    assert after[mask].sum() > before[mask].sum(), "an NLL step must raise the response's likelihood"
    assert torch.allclose(backend.reference_logprobs(batch), ref, atol=1e-5), "the reference must not train"
    backend.load_checkpoint(tmp_path / "ckpt")
    assert torch.allclose(backend.logprobs(batch), before, atol=1e-5), "load_checkpoint must restore the weights"
    backend.export_hf(tmp_path / "hf")
    hf = hf_logprobs(tmp_path / "hf", batch)  # every position; the backend's are due under loss_mask only
    assert torch.allclose(hf[mask], before[mask], atol=1e-4), "export_hf must give a model with the same logprobs"
    payload = backend.weights_for_refit(RefitRoute(kind="object_store"))
    assert dict(receive_weights(payload)), "weights_for_refit must return a payload holding the weights"


def check_rollout_engine(engine: RolloutEngine, tokenizer: Any) -> None:
    assert isinstance(engine, RolloutEngine), "does not implement the RolloutEngine protocol"
    hosts = engine.weight_receivers()
    assert len(hosts) >= 1 and all(isinstance(h, str) for h in hosts), "weight_receivers(): a host per process"
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=123)
    out = engine.generate(prompts, params)
    assert len(out) == 4, f"2 prompts x n=2 must give 4 rollouts, got {len(out)}"
    assert [(r.prompt_index, r.sample_index) for r in out] == [(0, 0), (0, 1), (1, 0), (1, 1)], "order"
    for r in out:
        assert tuple(r.prompt_token_ids) == tuple(prompts[r.prompt_index])
        assert 1 <= len(r.token_ids) <= 6, "max_new_tokens must bound the response"
        assert len(r.logprobs) == len(r.token_ids), "one logprob per sampled token"
        assert all(lp <= 0 and math.isfinite(lp) for lp in r.logprobs)
        assert r.finish_reason in ("stop", "length")
        assert r.text == tokenizer.decode(r.token_ids, skip_special_tokens=True), "text must decode token_ids"
    again = engine.generate(prompts, params)
    assert [r.token_ids for r in again] == [r.token_ids for r in out], "a fixed seed must reproduce the samples"
    try:
        engine.generate([], params)
    except InputError:
        pass
    else:
        raise AssertionError("generate([]) must raise InputError")


def check_reward_source(
    source: RewardSource,
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    expected: Sequence[float] | None = None,
) -> None:
    assert isinstance(source, RewardSource), "does not implement the RewardSource protocol"
    rewards = source.score(prompts, responses, metadata)
    assert len(rewards) == len(responses), "one reward per response"
    for r in rewards:
        values = r.values() if isinstance(r, Mapping) else [r]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in values), f"bad reward {r!r}"
    reversed_rewards = source.score(prompts[::-1], responses[::-1], metadata[::-1])
    assert list(reversed_rewards) == list(rewards)[::-1], "rewards must follow the order of the inputs"
    if expected is not None:
        totals = [sum(r.values()) if isinstance(r, Mapping) else float(r) for r in rewards]
        assert totals == [float(e) for e in expected], f"{rewards} != {expected}"

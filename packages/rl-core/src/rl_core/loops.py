"""Pieces the algorithm loops share: the step driver (progress, validation, logging, checkpoints), turning
prompts into scored rollouts, and building token batches. Each algorithm file composes these top-down."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rl_core.batch import Batch, pad_rows
from rl_core.data import EpochSampler, Example, load_split
from rl_core.errors import InputError
from rl_core.protocols import Rollout, SamplingParams
from rl_core.run import RunContext


def run_loop(
    ctx: RunContext,
    *,
    rows_per_step: int,
    total_steps: int,
    step_fn: Callable[[EpochSampler, int], dict[str, float]],
    validate: Callable[[list[Example]], dict[str, float]],
    val_period: int,
    val_at_start: bool,
    max_val_samples: int,
) -> dict[str, float]:
    """The loop every algorithm shares: load the data, resume from the run folder's latest checkpoint, then for
    steps ``start+1 .. total_steps``: ``step_fn(sampler, step)``, validate every ``val_period`` (on at most
    ``max_val_samples`` held-out rows), log, checkpoint every ``checkpointing.save_period``. Returns the last
    step's metrics."""
    train = load_split(ctx.config.data, "train")
    val = load_split(ctx.config.data, "val")[:max_val_samples]
    state = ctx.resume()
    start = int(state["step"]) if state else 0
    sampler = EpochSampler(train, rows_per_step, ctx.config.seed, (state or {}).get("data_position", 0))
    metrics: dict[str, float] = {}
    if start == 0 and val_at_start and val:
        ctx.log(0, validate(val), total_steps)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=ctx.console, disable=not ctx.config.logger.progress, transient=True) as bar:
        task = bar.add_task(f"{ctx.config.algorithm} steps", total=total_steps, completed=start)
        for step in range(start + 1, total_steps + 1):
            metrics = ctx.step(step, lambda step=step: step_fn(sampler, step))
            if val and ctx.due(step, val_period, total_steps):
                metrics = {**metrics, **validate(val)}
            ctx.log(step, metrics, total_steps)
            if ctx.due(step, ctx.config.checkpointing.save_period, total_steps):
                ctx.save(step, {"data_position": sampler.position}, metrics)
            bar.advance(task)
    return metrics


def sampling(ctx: RunContext, n: int, seed: int, *, greedy: bool = False) -> SamplingParams:
    g = ctx.config.policy.generation
    return SamplingParams(
        n=n,
        max_new_tokens=g.max_new_tokens,
        temperature=0.0 if greedy else g.temperature,
        top_p=1.0 if greedy else g.top_p,
        top_k=-1 if greedy else g.top_k,
        stop_strings=g.stop_strings,
        stop_token_ids=g.stop_token_ids,
        seed=seed,
    )


def encode_prompts(ctx: RunContext, examples: Sequence[Example]) -> list[list[int]]:
    key = ctx.config.data.prompt_key
    limit = ctx.config.policy.max_total_sequence_length - ctx.config.policy.generation.max_new_tokens
    out = []
    for ex in examples:
        ids = ctx.tokenizer(ex[key], add_special_tokens=False)["input_ids"]
        if len(ids) > limit:
            raise InputError(
                f"a prompt has {len(ids)} tokens, more than policy.max_total_sequence_length - "
                f"policy.generation.max_new_tokens = {limit}: {ex[key][:80]!r}..."
            )
        out.append(ids)
    return out


@attrs.frozen(kw_only=True)
class ScoredRollouts:
    examples: list[Example]
    rollouts: list[Rollout]  # P * G, grouped by prompt
    rewards: list[float]  # P * G
    metrics: dict[str, float]


def colocated(ctx: RunContext) -> bool:
    """Engine and trainer take turns on the same GPUs (on CPU there is no device memory to hand over)."""
    from rl_core.run import detected_device

    return ctx.config.policy.generation.colocated and detected_device() == "cuda"


def generate_and_score(
    ctx: RunContext, examples: Sequence[Example], params: SamplingParams, phases: Any
) -> ScoredRollouts:
    """``params.n`` rollouts per example, scored by the reward sources. Colocated on GPUs, the trainer is
    offloaded while the engine generates, and the engine sleeps afterwards."""
    assert ctx.engine is not None
    with phases("generate"):
        if colocated(ctx):
            ctx.backend.offload()
            set_engine_awake(ctx, True)
        rollouts = ctx.engine.generate(encode_prompts(ctx, examples), params)
        if colocated(ctx):
            set_engine_awake(ctx, False)
            ctx.backend.onload()
    key = ctx.config.data.prompt_key
    prompts = [examples[r.prompt_index][key] for r in rollouts]
    meta = [examples[r.prompt_index] for r in rollouts]
    with phases("score"):
        rewards, parts = ctx.score(prompts, [r.text for r in rollouts], meta)
    return ScoredRollouts(examples=list(examples), rollouts=rollouts, rewards=rewards, metrics=parts)


def refit(ctx: RunContext) -> Any:
    """Move the trainer's weights into the engine (waking it first when colocated)."""
    assert ctx.engine is not None and ctx.transport is not None
    if colocated(ctx):
        set_engine_awake(ctx, True)
    return ctx.transport.refit(ctx.backend, ctx.engine)


def set_engine_awake(ctx: RunContext, awake: bool) -> None:
    """Wake or put to sleep the engine, only if it is not already in that state."""
    assert ctx.engine is not None
    if awake and ctx.engine_asleep:
        ctx.engine.wake()
    elif not awake and not ctx.engine_asleep:
        ctx.engine.sleep()
    ctx.engine_asleep = not awake


def rollout_batch(rollouts: Sequence[Rollout], pad_id: int, limit: int) -> Batch:
    """Token batch of prompt + response rows (cut at ``limit`` tokens): ``loss_mask`` on the response, the
    engine's logprobs aligned as ``generation_logprobs``."""
    import torch

    rows = [(list(r.prompt_token_ids) + list(r.token_ids))[:limit] for r in rollouts]
    ids, attn = pad_rows(rows, pad_id)
    loss_mask = torch.zeros(ids.shape, dtype=torch.float32)
    gen_logprobs = torch.zeros(ids.shape, dtype=torch.float32)
    for i, r in enumerate(rollouts):
        start = len(r.prompt_token_ids)
        end = min(start + len(r.token_ids), limit)
        loss_mask[i, start:end] = 1.0
        gen_logprobs[i, start:end] = torch.tensor(r.logprobs[: end - start], dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "generation_logprobs": gen_logprobs}


def validate_rollouts(ctx: RunContext, rows: Sequence[Example], seed: int) -> dict[str, float]:
    """Greedy generation on held-out prompts: mean reward and response length."""
    if not rows:
        return {}
    from rl_core.run import Phases

    scored = generate_and_score(ctx, rows, sampling(ctx, 1, seed, greedy=True), Phases())
    n = len(scored.rewards)
    return {
        "val/reward": sum(scored.rewards) / n,
        "val/response_length": sum(len(r.token_ids) for r in scored.rollouts) / n,
    }


def rollout_metrics(scored: ScoredRollouts, seconds: float) -> dict[str, float]:
    n = len(scored.rollouts)
    tokens = sum(len(r.token_ids) for r in scored.rollouts)
    return {
        "reward": sum(scored.rewards) / n,
        **scored.metrics,
        "response_length": tokens / n,
        "truncated_fraction": sum(r.finish_reason == "length" for r in scored.rollouts) / n,
        "tokens_per_second": tokens / max(seconds, 1e-9),
    }


def prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}

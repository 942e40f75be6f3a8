"""What the on-policy algorithms (GRPO, REINFORCE, on-policy distillation, PPO) share: their loop (``run_on_policy``),
a step's sampling seed (``step_seed``), a step's first half (``sample_on_policy``: rollouts of the current policy, scored,
batched, with the trainer's logprobs and their health check), its second half (``update_on_policy``: one update over the
batch, then the refit, ``refit_metrics``). Each algorithm puts its own advantages between the two halves; GRPO
samples and trains its own way (dynamic sampling, asynchronous steps) around the same loop, seed and refit."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import RolloutLoopConfig
from rl_core.contracts.batch import PolicyGradientBatch
from rl_core.data.prompts import EpochSampler
from rl_core.training.context import Phases, RunContext
from rl_core.training.health import engine_drift, logprob_mismatch
from rl_core.training.loops import Stepper, prefixed, run_loop
from rl_core.training.losses import ClippedPGLoss
from rl_core.training.rollouts import (
    ScoredRollouts,
    generate_and_score,
    refit,
    response_limit,
    rollout_batch,
    rollout_metrics,
    sampling,
    validate_rollouts,
)


@attrs.frozen(kw_only=True)
class OnPolicyBatch:
    """A step's rollouts: ``batch`` (advantages to be added), the trainer's ``logprobs [N, T]`` of it, the metrics so
    far (rollouts, health) and the step's phase timer and start."""

    scored: ScoredRollouts
    batch: PolicyGradientBatch
    logprobs: Any
    metrics: dict[str, float]
    phases: Phases
    start: float


def run_on_policy(
    ctx: RunContext,
    cfg: RolloutLoopConfig,
    step: Callable[[EpochSampler, int], dict[str, float]] | None = None,
    *,
    stepper: Callable[[EpochSampler, int, Mapping[str, Any] | None], Stepper] | None = None,
) -> dict[str, float]:
    """``step(sampler, step)`` (or the steps of a ``stepper``, which keeps state across steps) for
    ``cfg.max_num_steps`` steps of ``cfg.num_prompts_per_step`` prompts, greedy validation on held-out prompts every
    ``cfg.val_period``."""
    return run_loop(
        ctx,
        rows_per_step=cfg.num_prompts_per_step,
        total_steps=cfg.max_num_steps,
        step_fn=step,
        stepper=stepper,
        validate=lambda rows, step: validate_rollouts(ctx, rows, ctx.config.seed, step=step),
        val_period=cfg.val_period,
        val_at_start=cfg.val_at_start,
        max_val_samples=cfg.max_val_samples,
    )


def step_seed(ctx: RunContext, step: int) -> int:
    """The sampling seed of ``step``: the run's seed and the step alone, so a resumed run, and an asynchronous one
    generating a step's batch ahead, draw the same samples for it."""
    return ctx.config.seed * 100_003 + step


def sample_on_policy(ctx: RunContext, cfg: RolloutLoopConfig, sampler: EpochSampler, step: int) -> OnPolicyBatch:
    """The next prompts x ``num_generations_per_prompt`` samples of the current policy, scored and batched, with the
    trainer's logprobs and the engine/trainer mismatch check."""
    phases = Phases()
    start = time.perf_counter()
    params = sampling(ctx, cfg.num_generations_per_prompt, seed=step_seed(ctx, step))
    scored = generate_and_score(ctx, sampler.next(), params, phases, cfg.rollout_micro_batch_size)
    ctx.keep_samples(step, scored.transcripts)
    ctx.check_signal(step, scored.rollouts, scored.rewards, scored.metrics, scored.transcripts)
    if scored.earlier or not all(scored.keep or ()):
        raise InputError(
            "this algorithm trains one sample per episode: an agent's split or dropped episodes are trained by "
            "algorithm: grpo (or set the agent environment's on_error: zero and keep its history unedited)"
        )
    gen_seconds = time.perf_counter() - start
    batch = rollout_batch(scored.rollouts, ctx.tokenizer.pad_token_id, ctx.config.policy.max_total_sequence_length)
    with phases("logprobs"):
        logprobs = ctx.backend.logprobs(batch)
    health = logprob_mismatch(ctx, batch["generation_logprobs"], logprobs, batch["loss_mask"])
    return OnPolicyBatch(
        scored=scored,
        batch=batch,
        logprobs=logprobs,
        metrics={**rollout_metrics(scored, gen_seconds, response_limit(ctx)), **health},
        phases=phases,
        start=start,
    )


def update_on_policy(ctx: RunContext, on: OnPolicyBatch, loss_fn: ClippedPGLoss) -> dict[str, float]:
    """One update over ``on.batch`` (its advantages set), the refit, and the step's metrics."""
    with on.phases("train"):
        train_metrics = ctx.backend.train(on.batch, loss_fn)
    engine_drift(train_metrics)  # measured before the update, by the backend
    return step_metrics(on, {**prefixed("train", train_metrics), **refit_metrics(ctx, on.phases)})


def refit_metrics(ctx: RunContext, phases: Phases) -> dict[str, float]:
    """The trained weights into the rollout engine (timed as the ``refit`` phase), and what it moved."""
    with phases("refit"):
        stats = refit(ctx)
    return {"refit/bytes": float(stats.num_bytes), "refit/seconds": stats.seconds}


def step_metrics(on: OnPolicyBatch, more: dict[str, float]) -> dict[str, float]:
    """The step's metrics: the rollouts' and health's, ``more``, its phase times and its wall time so far."""
    return {**on.metrics, **more, **on.phases.metrics(), "time/step": time.perf_counter() - on.start}

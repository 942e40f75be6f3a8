"""The step driver every algorithm shares: load the data, resume from the run folder's latest checkpoint, then for
each step run it, validate, log and checkpoint."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from rl_core.base.errors import InputError
from rl_core.data.prompts import EpochSampler, Example, load_split
from rl_core.training.context import RunContext
from rl_core.training.rollouts import refit


class Stepper(Protocol):
    """Runs the steps of a loop that keeps state of its own across steps (rollouts generated ahead, say)."""

    def step(self, step: int) -> dict[str, float]: ...

    def state(self, step: int) -> dict[str, Any]:
        """What a checkpoint after ``step`` keeps (``data_position`` at least)."""
        ...

    def close(self) -> None: ...


@attrs.frozen
class _StepFn:
    """A stateless loop: ``step_fn(sampler, step)``; a checkpoint keeps the sampler's position."""

    step_fn: Callable[[EpochSampler, int], dict[str, float]]
    sampler: EpochSampler

    def step(self, step: int) -> dict[str, float]:
        return self.step_fn(self.sampler, step)

    def state(self, step: int) -> dict[str, Any]:
        return {"data_position": self.sampler.position}

    def close(self) -> None:
        return None


def run_loop(
    ctx: RunContext,
    *,
    rows_per_step: int,
    total_steps: int,
    validate: Callable[[list[Example], int], dict[str, float]],
    val_period: int,
    val_at_start: bool,
    max_val_samples: int,
    step_fn: Callable[[EpochSampler, int], dict[str, float]] | None = None,
    stepper: Callable[[EpochSampler, int, Mapping[str, Any] | None], Stepper] | None = None,
) -> dict[str, float]:
    """Steps ``start+1 .. total_steps`` (``start``: the resumed checkpoint's step, else 0): ``step_fn(sampler,
    step)`` (or the steps of ``stepper(sampler, start, resumed_state)``), validation every ``val_period``
    (``validate(rows, step)`` on at most ``max_val_samples`` held-out rows, timed as ``time/validate``), logging, a
    checkpoint every ``checkpointing.save_period``. After a resume (or with a starting LoRA adapter), a rollout
    engine first gets the trainer's weights. The first step run logs the start-up's phases (``startup/*``) and the
    console estimates the rest of the run from it. Returns the last step's metrics."""
    train = load_split(ctx.config.data, "train", ctx.find_task)
    val = load_split(ctx.config.data, "val", ctx.find_task)[:max_val_samples]
    state = ctx.resume()
    if ctx.engine is not None and (state is not None or ctx.config.policy.lora.adapter_path):
        refit(ctx)  # the engine starts from the base model: resumed weights, or a given adapter, go to it first
    start = int(state["step"]) if state else 0
    refuse_past_the_end(ctx.run_dir, start, total_steps)
    sampler = EpochSampler(train, rows_per_step, ctx.config.seed, (state or {}).get("data_position", 0))
    if stepper is not None:
        steps = stepper(sampler, start, state)
    else:
        assert step_fn is not None, "give step_fn or stepper"
        steps = _StepFn(step_fn, sampler)
    # a run resumed at its last step runs no step: its final metrics are the checkpoint's
    metrics: dict[str, float] = dict((state or {}).get("metrics", {}))

    def validated(step: int) -> dict[str, float]:
        began = time.perf_counter()
        return {**validate(val, step), "time/validate": time.perf_counter() - began}

    startup = {f"startup/{k}": v for k, v in ctx.startup.items()}
    try:
        with ctx.console.steps(f"{ctx.config.algorithm} steps", total_steps, start):
            if start == 0 and val_at_start and val:
                ctx.log(0, {**validated(0), **startup}, total_steps)
                startup = {}
            for step in range(start + 1, total_steps + 1):
                began = time.perf_counter()
                metrics = ctx.step(step, functools.partial(steps.step, step))
                if step == start + 1:
                    ctx.console.estimate(step, total_steps, time.perf_counter() - began, metrics)
                if val and ctx.due(step, val_period, total_steps):
                    metrics = {**metrics, **validated(step)}
                ctx.log(step, {**metrics, **startup}, total_steps)
                startup = {}
                if ctx.due(step, ctx.config.checkpointing.save_period, total_steps):
                    ctx.save(step, steps.state(step), metrics)
    finally:
        steps.close()
    return metrics


def refuse_past_the_end(run_dir: Path, start: int, total_steps: int) -> None:
    """A run folder checkpointed at step ``start`` cannot become a ``total_steps``-step run when ``start`` is past
    it: its checkpoints (and final model) are step ``start``'s."""
    if start > total_steps:
        raise InputError(
            f"{run_dir} holds a run checkpointed at step {start}, past the {total_steps} steps this config asks "
            f"for: its checkpoints (and final model) are step {start}'s. To train {total_steps} steps, use another "
            "run_dir"
        )


def prefixed(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    """``{"loss": 1.0}`` -> ``{"train/loss": 1.0}``."""
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()}

"""Health checks in every run: silent wrongness made loud.

- **Logprob mismatch**: the mean absolute difference between the engine's and the trainer's logprobs of the
  sampled tokens under the same weights (``health/logprob_mismatch``) and a k3 estimate of KL(engine || trainer)
  (``health/logprob_kl``), on every step where the trainer computes those logprobs anyway (the training forward
  of a step with one optimizer update reports them through the loss; a step with several updates computes them
  first for the PPO ratio) and every ``health.logprob_mismatch_every`` steps otherwise. Above
  ``health.logprob_mismatch_warn`` a step warns; above ``health.logprob_mismatch_stop`` the run stops, naming the
  engine.
- **Weight sync**: every ``health.verify_refit_every``-th refit carries per-tensor checksums, which every engine
  process must report back for what it received (``rl_core.contracts.refit``); a difference stops the run (or warns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rl_core.base.errors import RLCoreError

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.refit import RefitStats
    from rl_core.training.context import RunContext


class HealthCheckError(RLCoreError):
    """A health check found the run silently wrong; the message names the plugin and the number."""


def _engine_name(ctx: RunContext) -> str:
    return ctx.engine_name or type(ctx.engine).__name__


def logprob_mismatch(
    ctx: RunContext, generation_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch metrics over the masked (sampled) tokens, and the warn/stop thresholds applied."""
    import torch

    keep = mask.bool()
    if not bool(keep.any()):
        return {}
    gen, train = generation_logprobs[keep].double(), trainer_logprobs[keep].double()
    mean_abs = float((gen - train).abs().mean())
    log_ratio = train - gen  # k3 estimate of KL(engine || trainer) from the engine's samples
    return judge_mismatch(ctx, mean_abs, float((torch.exp(log_ratio) - log_ratio - 1).mean()))


def engine_drift(train_metrics: dict[str, float]) -> tuple[float, float] | None:
    """Take the engine-vs-trainer logprob metrics the policy-gradient loss reported out of ``train_metrics``: the
    mean absolute difference and the KL estimate (``rl_core.training.losses.ClippedPGLoss``), if it reported them."""
    if "engine_logprob_abs_diff" not in train_metrics:
        return None
    return train_metrics.pop("engine_logprob_abs_diff"), train_metrics.pop("engine_logprob_kl")


def judge_mismatch(ctx: RunContext, mean_abs: float, kl: float) -> dict[str, float]:
    """The mismatch metrics, with the warn/stop thresholds applied."""
    cfg = ctx.config.health
    where = (
        f"the rollout engine {_engine_name(ctx)} returns logprobs that differ from the trainer's by {mean_abs:.4g} "
        f"on average over the sampled tokens (KL estimate {kl:.4g})"
    )
    advice = (
        "its logprobs must be those of the sampled tokens under the current weights at temperature 1; check its "
        "weight refit and its logprobs with `rl-core certify`"
    )
    if cfg.logprob_mismatch_stop is not None and mean_abs > cfg.logprob_mismatch_stop:
        raise HealthCheckError(f"{where}, above health.logprob_mismatch_stop ({cfg.logprob_mismatch_stop}): {advice}")
    if mean_abs > cfg.logprob_mismatch_warn:
        ctx.console.warn(f"{where}, above health.logprob_mismatch_warn ({cfg.logprob_mismatch_warn})")
    return {"health/logprob_mismatch": mean_abs, "health/logprob_kl": kl}


def mismatch_due(ctx: RunContext, step: int) -> bool:
    every = ctx.config.health.logprob_mismatch_every
    return every > 0 and (step - 1) % every == 0


def weight_sync_failed(ctx: RunContext, bad: list[str], total: int, stats: RefitStats) -> None:
    """Stop (or warn): ``bad`` tensors of ``total`` arrived different from what the trainer sent."""
    shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    reported = "reported no checksums" if not stats.checksums else f"reported different values for {shown}"
    message = (
        f"weight sync failed: after a refit over {stats.route or 'its route'}, the rollout engine {_engine_name(ctx)} "
        f"{reported} ({len(bad)} of {total} tensors): it would generate with weights the trainer does not have"
    )
    if ctx.config.health.on_weight_sync_failure == "stop":
        raise HealthCheckError(f"{message}. Check the engine's update_weights with `rl-core certify`")
    ctx.console.warn(message)

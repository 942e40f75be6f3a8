"""On-policy distillation: the student (the policy) samples, a teacher (``policy.reference_model_name``, any local
causal LM with the student's tokenizer) scores the student's own tokens, and each token's negative reverse KL
``-(log pi(x_t) - log pi_T(x_t))`` is its advantage, optionally mixed with a task reward's leave-one-out advantage.

One step: ``num_prompts_per_step`` prompts x ``num_generations_per_prompt`` samples; the teacher's logprobs come from
the backend's reference forward (batched, where the reference policy's run); the loss is REINFORCE's
``-A_t * log pi(x_t)`` per token, averaged over tokens (one update per rollout batch: on-policy). The reward sources
still score every sample: ``reward`` is logged, and it enters the advantage with ``task_reward_weight`` > 0.
"""

from __future__ import annotations

import attrs

from rl_core.algorithms.reinforce import REINFORCE_LOSS
from rl_core.base.errors import ConfigError
from rl_core.base.schema import Config, RolloutLoopConfig
from rl_core.data.prompts import EpochSampler
from rl_core.training import advantages as adv
from rl_core.training.context import RunContext
from rl_core.training.losses import ClippedPGLoss
from rl_core.training.onpolicy import run_on_policy, sample_on_policy, update_on_policy


@attrs.frozen(kw_only=True)
class DistillConfig(RolloutLoopConfig):
    """``distill``: the shared rollout-loop knobs and the weight of the task reward's advantage (0: the teacher's
    signal alone)."""

    #: weight of the group-relative task-reward advantage added to the teacher's per-token signal (0: the teacher
    #: alone).
    task_reward_weight: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))


def check(config: Config, device: str) -> None:
    """Before any worker starts: a teacher is named, and a step's rollouts make whole optimizer steps."""
    if not config.policy.reference_model_name:
        raise ConfigError(
            "algorithm distill needs a teacher: set policy.reference_model_name to a local model folder with the "
            "policy's tokenizer (e.g. a finished run's final/)"
        )
    config.section("distill").check_batch(config.policy, "distill")


def run(ctx: RunContext) -> dict[str, float]:
    cfg: DistillConfig = ctx.config.section("distill")
    loss_fn = ClippedPGLoss(cfg=REINFORCE_LOSS)
    return run_on_policy(ctx, cfg, lambda sampler, step: distill_step(ctx, cfg, sampler, loss_fn, step))


def distill_step(
    ctx: RunContext, cfg: DistillConfig, sampler: EpochSampler, loss_fn: ClippedPGLoss, step: int
) -> dict[str, float]:
    import torch

    on = sample_on_policy(ctx, cfg, sampler, step)
    mask = on.batch["loss_mask"]
    with on.phases("teacher_logprobs"):
        teacher = ctx.backend.reference_logprobs(on.batch)  # [N, T]
    P, G = len(on.scored.examples), cfg.num_generations_per_prompt
    rewards = torch.tensor(on.scored.rewards, dtype=torch.float32).view(P, G)
    task = adv.group_advantages(rewards, torch.ones(P, G, dtype=torch.bool), leave_one_out=True, normalize=False)
    on.batch["advantages"] = adv.distillation_advantages(
        on.logprobs, teacher, mask, task.view(-1), cfg.task_reward_weight
    )
    reverse_kl = ((on.logprobs - teacher) * mask).sum() / mask.sum().clamp(min=1.0)  # per token
    return {**update_on_policy(ctx, on, loss_fn), "distill/reverse_kl": float(reverse_kl)}

"""REINFORCE with a leave-one-out (RLOO) baseline and a KL penalty to the initial policy, in the style of
NeMo-Aligner's REINFORCE tutorial.

One step: ``num_prompts_per_step`` prompts x ``num_generations_per_prompt`` responses; the reward of each is the reward
sources' total minus ``initial_policy_kl_penalty * sum_t (log pi(x_t) - log pi_init(x_t))``; the advantage is the
reward minus the mean reward of the *other* samples of the same prompt (no std normalisation); the loss is plain
REINFORCE ``-A * log pi`` (no ratio, no clipping), averaged over tokens.

The section shares GRPO's vocabulary (``rl_core.base.schema.RolloutLoopConfig``); the tutorial's names are accepted as
aliases. Key names mapped from the tutorial: ``model.reinforce.num_rollout_samples`` -> ``reinforce.
num_rollout_samples`` (alias of ``num_generations_per_prompt``), ``trainer.reinforce.max_steps`` -> ``reinforce.
max_steps`` (alias of ``max_num_steps``), ``trainer.reinforce.val_check_interval`` -> ``reinforce.
val_check_interval`` (alias of ``val_period``), ``model.reinforce.initial_policy_kl_penalty`` -> ``reinforce.
initial_policy_kl_penalty``, ``model.global_batch_size`` -> ``policy.train_global_batch_size``,
``model.reinforce.rollout_micro_batch_size`` -> ``reinforce.rollout_micro_batch_size`` (rollouts per reward
request; the reward model's ``inference_micro_batch_size`` x its replicas must not exceed it),
``model.forward_micro_batch_size`` -> ``policy.logprob_batch_size``, ``model.encoder_seq_length`` (``max_length``)
-> ``policy.max_total_sequence_length``.
"""

from __future__ import annotations

import attrs

from rl_core.base.schema import Config, LossConfig, RolloutLoopConfig
from rl_core.data.prompts import EpochSampler
from rl_core.training import advantages as adv
from rl_core.training.context import RunContext
from rl_core.training.losses import ClippedPGLoss
from rl_core.training.onpolicy import run_on_policy, sample_on_policy, update_on_policy


@attrs.frozen(kw_only=True)
class ReinforceConfig(RolloutLoopConfig):
    """``reinforce``: the shared rollout-loop knobs (NeMo-Aligner's names as aliases) and the KL penalty to the
    initial policy folded into the reward."""

    #: responses sampled per prompt (the leave-one-out baseline's group).
    num_generations_per_prompt: int = attrs.field(default=4, validator=attrs.validators.ge(2))
    #: weight of the sequence's KL to the initial policy, subtracted from its reward.
    initial_policy_kl_penalty: float = attrs.field(default=0.01, validator=attrs.validators.ge(0))


#: the loss REINFORCE uses: -A * log pi per token, no ratio and no KL term (the KL is in the reward).
REINFORCE_LOSS = LossConfig(disable_ppo_ratio=True, reference_policy_kl_penalty=0.0, token_level_loss=True)


def check(config: Config, device: str) -> None:
    """Before any worker starts: a step's rollouts make whole optimizer steps."""
    config.section("reinforce").check_batch(config.policy, "reinforce")


def run(ctx: RunContext) -> dict[str, float]:
    cfg: ReinforceConfig = ctx.config.section("reinforce")
    loss_fn = ClippedPGLoss(cfg=REINFORCE_LOSS)
    return run_on_policy(ctx, cfg, lambda sampler, step: reinforce_step(ctx, cfg, sampler, loss_fn, step))


def reinforce_step(
    ctx: RunContext, cfg: ReinforceConfig, sampler: EpochSampler, loss_fn: ClippedPGLoss, step: int
) -> dict[str, float]:
    import torch

    on = sample_on_policy(ctx, cfg, sampler, step)
    batch, logprobs = on.batch, on.logprobs
    with on.phases("reference_logprobs"):
        reference = ctx.backend.reference_logprobs(batch)
    raw = torch.tensor(on.scored.rewards, dtype=torch.float32)  # [P*G]
    rewards = adv.kl_penalized_rewards(raw, logprobs, reference, batch["loss_mask"], cfg.initial_policy_kl_penalty)
    P, G = len(on.scored.examples), cfg.num_generations_per_prompt
    advantages = adv.group_advantages(
        rewards.view(P, G), torch.ones(P, G, dtype=torch.bool), leave_one_out=True, normalize=False
    )  # [P, G]
    batch["advantages"] = advantages.view(-1, 1) * batch["loss_mask"]
    kl = ((logprobs - reference) * batch["loss_mask"]).sum(1).mean()
    return {**update_on_policy(ctx, on, loss_fn), "reward_with_kl": float(rewards.mean()), "train/kl": float(kl)}

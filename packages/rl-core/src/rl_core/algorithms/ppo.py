"""PPO with a learned critic: token-level advantages from GAE over a value model trained beside the policy.

One step: ``num_prompts_per_step`` prompts x ``num_generations_per_prompt`` samples (1 is plain PPO; more give
the critic more states per prompt). Each sample's reward (the reward sources' total) is given at its last token;
with ``kl_penalty`` > 0 each token also gets ``-kl_penalty * (log pi(x_t) - log pi_ref(x_t))`` (the KL to the
reference policy as reward shaping, as InstructGPT's PPO does). The critic reads the same tokens: the value of the
state before action token ``x_t`` is its score head at position ``t - 1`` (it has seen ``x_<t``). Then::

    A_t, R_t = gae(r, V, mask, gamma, lam)        (rl_core.training.advantages.gae)
    critic   <- ValueLoss(V_new, R_t, V_old, value_clip)   one update over the batch (losses.ValueLoss)
    policy   <- ClippedPGLoss with A_t whitened over the batch (loss_fn settings; several optimizer steps when
                policy.train_global_batch_size is smaller than the step's rollouts)

For the first ``critic.warmup_steps`` steps only the critic trains (the policy and the engine stay as they are), so
the policy's first updates see advantages from a critic that has learnt something. The critic is its own model
(``critic.model_name``, by default the policy's starting model with a new score head), with its own optimizer
(``critic.optimizer``, by default the policy's) and its own checkpoint (each checkpoint's ``critic/``); it runs on
the training backend the policy runs on, which must train a score head (``TrainingBackendSpec.score_head``). On
GPUs it takes GPUs of its own (``critic.num_workers`` of them), beside the policy and the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from rl_core.base.schema import Config, LoraConfig, OptimizerConfig, RolloutLoopConfig
from rl_core.data.prompts import EpochSampler
from rl_core.training import advantages as adv
from rl_core.training.context import RunContext
from rl_core.training.loops import prefixed
from rl_core.training.losses import ClippedPGLoss, ValueLoss
from rl_core.training.onpolicy import run_on_policy, sample_on_policy, step_metrics, update_on_policy

if TYPE_CHECKING:
    import torch

    from rl_core.contracts.batch import TokenBatch, ValueBatch


@attrs.frozen(kw_only=True)
class CriticConfig:
    """``ppo.critic``: the value model trained beside the policy."""

    #: the model the critic starts from (a causal LM gets a new score head); None: the policy's starting model
    #: (after the warm-up recipe, if any). It must read the policy's tokenizer.
    model_name: str | None = None
    #: None: the policy's optimizer settings.
    optimizer: OptimizerConfig | None = None
    #: None: as many ranks as the policy.
    num_workers: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    #: steps at the start in which only the critic trains.
    warmup_steps: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: ``c`` of the clipped value loss (``ValueLoss``); None: no clipping.
    value_clip: float | None = attrs.field(default=0.2)

    @value_clip.validator
    def _positive(self, attribute: attrs.Attribute[float | None], value: float | None) -> None:
        if value is not None and value <= 0:
            raise ValueError(f"ppo.critic.value_clip must be > 0 or null (no clipping), not {value}")


@attrs.frozen(kw_only=True)
class PPOConfig(RolloutLoopConfig):
    """``ppo``: the shared rollout-loop knobs, GAE's discount and lambda, whitening, the KL shaping and the critic."""

    #: responses sampled per prompt (PPO's critic is its baseline: one is enough).
    num_generations_per_prompt: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    #: GAE's discount per token (1: none; the reward comes at the end).
    gamma: float = attrs.field(default=1.0, validator=[attrs.validators.ge(0), attrs.validators.le(1)])
    #: GAE's lambda: 1 uses the whole return (less bias from a new critic), lower leans on the critic's values.
    lam: float = attrs.field(default=0.95, validator=[attrs.validators.ge(0), attrs.validators.le(1)])
    #: normalise the batch's token advantages to mean 0, standard deviation 1 before the policy's update.
    whiten_advantages: bool = True
    #: ``beta`` of the per-token reward ``-beta * (log pi - log pi_ref)``; 0: no reference forward.
    kl_penalty: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    critic: CriticConfig = attrs.Factory(CriticConfig)


def check(config: Config, device: str) -> None:
    """Before any worker starts: a step's rollouts make whole optimizer steps."""
    config.section("ppo").check_batch(config.policy, "ppo")


def critic_config(config: Config) -> Config:
    """The config the critic's backend starts with: the policy's, its model the critic's with a score head, no
    reference, no LoRA, its own optimizer and ranks, the policy's tokenizer; never colocated with the engine."""
    critic: CriticConfig = config.section("ppo").critic
    policy = config.policy
    return attrs.evolve(
        config,
        policy=attrs.evolve(
            policy,
            model_name=critic.model_name or policy.model_name,
            tokenizer_name=policy.tokenizer_name or policy.model_name,
            reference_model_name=None,
            head="score",
            num_workers=critic.num_workers or policy.num_workers,
            optimizer=critic.optimizer or policy.optimizer,
            lora=LoraConfig(),
            generation=attrs.evolve(policy.generation, colocated=False),
        ),
    )


def run(ctx: RunContext) -> dict[str, float]:
    cfg: PPOConfig = ctx.config.section("ppo")
    pg_loss = ClippedPGLoss(cfg=ctx.config.loss_fn)
    value_loss = ValueLoss(clip=cfg.critic.value_clip)
    return run_on_policy(ctx, cfg, lambda sampler, step: ppo_step(ctx, cfg, sampler, pg_loss, value_loss, step))


def ppo_step(
    ctx: RunContext, cfg: PPOConfig, sampler: EpochSampler, pg_loss: ClippedPGLoss, value_loss: ValueLoss, step: int
) -> dict[str, float]:
    import torch

    assert ctx.critic is not None, "ppo's AlgorithmSpec declares a critic"
    on = sample_on_policy(ctx, cfg, sampler, step)
    batch, mask = on.batch, on.batch["loss_mask"]
    # the critic is read at the position before each action token (its state: the tokens before the action)
    states = shift(mask, -1)  # [N, T]
    rows: TokenBatch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "loss_mask": states}
    with on.phases("values"):
        values = shift(ctx.critic.logprobs(rows), 1) * mask  # [N, T] V(x_<t) at each action token t
    rewards = torch.tensor(on.scored.rewards, dtype=torch.float32)[:, None] * adv.last_position(mask)  # [N, T]
    if cfg.kl_penalty > 0 or pg_loss.cfg.reference_policy_kl_penalty > 0:
        with on.phases("reference_logprobs"):
            batch["reference_logprobs"] = ctx.backend.reference_logprobs(batch)
    if cfg.kl_penalty > 0:
        rewards = rewards - cfg.kl_penalty * (on.logprobs - batch["reference_logprobs"]) * mask
    advantages, returns = adv.gae(rewards, values, mask, cfg.gamma, cfg.lam)  # [N, T] each
    critic_batch: ValueBatch = {**rows, "returns": shift(returns, -1), "old_values": shift(values, -1)}
    with on.phases("train_critic"):
        critic_metrics = ctx.critic.train(critic_batch, value_loss)
    metrics = {**prefixed("critic", critic_metrics), "ppo/shaped_reward": float((rewards * mask).sum(1).mean())}
    explained = explained_variance(values, returns, mask)
    if explained is not None:
        metrics["critic/explained_variance"] = explained
    if step <= cfg.critic.warmup_steps:  # the critic alone: the policy and the engine stay as they are
        return step_metrics(on, metrics)
    batch["advantages"] = adv.masked_whiten(advantages, mask) if cfg.whiten_advantages else advantages
    batch["prev_logprobs"] = on.logprobs
    return {**update_on_policy(ctx, on, pg_loss), **metrics}


def shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """``[N, T] -> [N, T]``: the columns moved right by ``by`` (left when negative), zeros coming in."""
    import torch

    out = torch.zeros_like(x)
    if by > 0:
        out[:, by:] = x[:, :-by]
    else:
        out[:, :by] = x[:, -by:]
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """``1 - Var(R - V) / Var(R)`` over the action tokens: 1 when the critic predicts the returns, 0 when it
    predicts no better than their mean; None when the returns hardly vary (every sample rewarded alike), where the
    ratio says nothing."""
    m = mask > 0
    var = returns[m].var()
    return float(1.0 - (returns[m] - values[m]).var() / var) if var > 1e-4 else None

"""GRPO: group relative policy optimisation, with DAPO's options.

One step: draw ``num_prompts_per_step`` prompts; sample ``num_generations_per_prompt`` responses each; score
them; advantages from the group baseline (mean, or leave-one-out) divided by the group's std; the clipped
policy-gradient loss (``rl_core.training.losses.ClippedPGLoss``) with an optional KL penalty to the reference policy;
then the new weights are refit into the rollout engine.

Departures from the textbook, stated up front:
- The "previous" logprobs are recomputed by the trainer only when they can differ from the current ones (more
  than one optimizer step per batch); with a single optimizer step they are the current logprobs, detached, for
  the PPO ratio and the importance weights alike, and the forward pass is saved. The engine-vs-trainer logprob
  check then comes from the training forward too (``rl_core.training.health``).
- DAPO dynamic sampling drops prompt groups whose rewards are all equal and draws more prompts, at most
  ``dynamic_sampling_max_gen_batches`` draws per step; if the batch is still short, the step trains on what it has.
- DAPO overlong filtering masks truncated responses out of the loss; overlong reward shaping adds a linear
  penalty in the last ``overlong_buffer_length`` tokens before ``max_new_tokens``.

Asynchronous GRPO (``async_mode``): ``one_step`` generates the batch of step ``t + 1`` with the policy of step
``t`` while step ``t`` trains; ``bounded`` lets generation run up to ``max_staleness`` steps ahead. The schedule is
fixed (``rl_core.training.producer``): the batch of step ``b`` always comes from the policy after step ``max(0, b - 1 -
k)``, so runs are reproducible and resume exactly. Off-policy batches are trained with truncated importance
sampling against the generating policy's logprobs (``off_policy_correction``), ``async/staleness`` is logged per
step (every sample of a step has the same), and the engine-vs-trainer logprob check runs on a small probe right
after each refit, when engine and trainer hold the same weights. Overlap needs the engine on resources of its own:
on GPUs ``policy.generation.colocated: false``; on CPU the node's cores are split between trainer and engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from rl_core.base.errors import ConfigError
from rl_core.base.schema import Config, LossConfig, RolloutLoopConfig
from rl_core.data.prompts import EpochSampler
from rl_core.training import advantages as adv
from rl_core.training.context import Phases, RunContext
from rl_core.training.health import engine_drift, judge_mismatch, logprob_mismatch, mismatch_due
from rl_core.training.loops import prefixed
from rl_core.training.losses import ClippedPGLoss
from rl_core.training.onpolicy import refit_metrics, run_on_policy, step_seed
from rl_core.training.producer import RolloutProducer, from_plain, generating_version
from rl_core.training.rollouts import (
    ScoredRollouts,
    generate_and_score,
    response_limit,
    rollout_batch,
    rollout_metrics,
    sampling,
)

if TYPE_CHECKING:
    import torch

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class GRPOConfig(RolloutLoopConfig):
    """``grpo``: the shared rollout-loop knobs, group normalisation and DAPO's options."""

    #: subtract the group's baseline from each reward (its mean, or leave-one-out); ``false``: the raw reward
    #: (REINFORCE++ without a baseline, normally with ``batch_normalize_advantages``).
    group_baseline: bool = True
    #: divide each group's advantages by the standard deviation of its rewards (GRPO); ``false`` for Dr. GRPO,
    #: whose authors found the division favours easy and hard prompts over the rest.
    normalize_rewards: bool = True
    #: the baseline of sample ``i`` is the mean of the group's other rewards (RLOO) instead of the whole group's.
    use_leave_one_out_baseline: bool = False
    #: REINFORCE++: whiten the advantages over every loss token of the step's batch (minus the mean, over the
    #: standard deviation), after the group baseline if any.
    batch_normalize_advantages: bool = False
    #: REINFORCE++'s token-level KL in the reward: each token's advantage minus this times the sum of
    #: ``log pi - log pi_ref`` over the sequence's tokens from it on (its KL return); 0: off. Costs a logprob pass
    #: of the policy and of the reference before training.
    reward_kl_penalty: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    #: DAPO: drop prompt groups whose rewards are all equal (no signal) and draw more prompts.
    dynamic_sampling: bool = False
    #: with ``dynamic_sampling``: at most this many draws of prompts per step; a step still short trains on what
    #: it has.
    dynamic_sampling_max_gen_batches: int = attrs.field(default=4, validator=_pos)
    #: DAPO: responses cut at ``policy.generation.max_new_tokens`` drop out of the loss.
    overlong_filtering: bool = False
    #: DAPO: a penalty growing linearly over the last ``overlong_buffer_length`` tokens before the limit.
    overlong_reward_shaping: bool = False
    #: the tokens before ``max_new_tokens`` over which the overlong penalty grows from 0.
    overlong_buffer_length: int = attrs.field(default=16, validator=_pos)
    #: the overlong penalty at the limit (subtracted from the reward).
    overlong_penalty: float = 1.0
    #: ``sync`` (generate, then train), ``one_step`` (generate step t+1's batch while step t trains) or ``bounded``
    #: (generation up to ``max_staleness`` steps ahead of training).
    async_mode: Literal["sync", "one_step", "bounded"] = "sync"
    #: with ``bounded``: a batch comes from a policy at most this many steps older than the one it trains.
    max_staleness: int = attrs.field(default=2, validator=_pos)
    #: off-policy modes: truncated importance sampling against the generating policy's logprobs.
    off_policy_correction: bool = True
    #: the truncation of that importance weight (when ``loss_fn.truncated_importance_sampling_ratio`` is unset).
    importance_sampling_cap: float = attrs.field(default=2.0, validator=attrs.validators.gt(0.0))

    def __attrs_post_init__(self) -> None:
        if not self.group_baseline and (self.normalize_rewards or self.use_leave_one_out_baseline):
            raise ValueError(
                "grpo.group_baseline=false uses the raw rewards: set grpo.normalize_rewards=false and "
                "grpo.use_leave_one_out_baseline=false too (they act on the group's baseline)"
            )

    @property
    def ahead(self) -> int:
        """Steps generation runs ahead of training: 0 (sync), 1 (one_step) or ``max_staleness`` (bounded)."""
        return {"sync": 0, "one_step": 1, "bounded": self.max_staleness}[self.async_mode]


def check(config: Config, device: str) -> None:
    """Before any worker starts: whole optimizer steps, and an engine that can run while the trainer trains for the
    asynchronous modes."""
    cfg: GRPOConfig = config.section("grpo")
    cfg.check_batch(config.policy, "grpo")
    if cfg.ahead and config.policy.generation.colocated and device == "cuda":
        raise ConfigError(
            f"grpo.async_mode={cfg.async_mode} overlaps generation with training, which needs the engine on GPUs of its "
            "own: set policy.generation.colocated=false (or grpo.async_mode=sync)"
        )


def run(ctx: RunContext) -> dict[str, float]:
    cfg: GRPOConfig = ctx.config.section("grpo")
    loss_fn = ClippedPGLoss(cfg=off_policy_loss(ctx.config.loss_fn, cfg))
    if not cfg.ahead:
        return run_on_policy(ctx, cfg, lambda sampler, step: grpo_step(ctx, cfg, sampler, loss_fn, step))
    return run_on_policy(
        ctx, cfg, stepper=lambda sampler, start, state: AsyncGRPO(ctx, cfg, loss_fn, sampler, start, state)
    )


def off_policy_loss(loss: LossConfig, cfg: GRPOConfig) -> LossConfig:
    """The loss of an off-policy mode: truncated importance sampling on, unless turned off."""
    if not cfg.ahead or not cfg.off_policy_correction:
        return loss
    cap = loss.truncated_importance_sampling_ratio or cfg.importance_sampling_cap
    return attrs.evolve(loss, use_importance_sampling_correction=True, truncated_importance_sampling_ratio=cap)


def produce(ctx: RunContext, cfg: GRPOConfig, sampler: EpochSampler, step: int, phases: Phases) -> ScoredRollouts:
    """The scored rollouts of ``step`` (its sampling seed depends on the step alone)."""
    params = sampling(ctx, cfg.num_generations_per_prompt, seed=step_seed(ctx, step))
    return collect(ctx, cfg, sampler, params, phases)


def grpo_step(
    ctx: RunContext, cfg: GRPOConfig, sampler: EpochSampler, loss_fn: ClippedPGLoss, step: int
) -> dict[str, float]:
    """Synchronous GRPO: generate with the current policy, train, refit."""
    phases = Phases()
    start = time.perf_counter()
    scored = produce(ctx, cfg, sampler, step, phases)
    gen_seconds = time.perf_counter() - start
    ctx.keep_samples(step, scored.transcripts)
    ctx.check_signal(step, scored.rollouts, scored.rewards, scored.metrics, scored.transcripts)
    metrics = train_on(ctx, cfg, scored, loss_fn, step, phases, on_policy=True)
    metrics.update(refit_metrics(ctx, phases))
    return {
        **rollout_metrics(scored, gen_seconds, response_limit(ctx)),
        **metrics,
        **phases.metrics(),
        "time/step": time.perf_counter() - start,
    }


@attrs.frozen(kw_only=True)
class LogprobPasses:
    """What a GRPO step computes before it trains, decided once per step (``logprob_passes``)."""

    #: a pass of the trainer over the batch before the update (for ``prev``, ``check`` or the reward's KL)
    current: bool
    #: that pass kept as ``prev_logprobs``: several optimizer steps on one batch, with the PPO ratio
    prev: bool
    #: the engine-vs-trainer mismatch measured on that pass (several updates: only the first is on-policy)
    check: bool
    #: the mismatch from the training forward instead (one update, on-policy: the backend measures it there)
    check_in_training: bool
    #: the reference policy's logprobs (a KL penalty in the loss or in the reward)
    reference: bool


def logprob_passes(
    ctx: RunContext, cfg: GRPOConfig, loss: LossConfig, rows: int, step: int, *, on_policy: bool
) -> LogprobPasses:
    """The passes a step of ``rows`` samples needs; the mismatch is measured only ``on_policy`` (the engine's weights
    were the trainer's), every ``mismatch_due`` step."""
    several_updates = ctx.config.policy.train_global_batch_size < rows
    prev = not loss.disable_ppo_ratio and several_updates
    check = on_policy and several_updates and (prev or mismatch_due(ctx, step))
    return LogprobPasses(
        current=prev or check or cfg.reward_kl_penalty > 0,
        prev=prev,
        check=check,
        check_in_training=on_policy and not several_updates,
        reference=loss.reference_policy_kl_penalty > 0 or cfg.reward_kl_penalty > 0,
    )


def train_on(
    ctx: RunContext,
    cfg: GRPOConfig,
    scored: ScoredRollouts,
    loss_fn: ClippedPGLoss,
    step: int,
    phases: Phases,
    *,
    on_policy: bool,
) -> dict[str, float]:
    """Advantages, the batch, the logprobs the loss needs (``logprob_passes``), and the optimizer steps on one
    step's rollouts."""
    P = len(scored.examples)
    rewards, advantages, valid = sample_advantages(ctx, cfg, scored)
    rows, of = scored.rows()  # an agent's split episodes: more rows than P * G, each with its episode's advantage
    batch = rollout_batch(rows, ctx.tokenizer.pad_token_id, ctx.config.policy.max_total_sequence_length)
    batch["advantages"] = advantages.view(-1)[of].view(-1, 1) * batch["loss_mask"]  # [B, T]
    batch["sample_mask"] = valid.view(-1)[of].float()  # [B]
    passes = logprob_passes(ctx, cfg, loss_fn.cfg, len(rows), step, on_policy=on_policy)
    health: dict[str, float] = {}
    if passes.current:
        with phases("logprobs"):
            current = ctx.backend.logprobs(batch)
        if passes.check:
            health = logprob_mismatch(ctx, batch["generation_logprobs"], current, batch["loss_mask"])
        if passes.prev:
            batch["prev_logprobs"] = current
    if passes.reference:
        with phases("reference_logprobs"):
            batch["reference_logprobs"] = ctx.backend.reference_logprobs(batch)
    if cfg.reward_kl_penalty > 0:
        to_go = adv.kl_to_go(current, batch["reference_logprobs"], batch["loss_mask"])  # [B, T]
        batch["advantages"] = batch["advantages"] - cfg.reward_kl_penalty * to_go
    if cfg.batch_normalize_advantages:
        batch["advantages"] = adv.masked_whiten(batch["advantages"], batch["loss_mask"] * batch["sample_mask"][:, None])
    with phases("train"):
        train_metrics = ctx.backend.train(batch, loss_fn)
    drift = engine_drift(train_metrics)
    if drift is not None and passes.check_in_training:
        health = judge_mismatch(ctx, *drift)
    return {
        "reward_shaped": float(rewards.mean()),
        "prompts": float(P),
        **prefixed("train", train_metrics),
        **health,
    }


def sample_advantages(
    ctx: RunContext, cfg: GRPOConfig, scored: ScoredRollouts
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's rewards (with DAPO's overlong shaping), each sample's advantage (the group baseline, or the raw
    reward) and which samples count (DAPO's overlong filtering), each ``[P, G]``."""
    import torch

    G = cfg.num_generations_per_prompt
    P = len(scored.examples)
    rewards = torch.tensor(scored.rewards, dtype=torch.float32).view(P, G)  # [P, G]
    lengths = torch.tensor([len(r.token_ids) for r in scored.rollouts]).view(P, G)  # [P, G]
    if cfg.overlong_reward_shaping:
        rewards = rewards + adv.overlong_penalty(
            lengths, ctx.config.policy.generation.max_new_tokens, cfg.overlong_buffer_length, cfg.overlong_penalty
        )
    truncated = torch.tensor([r.finish_reason == "length" for r in scored.rollouts]).view(P, G)
    valid = ~truncated if cfg.overlong_filtering else torch.ones_like(truncated)
    if scored.keep is not None:  # an agent's failed episodes, dropped
        valid = valid & torch.tensor(scored.keep).view(P, G)
    if not cfg.group_baseline:
        return rewards, rewards * valid, valid
    advantages = adv.group_advantages(
        rewards, valid, leave_one_out=cfg.use_leave_one_out_baseline, normalize=cfg.normalize_rewards
    )  # [P, G]
    return rewards, advantages, valid


class AsyncGRPO:
    """The off-policy modes' steps (``rl_core.training.loops.Stepper``): rollouts come from a ``RolloutProducer`` running
    ``cfg.ahead`` steps ahead; after each optimizer step the engine is refit once the batches that need older
    weights exist."""

    def __init__(
        self,
        ctx: RunContext,
        cfg: GRPOConfig,
        loss_fn: ClippedPGLoss,
        sampler: EpochSampler,
        start: int,
        state: Mapping[str, Any] | None,
    ) -> None:
        self.ctx, self.cfg, self.loss_fn = ctx, cfg, loss_fn
        self.generation_phases: dict[int, Phases] = {}
        #: the version the engine was refit to, released to the producer when the next step starts: between steps
        #: (logging, validation, a checkpoint) the engine is idle and holds the trainer's weights
        self.refitted: int | None = None
        buffered = {int(b): from_plain(s) for b, s in (state or {}).get("ahead", {}).items()}
        self.producer = RolloutProducer(
            self._produce, sampler, start=start, last=cfg.max_num_steps, ahead=cfg.ahead, buffered=buffered
        )

    def _produce(self, step: int, sampler: EpochSampler) -> ScoredRollouts:
        phases = self.generation_phases.setdefault(step, Phases())
        return produce(self.ctx, self.cfg, sampler, step, phases)

    def step(self, step: int) -> dict[str, float]:
        phases = Phases()
        start = time.perf_counter()
        if self.refitted is not None:
            self.producer.refitted(self.refitted)
        with phases("wait_rollouts"):
            scored, gen_seconds = self.producer.take(step)
        staleness = (step - 1) - generating_version(step, self.cfg.ahead)
        self.ctx.keep_samples(step, scored.transcripts)
        self.ctx.check_signal(step, scored.rollouts, scored.rewards, scored.metrics, scored.transcripts)
        metrics = train_on(self.ctx, self.cfg, scored, self.loss_fn, step, phases, on_policy=staleness == 0)
        with phases("wait_rollouts"):
            self.producer.wait_made(step + self.cfg.ahead)  # the engine is idle: no request crosses the refit
        metrics.update(refit_metrics(self.ctx, phases))
        if mismatch_due(self.ctx, step) and staleness > 0:
            with phases("logprobs"):
                metrics.update(probe_mismatch(self.ctx, scored))
        self.refitted = step
        made = self.generation_phases.pop(step, Phases())
        return {
            **rollout_metrics(scored, gen_seconds, response_limit(self.ctx)),
            **metrics,
            "async/staleness": float(staleness),
            **{f"time/{k}": v for k, v in made.seconds.items()},  # spent by the producer, overlapping training
            **phases.metrics(),
            "time/step": time.perf_counter() - start,
        }

    def state(self, step: int) -> dict[str, Any]:
        return self.producer.state(step)

    def close(self) -> None:
        self.producer.stop()


def probe_mismatch(ctx: RunContext, scored: ScoredRollouts) -> dict[str, float]:
    """Right after a refit, engine and trainer hold the same weights: greedy rollouts of a few of this step's
    prompts, their engine logprobs against the trainer's."""

    examples = scored.examples[:4]
    probe = generate_and_score(ctx, examples, sampling(ctx, 1, seed=ctx.config.seed, greedy=True), Phases())
    batch = rollout_batch(probe.rollouts, ctx.tokenizer.pad_token_id, ctx.config.policy.max_total_sequence_length)
    return logprob_mismatch(ctx, batch["generation_logprobs"], ctx.backend.logprobs(batch), batch["loss_mask"])


def collect(ctx: RunContext, cfg: GRPOConfig, sampler: EpochSampler, params: Any, phases: Phases) -> ScoredRollouts:
    """Scored rollouts for one step; with dynamic sampling, only groups whose rewards differ, drawing more
    prompts (up to the limit) until ``num_prompts_per_step`` groups are kept."""
    if not cfg.dynamic_sampling:
        return generate_and_score(ctx, sampler.next(), params, phases, cfg.rollout_micro_batch_size)
    G = params.n
    kept_examples: list[Any] = []
    kept_rollouts: list[Any] = []
    kept_rewards: list[float] = []
    kept_transcripts: list[Any] = []
    kept_earlier: list[tuple[int, Any]] = []
    kept_keep: list[bool] = []
    for _draw in range(cfg.dynamic_sampling_max_gen_batches):
        scored = generate_and_score(ctx, sampler.next(), params, phases, cfg.rollout_micro_batch_size)
        for p, example in enumerate(scored.examples):
            group = scored.rewards[p * G : (p + 1) * G]
            if max(group) > min(group) and len(kept_examples) < cfg.num_prompts_per_step:
                index = len(kept_examples)
                kept_examples.append(example)
                kept_rollouts += [attrs.evolve(r, prompt_index=index) for r in scored.rollouts[p * G : (p + 1) * G]]
                kept_rewards += group
                kept_transcripts += scored.transcripts[p * G : (p + 1) * G]
                kept_keep += (scored.keep or [True] * len(scored.rollouts))[p * G : (p + 1) * G]
                kept_earlier += [
                    (i - (p - index) * G, attrs.evolve(r, prompt_index=index))
                    for i, r in scored.earlier
                    if p * G <= i < (p + 1) * G
                ]
        if len(kept_examples) >= cfg.num_prompts_per_step:
            break
    if not kept_examples:  # every group was uniform: train on the last draw (its advantages are all zero)
        return scored
    metrics = {**scored.metrics, "dynamic_sampling/kept_groups": float(len(kept_examples))}
    return ScoredRollouts(
        examples=kept_examples,
        rollouts=kept_rollouts,
        rewards=kept_rewards,
        metrics=metrics,
        transcripts=kept_transcripts,
        earlier=kept_earlier,
        keep=None if all(kept_keep) else kept_keep,
    )

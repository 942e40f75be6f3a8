"""GRPO: group relative policy optimisation, with DAPO's options.

One step: draw ``num_prompts_per_step`` prompts; sample ``num_generations_per_prompt`` responses each; score
them; advantages from the group baseline (mean, or leave-one-out) divided by the group's std; the clipped
policy-gradient loss (``rl_core.losses.ClippedPGLoss``) with an optional KL penalty to the reference policy;
then the new weights are refit into the rollout engine.

Departures from the textbook, stated up front:
- The "previous" logprobs are recomputed by the trainer only when they can differ from the current ones (more
  than one optimizer step per batch, or importance-sampling correction on); with a single optimizer step they are
  the current logprobs, detached, and the forward pass is saved.
- DAPO dynamic sampling drops prompt groups whose rewards are all equal and draws more prompts, at most
  ``dynamic_sampling_max_gen_batches`` draws per step; if the batch is still short, the step trains on what it has.
- DAPO overlong filtering masks truncated responses out of the loss; overlong reward shaping adds a linear
  penalty in the last ``overlong_buffer_length`` tokens before ``max_new_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from rl_core import advantages as adv
from rl_core.context import Phases, RunContext
from rl_core.data import EpochSampler
from rl_core.health import logprob_mismatch, mismatch_due
from rl_core.loops import prefixed, run_loop
from rl_core.losses import ClippedPGLoss
from rl_core.rollouts import (
    ScoredRollouts,
    generate_and_score,
    refit,
    rollout_batch,
    rollout_metrics,
    sampling,
    validate_rollouts,
)
from rl_core.schema import RolloutLoopConfig

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class GRPOConfig(RolloutLoopConfig):
    """``grpo``: the shared rollout-loop knobs, group normalisation and DAPO's options."""

    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = False
    dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = attrs.field(default=4, validator=_pos)
    overlong_filtering: bool = False
    overlong_reward_shaping: bool = False
    overlong_buffer_length: int = attrs.field(default=16, validator=_pos)
    overlong_penalty: float = 1.0


def run(ctx: RunContext) -> dict[str, float]:
    cfg: GRPOConfig = ctx.config.section("grpo")
    loss_fn = ClippedPGLoss(cfg=ctx.config.loss_fn)
    return run_loop(
        ctx,
        rows_per_step=cfg.num_prompts_per_step,
        total_steps=cfg.max_num_steps,
        step_fn=lambda sampler, step: grpo_step(ctx, cfg, sampler, loss_fn, step),
        validate=lambda rows: validate_rollouts(ctx, rows, ctx.config.seed),
        val_period=cfg.val_period,
        val_at_start=cfg.val_at_start,
        max_val_samples=cfg.max_val_samples,
    )


def grpo_step(
    ctx: RunContext, cfg: GRPOConfig, sampler: EpochSampler, loss_fn: ClippedPGLoss, step: int
) -> dict[str, float]:
    import torch

    phases = Phases()
    start = time.perf_counter()
    G = cfg.num_generations_per_prompt
    params = sampling(ctx, G, seed=ctx.config.seed * 100_003 + step)
    scored = collect(ctx, cfg, sampler, params, phases)
    gen_seconds = time.perf_counter() - start
    P = len(scored.examples)

    rewards = torch.tensor(scored.rewards, dtype=torch.float32).view(P, G)  # [P, G]
    lengths = torch.tensor([len(r.token_ids) for r in scored.rollouts]).view(P, G)  # [P, G]
    if cfg.overlong_reward_shaping:
        rewards = rewards + adv.overlong_penalty(
            lengths, ctx.config.policy.generation.max_new_tokens, cfg.overlong_buffer_length, cfg.overlong_penalty
        )
    truncated = torch.tensor([r.finish_reason == "length" for r in scored.rollouts]).view(P, G)
    valid = ~truncated if cfg.overlong_filtering else torch.ones_like(truncated)
    advantages = adv.group_advantages(
        rewards, valid, leave_one_out=cfg.use_leave_one_out_baseline, normalize=cfg.normalize_rewards
    )  # [P, G]

    batch = rollout_batch(scored.rollouts, ctx.tokenizer.pad_token_id, ctx.config.policy.max_total_sequence_length)
    batch["advantages"] = advantages.view(-1, 1) * batch["loss_mask"]  # [B, T]
    batch["sample_mask"] = valid.view(-1).float()  # [B]
    lcfg = ctx.config.loss_fn
    several_updates = ctx.config.policy.train_global_batch_size < P * G
    need_prev = not lcfg.disable_ppo_ratio and (several_updates or lcfg.use_importance_sampling_correction)
    health: dict[str, float] = {}
    if need_prev or mismatch_due(ctx, step):
        with phases("logprobs"):
            current = ctx.backend.logprobs(batch)
        health = logprob_mismatch(ctx, batch["generation_logprobs"], current, batch["loss_mask"])
        if need_prev:
            batch["prev_logprobs"] = current
    if lcfg.reference_policy_kl_penalty > 0:
        with phases("reference_logprobs"):
            batch["reference_logprobs"] = ctx.backend.reference_logprobs(batch)
    with phases("train"):
        train_metrics = ctx.backend.train(batch, loss_fn)
    with phases("refit"):
        refit_stats = refit(ctx)
    return {
        **rollout_metrics(scored, gen_seconds),
        "reward_shaped": float(rewards.mean()),
        "prompts": float(P),
        **prefixed("train", train_metrics),
        **health,
        "refit/bytes": float(refit_stats.num_bytes),
        "refit/seconds": refit_stats.seconds,
        **phases.metrics(),
        "time/step": time.perf_counter() - start,
    }


def collect(ctx: RunContext, cfg: GRPOConfig, sampler: EpochSampler, params: Any, phases: Phases) -> ScoredRollouts:
    """Scored rollouts for one step; with dynamic sampling, only groups whose rewards differ, drawing more
    prompts (up to the limit) until ``num_prompts_per_step`` groups are kept."""
    scored = generate_and_score(ctx, sampler.next(), params, phases, cfg.rollout_micro_batch_size)
    if not cfg.dynamic_sampling:
        return scored
    G = params.n
    kept_examples: list[Any] = []
    kept_rollouts: list[Any] = []
    kept_rewards: list[float] = []
    for _draw in range(cfg.dynamic_sampling_max_gen_batches):
        for p, example in enumerate(scored.examples):
            group = scored.rewards[p * G : (p + 1) * G]
            if max(group) > min(group) and len(kept_examples) < cfg.num_prompts_per_step:
                index = len(kept_examples)
                kept_examples.append(example)
                kept_rollouts += [attrs.evolve(r, prompt_index=index) for r in scored.rollouts[p * G : (p + 1) * G]]
                kept_rewards += group
        if len(kept_examples) >= cfg.num_prompts_per_step:
            break
        scored = generate_and_score(ctx, sampler.next(), params, phases, cfg.rollout_micro_batch_size)
    if not kept_examples:  # every group was uniform: train on the last draw (its advantages are all zero)
        return scored
    metrics = {**scored.metrics, "dynamic_sampling/kept_groups": float(len(kept_examples))}
    return ScoredRollouts(examples=kept_examples, rollouts=kept_rollouts, rewards=kept_rewards, metrics=metrics)

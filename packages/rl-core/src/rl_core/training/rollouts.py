"""What the rollout algorithms (GRPO, REINFORCE) share: sampling parameters, turning prompts into scored
rollouts, the token batch of a step, the refit of the engine (with its weight-sync check), validation and the
rollout metrics. Each algorithm file composes these top-down."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.batch import PolicyGradientBatch, pad_rows
from rl_core.contracts.protocols import Rollout, SamplingParams
from rl_core.contracts.refit import RefitRoute, RefitStats, checksums_match
from rl_core.data.prompts import Example, render_prompt
from rl_core.distributed.placement import colocated as colocated_on
from rl_core.training.context import Phases, RunContext
from rl_core.training.episodes import EnvironmentRunner, run_episodes
from rl_core.training.health import weight_sync_failed
from rl_core.training.signal import limit_setting, signal_metrics


def response_limit(ctx: RunContext) -> int:
    """The token limit of a response (``rl_core.training.signal.limit_setting``)."""
    return limit_setting(ctx.config)[1]


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
    """The prompts' token ids as the model sees them (``rl_core.data.prompts.render_prompt``: chat messages through the
    tokenizer's template)."""
    key = ctx.config.data.prompt_key
    limit = ctx.config.policy.max_total_sequence_length - ctx.config.policy.generation.max_new_tokens
    out = []
    for ex in examples:
        ids, text = render_prompt(ctx.tokenizer, ctx.config.data, ex[key])
        if len(ids) > limit:
            raise InputError(
                f"a prompt has {len(ids)} tokens, more than policy.max_total_sequence_length - "
                f"policy.generation.max_new_tokens = {limit}: {text[:80]!r}..."
            )
        out.append(ids)
    return out


@attrs.frozen(kw_only=True)
class ScoredRollouts:
    examples: list[Example]
    rollouts: list[Rollout]  # P * G, grouped by prompt
    rewards: list[float]  # P * G
    metrics: dict[str, float]
    #: each rollout as the samples file keeps it: the prompt, its turns (one model turn, or an episode's turns,
    #: ``rl_core.training.episodes``), the reward and how it ended; for RUN_DIR/samples.jsonl
    transcripts: list[dict[str, Any]] = attrs.Factory(list)
    #: ``(rollout, sample)``: the samples an agent's episode split off before its last one (``DrivenEpisodes``),
    #: each trained with that rollout's advantage
    earlier: list[tuple[int, Rollout]] = attrs.Factory(list)
    #: per rollout, False where it is dropped from the loss (a failed agent's episode); None: all kept
    keep: list[bool] | None = None

    def rows(self) -> tuple[list[Rollout], list[int]]:
        """The rollouts and the earlier samples, the training batch's rows, and the rollout each row takes its
        advantage from."""
        return (
            self.rollouts + [r for _, r in self.earlier],
            list(range(len(self.rollouts))) + [i for i, _ in self.earlier],
        )


def colocated(ctx: RunContext) -> bool:
    """Engine and trainer take turns on the same GPUs (on CPU there is no device memory to hand over)."""
    return colocated_on(ctx.config, ctx.device)


def generate_and_score(
    ctx: RunContext,
    examples: Sequence[Example],
    params: SamplingParams,
    phases: Phases,
    rollout_micro_batch_size: int | None = None,
) -> ScoredRollouts:
    """``params.n`` rollouts per example, scored by the reward sources (in requests of ``rollout_micro_batch_size``
    rollouts), or, with an environment, ``params.n`` multi-turn episodes per example rewarded by it (and by the
    reward sources, if any, on the whole transcript). Colocated on GPUs, the trainer is offloaded while the engine
    generates, and the engine sleeps afterwards."""
    assert ctx.engine is not None
    with phases("generate"):
        if colocated(ctx):
            ctx.backend.offload()
            set_engine_awake(ctx, True)
        if isinstance(ctx.environment, EnvironmentRunner):
            episodes = run_episodes(ctx, ctx.environment, examples, params)
        elif ctx.environment is not None:
            episodes = ctx.environment.run(ctx, examples, params)
        else:
            rollouts = ctx.engine.generate(encode_prompts(ctx, examples), params)
        if colocated(ctx):
            set_engine_awake(ctx, False)
            ctx.backend.onload()
    if ctx.environment is not None:
        rollouts, env_rewards = episodes.rollouts, episodes.rewards
        total, parts = list(env_rewards), dict(episodes.metrics)
        if ctx.rewards:
            meta = [examples[r.prompt_index] for r in rollouts]
            with phases("score"):
                more, parts_more = ctx.score(
                    [""] * len(rollouts), [r.text for r in rollouts], meta, rollout_micro_batch_size
                )
            total, parts = [a + b for a, b in zip(total, more, strict=True)], {**parts, **parts_more}
        parts["reward/environment"] = sum(env_rewards) / max(len(env_rewards), 1)
        parts["signal/fired/environment"] = sum(r != 0 for r in env_rewards) / max(len(env_rewards), 1)
        return ScoredRollouts(
            examples=list(examples),
            rollouts=rollouts,
            rewards=total,
            metrics=parts,
            transcripts=episodes.transcripts,
            earlier=episodes.earlier,
            keep=episodes.keep,
        )
    key = ctx.config.data.prompt_key
    texts = [render_prompt(ctx.tokenizer, ctx.config.data, ex[key])[1] for ex in examples]
    prompts = [texts[r.prompt_index] for r in rollouts]
    meta = [examples[r.prompt_index] for r in rollouts]
    with phases("score"):
        rewards, parts = ctx.score(prompts, [r.text for r in rollouts], meta, rollout_micro_batch_size)
    transcripts = [
        {"prompt": p, "turns": [{"role": "model", "text": r.text}], "reward": w, "ended": r.finish_reason}
        for p, r, w in zip(prompts, rollouts, rewards, strict=True)
    ]
    return ScoredRollouts(
        examples=list(examples), rollouts=rollouts, rewards=rewards, metrics=parts, transcripts=transcripts
    )


def refit(ctx: RunContext) -> RefitStats:
    """Move the trainer's weights into the engine (waking it first when colocated). Every
    ``health.verify_refit_every``-th refit (every one with ``--debug``) carries per-tensor checksums, and a refit
    whose received checksums differ from the sent ones is a weight-sync failure."""
    engine = ctx.engine
    assert engine is not None
    if colocated(ctx):
        set_engine_awake(ctx, True)
    every = ctx.config.health.verify_refit_every
    verify = every > 0 and ctx.refits % every == 0
    route = RefitRoute(
        kind=ctx.config.policy.generation.weight_transport,
        receivers=tuple(engine.weight_receivers()),
        colocated=colocated(ctx),
        verify=verify,
        adapters_only=ctx.config.policy.lora.enabled and bool(getattr(engine, "takes_adapters", False)),
    )
    payload = ctx.backend.weights_for_refit(route)
    stats = engine.update_weights(payload)
    ctx.refits += 1
    if payload.checksums is not None:
        bad = checksums_match(payload.checksums, stats.checksums)
        if bad:
            weight_sync_failed(ctx, bad, len(payload.checksums), stats)
    return stats


def set_engine_awake(ctx: RunContext, awake: bool) -> None:
    """Wake or put to sleep the engine, only if it is not already in that state."""
    assert ctx.engine is not None
    if awake and ctx.engine_asleep:
        ctx.engine.wake()
    elif not awake and not ctx.engine_asleep:
        ctx.engine.sleep()
    ctx.engine_asleep = not awake


def rollout_batch(rollouts: Sequence[Rollout], pad_id: int, limit: int) -> PolicyGradientBatch:
    """Token batch of prompt + response rows (cut at ``limit`` tokens): ``loss_mask`` on the response tokens the
    model sampled (not on a multi-turn episode's environment tokens), the engine's logprobs aligned as
    ``generation_logprobs``."""
    import torch

    rows = [(list(r.prompt_token_ids) + list(r.token_ids))[:limit] for r in rollouts]
    ids, attn = pad_rows(rows, pad_id)
    loss_mask = torch.zeros(ids.shape, dtype=torch.float32)
    gen_logprobs = torch.zeros(ids.shape, dtype=torch.float32)
    for i, r in enumerate(rollouts):
        start = len(r.prompt_token_ids)
        end = min(start + len(r.token_ids), limit)
        sampled = [1.0] * len(r.token_ids) if r.sampled is None else [float(s) for s in r.sampled]
        loss_mask[i, start:end] = torch.tensor(sampled[: end - start], dtype=torch.float32)
        gen_logprobs[i, start:end] = torch.tensor(r.logprobs[: end - start], dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "generation_logprobs": gen_logprobs}


def validate_rollouts(ctx: RunContext, rows: Sequence[Example], seed: int, step: int | None = None) -> dict[str, float]:
    """Greedy generation on held-out prompts: mean reward and response length (``rl-core eval`` with its defaults
    runs the same code); with ``step``, a few of the samples kept as that step's validation samples."""
    if not rows:
        return {}
    scored = generate_and_score(ctx, rows, sampling(ctx, 1, seed, greedy=True), Phases())
    if step is not None:
        ctx.keep_samples(step, scored.transcripts, split="val")
    m = heldout_metrics(scored, 1)
    return {"val/reward": m["reward"], "val/response_length": m["response_length"]}


def heldout_metrics(scored: ScoredRollouts, k: int, threshold: float = 1.0) -> dict[str, float]:
    """Of ``k`` samples per prompt (grouped by prompt): mean ``reward`` and ``response_length`` over all samples;
    ``pass@k``, the fraction of prompts with a sample whose reward is >= ``threshold``; ``maj@k``, the fraction of
    prompts whose most frequent response (stripped text; the first one on a tie) has such a reward."""
    n = len(scored.rollouts)
    prompts = n // k
    passed = majority = 0
    for p in range(prompts):
        group = range(p * k, (p + 1) * k)
        passed += any(scored.rewards[i] >= threshold for i in group)
        texts = [scored.rollouts[i].text.strip() for i in group]
        top = max(texts, key=texts.count)  # max keeps the first of equal counts
        majority += scored.rewards[p * k + texts.index(top)] >= threshold
    return {
        "reward": sum(scored.rewards) / n,
        f"pass@{k}": passed / prompts,
        f"maj@{k}": majority / prompts,
        "response_length": sum(len(r.token_ids) for r in scored.rollouts) / n,
    }


def rollout_metrics(scored: ScoredRollouts, seconds: float, limit: int | None = None) -> dict[str, float]:
    """A step's rollout figures, the learning-signal ones (``rl_core.training.signal``) included; ``limit``: the
    responses' token limit (``response_limit``; without it, no ``signal/length_of_limit``)."""
    n = len(scored.rollouts)
    tokens = sum(len(r.token_ids) for r in scored.rollouts)
    return {
        "reward": sum(scored.rewards) / n,
        **scored.metrics,
        "response_length": tokens / n,
        "truncated_fraction": sum(r.finish_reason == "length" for r in scored.rollouts) / n,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        **signal_metrics(scored.rollouts, scored.rewards, limit),
    }

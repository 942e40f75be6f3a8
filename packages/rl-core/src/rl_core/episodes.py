"""Multi-turn episodes, whatever the engine: the model's turn, the environment's observation, again.

An episode's token ids are built incrementally from what the engine sampled and the tokenized observations; no
earlier turn is ever re-tokenized, so the trainer scores exactly the tokens the model produced (and the engine's
logprob of each). Environment tokens carry logprob 0 and no loss (``Rollout.sampled``). An episode ends when the
environment says so, after ``max_turns``, when its tokens reach ``max_total_tokens``, or when an environment step
raises or overruns ``step_timeout_s`` (the episode ends with that reason; the run goes on). Environment steps run
in this process (threads) or, with ``environment.num_workers``, in Ray actors (a step that overruns there has its
actor replaced).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import attrs

from rl_core.errors import InputError
from rl_core.protocols import Environment, Rollout, SamplingParams, Transition

if TYPE_CHECKING:
    from rl_core.context import RunContext
    from rl_core.schema import EnvironmentConfig


@attrs.define
class Episode:
    """One episode under way: the prompt, then every token after it, which of them the model sampled."""

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    state: Any
    tokens: list[int] = attrs.Factory(list)
    sampled: list[bool] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    reward: float = 0.0
    turns: list[dict[str, Any]] = attrs.Factory(list)
    #: None while under way; then "done", "max_turns", "budget", "timeout" or "error: ..."
    ended: str | None = None

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.tokens += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def rollout(self, tokenizer: Any) -> Rollout:
        return Rollout(
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
            prompt_token_ids=tuple(self.prompt_ids),
            token_ids=tuple(self.tokens),
            text=tokenizer.decode(self.tokens, skip_special_tokens=True),
            logprobs=tuple(self.logprobs),
            finish_reason="length" if self.ended == "budget" else "stop",
            sampled=tuple(self.sampled),
        )


class _EnvActor:
    """An environment in a Ray actor: built from the registry there, so that nothing but options travels."""

    def __init__(self, name: str, options: Any) -> None:
        from rl_core.registry import Registry

        self.env = Registry.discover().get("environment", name).factory(options)

    def step(self, state: Any, action: str) -> Transition:
        return self.env.step(state, action)


class EnvironmentRunner:
    """Runs an environment's steps for many episodes at once, with a deadline per step."""

    def __init__(self, env: Environment, name: str, cfg: EnvironmentConfig, stop_strings: Sequence[str]) -> None:
        self.env, self.name, self.cfg, self.stop_strings = env, name, cfg, tuple(stop_strings)
        self.actors: list[Any] = []
        if cfg.num_workers:
            import ray

            self.remote = ray.remote(num_cpus=0)(_EnvActor)
            self.actors = [self.remote.remote(name, cfg.options) for _ in range(cfg.num_workers)]
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix=f"env-{name}")

    def steps(self, pending: Sequence[tuple[Any, str]]) -> list[Transition | str]:
        """A transition for each ``(state, action)``, or why there is none (``"timeout"``, ``"error: ..."``)."""
        return self._remote(pending) if self.actors else self._local(pending)

    def _local(self, pending: Sequence[tuple[Any, str]]) -> list[Transition | str]:
        futures = [self.pool.submit(self.env.step, state, action) for state, action in pending]
        out: list[Transition | str] = []
        for future in futures:
            try:
                out.append(future.result(timeout=self.cfg.step_timeout_s))
            except FutureTimeout:
                out.append("timeout")
            except Exception as exc:
                out.append(f"error: {type(exc).__name__}: {exc}")
        return out

    def _remote(self, pending: Sequence[tuple[Any, str]]) -> list[Transition | str]:
        import ray
        from ray.exceptions import RayError

        refs = [self.actors[i % len(self.actors)].step.remote(s, a) for i, (s, a) in enumerate(pending)]
        ray.wait(refs, num_returns=len(refs), timeout=self.cfg.step_timeout_s)
        out: list[Transition | str] = []
        late: set[int] = set()
        for i, ref in enumerate(refs):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                out.append("timeout")
                late.add(i % len(self.actors))
                continue
            try:
                out.append(ray.get(ref))
            except RayError as exc:
                lines = [line for line in str(exc).splitlines() if line.strip()]
                out.append(f"error: {lines[-1] if lines else exc!r}")
        for index in late:  # a step that overran: its actor may never come back
            ray.kill(self.actors[index], no_restart=True)
            self.actors[index] = self.remote.remote(self.name, self.cfg.options)
        return out

    def close(self) -> None:
        import contextlib

        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.actors:
            import ray

            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        self.env.close()


def run_episodes(
    ctx: RunContext, runner: EnvironmentRunner, examples: Sequence[Mapping[str, Any]], params: SamplingParams
) -> tuple[list[Rollout], list[float], dict[str, float], list[dict[str, Any]]]:
    """``params.n`` episodes per example: their rollouts (ordered by example, then sample), rewards, metrics and
    transcripts."""
    assert ctx.engine is not None
    cfg, tok = runner.cfg, ctx.tokenizer
    episodes = []
    for i, example in enumerate(examples):
        prompt, state = runner.env.reset(example)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        if len(ids) + cfg.max_total_tokens > ctx.config.policy.max_total_sequence_length:
            raise InputError(
                f"an episode's prompt ({len(ids)} tokens) plus environment.max_total_tokens ({cfg.max_total_tokens}) is "
                f"more than policy.max_total_sequence_length ({ctx.config.policy.max_total_sequence_length})"
            )
        episodes += [Episode(i, j, list(ids), state) for j in range(params.n)]
    per_turn = cfg.max_tokens_per_turn or params.max_new_tokens
    for turn in range(cfg.max_turns):
        active = [e for e in episodes if e.ended is None]
        if not active:
            break
        turn_params = attrs.evolve(
            params,
            n=1,
            max_new_tokens=per_turn,
            stop_strings=tuple(params.stop_strings) + runner.stop_strings,
            seed=None if params.seed is None else params.seed * 1009 + turn,
        )
        outputs = ctx.engine.generate([e.prompt_ids + e.tokens for e in active], turn_params)
        pending = []
        for episode, out in zip(active, outputs, strict=True):
            room = cfg.max_total_tokens - len(episode.tokens)
            episode.add(out.token_ids[:room], out.logprobs[:room])
            action = tok.decode(list(out.token_ids[:room]))
            episode.turns.append({"role": "model", "text": action, "tokens": min(room, len(out.token_ids))})
            if len(out.token_ids) >= room:  # the turn was cut by the episode's token budget
                episode.ended = "budget"
            else:
                pending.append((episode, action))
        answers = runner.steps([(e.state, action) for e, action in pending])
        for (episode, _action), answer in zip(pending, answers, strict=True):
            if isinstance(answer, str):
                episode.ended = answer
                continue
            episode.reward += answer.reward
            episode.state = answer.state
            if answer.done:
                episode.ended = "done"
                continue
            obs = tok(answer.observation, add_special_tokens=False)["input_ids"] if answer.observation else []
            if len(episode.tokens) + len(obs) >= cfg.max_total_tokens:
                episode.ended = "budget"
                continue
            episode.add(obs, None)
            episode.turns.append({"role": "environment", "text": answer.observation, "tokens": len(obs)})
    for episode in episodes:
        episode.ended = episode.ended or "max_turns"
    ends = [e.ended.split(":")[0] for e in episodes if e.ended]
    metrics = {
        "env/turns": sum(sum(t["role"] == "model" for t in e.turns) for e in episodes) / len(episodes),
        **{f"env/ended_{k}": ends.count(k) / len(ends) for k in sorted(set(ends))},
    }
    transcripts = [
        {"prompt": tok.decode(e.prompt_ids), "turns": e.turns, "reward": e.reward, "ended": e.ended} for e in episodes
    ]
    return [e.rollout(tok) for e in episodes], [e.reward for e in episodes], metrics, transcripts

"""Multi-turn episodes, whatever the engine: the model's turn, the environment's observation, again.

An episode's token ids are built incrementally from what the engine sampled and the tokenized observations; no
earlier turn is ever re-tokenized, so the trainer scores exactly the tokens the model produced (and the engine's
logprob of each). Environment tokens carry logprob 0 and no loss (``Rollout.sampled``). An episode ends when the
environment says so, after ``max_turns``, when its tokens reach ``max_total_tokens``, or when an environment step
raises or overruns ``step_timeout_s`` (the episode ends with that reason; the run goes on, and one line names such
episodes), or when its ``reset`` raises (the row's episodes end at once, with no turn). Environment steps run
in this process (threads) or, with ``environment.num_workers``, in Ray actors (a step that overruns there has its
actor replaced).

Two schedules (``environment.schedule``): ``lockstep`` asks the engine for turn t of every episode still under way
in one call, then runs their environment steps, then turn t + 1; ``streaming`` runs every episode on its own, its
next turn requested as soon as its environment step answers, so a slow tool or a long turn holds up no other
episode. Streaming pays off with an engine that batches concurrent calls (``RolloutEngine.concurrent_requests``,
vLLM's async engine); ``auto`` picks it there and lockstep elsewhere. Both are deterministic: lockstep seeds each
call from (seed, turn), streaming each episode's turn from (seed, turn, episode), so completion order never
changes a sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import DrivenEpisodes, Environment, Rollout, RolloutEngine, SamplingParams, Transition
from rl_core.data.prompts import render_prompt

if TYPE_CHECKING:
    from rl_core.base.schema import Config, EnvironmentConfig


class EpisodeHost(Protocol):
    """What running episodes needs of a run (``RunContext`` has it): the engine, the tokenizer, the config."""

    engine: RolloutEngine | None
    tokenizer: Any
    config: Config


log = logging.getLogger(__name__)


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
    """An environment in a Ray actor, built there by its factory (a plugin's function travels by reference), so
    that nothing but the options is sent."""

    def __init__(self, factory: Callable[[Any], Environment], options: Any) -> None:
        self.env = factory(options)

    def step(self, state: Any, action: str) -> Transition:
        return self.env.step(state, action)


def _itself(env: Environment, options: Any) -> Environment:
    del options
    return env


class EnvironmentRunner:
    """Runs an environment's steps for many episodes at once, with a deadline per step."""

    def __init__(
        self,
        env: Environment,
        name: str,
        cfg: EnvironmentConfig,
        stop_strings: Sequence[str],
        factory: Callable[[Any], Environment] | None = None,
    ) -> None:
        """``factory(options)`` builds the environment in each of ``cfg.num_workers`` actors; without one, ``env``
        itself is sent to them (it must pickle)."""
        self.env, self.name, self.cfg, self.stop_strings = env, name, cfg, tuple(stop_strings)
        self.factory = factory or functools.partial(_itself, env)
        self.actors: list[Any] = []
        if cfg.num_workers:
            import ray

            self.remote = ray.remote(num_cpus=0)(_EnvActor)
            self.actors = [self.remote.remote(self.factory, cfg.options) for _ in range(cfg.num_workers)]
        # threads start as needed; enough that a step's deadline is not spent waiting for one
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"env-{name}")
        self._turn = itertools.count()  # the actor of the next remote step, round robin

    def steps(self, pending: Sequence[tuple[Any, str]]) -> list[Transition | str]:
        """A transition for each ``(state, action)``, or why there is none (``"timeout"``, ``"error: ..."``)."""

        async def all_steps() -> list[Transition | str]:
            return list(await asyncio.gather(*(self.step(state, action) for state, action in pending)))

        return asyncio.run(all_steps())

    async def step(self, state: Any, action: str) -> Transition | str:
        """One step within ``step_timeout_s``: its transition, ``"timeout"`` or ``"error: ..."``."""
        return await (self._remote(state, action) if self.actors else self._local(state, action))

    async def _local(self, state: Any, action: str) -> Transition | str:
        future = asyncio.get_running_loop().run_in_executor(self.pool, self.env.step, state, action)
        try:
            return await asyncio.wait_for(future, self.cfg.step_timeout_s)
        except TimeoutError:
            return "timeout"
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}"

    async def _remote(self, state: Any, action: str) -> Transition | str:
        import ray
        from ray.exceptions import RayError

        index = next(self._turn) % len(self.actors)
        actor = self.actors[index]
        try:
            return await asyncio.wait_for(
                asyncio.wrap_future(actor.step.remote(state, action).future()), self.cfg.step_timeout_s
            )
        except TimeoutError:
            if self.actors[index] is actor:  # a step that overran: its actor may never come back
                ray.kill(actor, no_restart=True)
                self.actors[index] = self.remote.remote(self.factory, self.cfg.options)
            return "timeout"
        except RayError as exc:
            lines = [line for line in str(exc).splitlines() if line.strip()]
            return f"error: {lines[-1] if lines else exc!r}"

    def close(self) -> None:

        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.actors:
            import ray

            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        self.env.close()


def run_episodes(
    ctx: EpisodeHost, runner: EnvironmentRunner, examples: Sequence[Mapping[str, Any]], params: SamplingParams
) -> DrivenEpisodes:
    """``params.n`` episodes per example: their rollouts (ordered by example, then sample), rewards, metrics and
    transcripts."""
    assert ctx.engine is not None
    cfg, tok = runner.cfg, ctx.tokenizer
    episodes = []
    for i, example in enumerate(examples):
        try:
            prompt, state, ended = *runner.env.reset(example), None
        except Exception as exc:  # this row's episodes end at once, the run goes on
            prompt, state, ended = str(example.get(ctx.config.data.prompt_key, "")), None, f"error: reset: {exc!r}"
        ids = render_prompt(tok, ctx.config.data, prompt)[0] or [tok.eos_token_id]
        if len(ids) + cfg.max_total_tokens > ctx.config.policy.max_total_sequence_length:
            raise InputError(
                f"an episode's prompt ({len(ids)} tokens) plus environment.max_total_tokens ({cfg.max_total_tokens}) is "
                f"more than policy.max_total_sequence_length ({ctx.config.policy.max_total_sequence_length})"
            )
        episodes += [Episode(i, j, list(ids), state, ended=ended) for j in range(params.n)]
    turns = Turns(runner, tok, params)
    under_way = [e for e in episodes if e.ended is None]
    if streaming(cfg.schedule, ctx.engine):
        asyncio.run(turns.stream_all(ctx.engine, under_way))
    else:
        turns.lockstep(ctx.engine, under_way)
    for episode in episodes:
        episode.ended = episode.ended or "max_turns"
    _report_faults(runner, [e for e in episodes if e.ended and e.ended.startswith(("timeout", "error"))], tok)
    ends = [e.ended.split(":")[0] for e in episodes if e.ended]
    metrics = {
        "env/turns": sum(sum(t["role"] == "model" for t in e.turns) for e in episodes) / len(episodes),
        **{f"env/ended_{k}": ends.count(k) / len(ends) for k in sorted(set(ends))},
    }
    transcripts = [
        {"prompt": tok.decode(e.prompt_ids), "turns": e.turns, "reward": e.reward, "ended": e.ended} for e in episodes
    ]
    return DrivenEpisodes(
        rollouts=[e.rollout(tok) for e in episodes],
        rewards=[e.reward for e in episodes],
        metrics=metrics,
        transcripts=transcripts,
    )


def _report_faults(runner: EnvironmentRunner, faulty: Sequence[Episode], tok: Any) -> None:
    """One line (console and driver log) for a batch's episodes that the environment ended by a timeout or an
    error, naming the first; their counts are in the step's ``env/ended_*`` metrics."""
    if not faulty:
        return
    timeouts = sum(e.ended == "timeout" for e in faulty)
    first = faulty[0]
    log.warning(
        "environment %r: %d episode(s) ended by a step past environment.step_timeout_s (%g s), %d by an error; "
        "first: prompt %r, after %d model turn(s): %s",
        runner.name,
        timeouts,
        runner.cfg.step_timeout_s,
        len(faulty) - timeouts,
        tok.decode(first.prompt_ids)[:80],
        sum(t["role"] == "model" for t in first.turns),
        first.ended,
    )


def turn_seed(seed: int | None, turn: int, episode: int | None = None) -> int | None:
    """The seed of a turn's engine call: from (seed, turn) for a call of every episode at once, and from the
    episode's number too for a call of its own."""
    if seed is None:
        return None
    return seed * 1009 + turn if episode is None else ((seed * 1009 + turn) * 1_000_003 + episode) % 2**31


def streaming(schedule: str, engine: RolloutEngine) -> bool:
    """Whether episodes run on their own (``auto``: when the engine batches concurrent calls)."""
    return schedule == "streaming" or (schedule == "auto" and bool(getattr(engine, "concurrent_requests", False)))


@attrs.frozen
class Turns:
    """How a model turn and an environment answer extend an episode, and the two schedules that drive them."""

    runner: EnvironmentRunner
    tok: Any
    params: SamplingParams

    def sampling(self, turn: int, episode: int | None = None) -> SamplingParams:
        """One turn's sampling: a call's seed from (seed, turn), and with ``episode`` from that episode too."""
        return attrs.evolve(
            self.params,
            n=1,
            max_new_tokens=self.runner.cfg.max_tokens_per_turn or self.params.max_new_tokens,
            stop_strings=tuple(self.params.stop_strings) + self.runner.stop_strings,
            seed=turn_seed(self.params.seed, turn, episode),
        )

    def model_turn(self, episode: Episode, out: Rollout) -> str | None:
        """Append the sampled ids (within the episode's budget); the action for the environment, or None when the
        budget ended the episode."""
        room = self.runner.cfg.max_total_tokens - len(episode.tokens)
        episode.add(out.token_ids[:room], out.logprobs[:room])
        action = self.tok.decode(list(out.token_ids[:room]))
        episode.turns.append({"role": "model", "text": action, "tokens": min(room, len(out.token_ids))})
        if len(out.token_ids) >= room:  # the turn was cut by the episode's token budget
            episode.ended = "budget"
            return None
        return action

    def answer(self, episode: Episode, answer: Transition | str) -> None:
        """Apply the environment's answer (or why there is none) to the episode."""
        if isinstance(answer, str):
            episode.ended = answer
            return
        episode.reward += answer.reward
        episode.state = answer.state
        if answer.done:
            episode.ended = "done"
            return
        obs = self.tok(answer.observation, add_special_tokens=False)["input_ids"] if answer.observation else []
        if len(episode.tokens) + len(obs) >= self.runner.cfg.max_total_tokens:
            episode.ended = "budget"
            return
        episode.add(obs, None)
        episode.turns.append({"role": "environment", "text": answer.observation, "tokens": len(obs)})

    def lockstep(self, engine: RolloutEngine, episodes: Sequence[Episode]) -> None:
        for turn in range(self.runner.cfg.max_turns):
            active = [e for e in episodes if e.ended is None]
            if not active:
                return
            outputs = engine.generate([e.prompt_ids + e.tokens for e in active], self.sampling(turn))
            actions = [(e, self.model_turn(e, out)) for e, out in zip(active, outputs, strict=True)]
            pending = [(e, action) for e, action in actions if action is not None]
            answers = self.runner.steps([(e.state, action) for e, action in pending])
            for (episode, _action), answer in zip(pending, answers, strict=True):
                self.answer(episode, answer)

    async def stream_all(self, engine: RolloutEngine, episodes: Sequence[Episode]) -> None:
        await asyncio.gather(*(self.stream_one(engine, e, number) for number, e in enumerate(episodes)))

    async def stream_one(self, engine: RolloutEngine, episode: Episode, number: int) -> None:
        for turn in range(self.runner.cfg.max_turns):
            outputs = [
                r async for r in engine.stream([episode.prompt_ids + episode.tokens], self.sampling(turn, number))
            ]
            action = self.model_turn(episode, outputs[0])
            if action is None:
                return
            self.answer(episode, await self.runner.step(episode.state, action))
            if episode.ended is not None:
                return

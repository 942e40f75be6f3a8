"""How the episodes' requests reach the engine, on the core's two schedules (``environment.schedule``).

``lockstep`` holds requests until every episode under way is waiting on one (or has ended), then sends them to the
engine in one call per sampling setting, in episode order, seeded from (seed, turn): the core's lockstep episodes,
call for call. ``streaming`` sends each request as it comes, seeded from (seed, turn, episode), for an engine that
batches concurrent calls (vLLM's async engine). Both are reproducible: arrival order never changes a sample.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs

from rl_agents.episode import AgentEpisode
from rl_core.api import Rollout, RolloutEngine, SamplingParams


@attrs.define(eq=False)
class _Request:
    episode: AgentEpisode
    prompt_ids: list[int]
    params: SamplingParams
    done: asyncio.Future[list[Rollout]]


class Lockstep:
    """Requests batched at the barrier where no episode under way is still running its agent's code."""

    def __init__(self, engine: RolloutEngine, episodes: Sequence[AgentEpisode]) -> None:
        self.engine, self.episodes = engine, list(episodes)
        self.pending: list[_Request] = []
        self.busy = False

    async def sample(self, episode: AgentEpisode, prompt_ids: list[int], params: SamplingParams) -> list[Rollout]:
        request = _Request(episode, prompt_ids, params, asyncio.get_running_loop().create_future())
        self.pending.append(request)
        episode.begin_wait()
        try:
            self.poke()
            return await request.done
        finally:
            episode.end_wait()

    def poke(self) -> None:
        """Send the held requests if every episode under way now waits on one (call when an episode ends too)."""
        under_way = [e for e in self.episodes if e.ended is None]
        if self.pending and not self.busy and all(e.waiting for e in under_way):
            self.busy = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        batch, self.pending = sorted(self.pending, key=lambda r: r.episode.number), []
        try:
            groups: dict[SamplingParams, list[_Request]] = {}
            for request in batch:
                groups.setdefault(request.params, []).append(request)
            for params, requests in groups.items():
                prompts = [r.prompt_ids for r in requests]
                try:
                    outs = await asyncio.get_running_loop().run_in_executor(None, self.engine.generate, prompts, params)
                except Exception as exc:
                    for r in requests:
                        r.done.set_exception(exc)
                    continue
                for i, r in enumerate(requests):
                    r.done.set_result([o for o in outs if o.prompt_index == i])
        finally:
            self.busy = False
        self.poke()


class Streaming:
    """Each request its own engine call, as it comes."""

    def __init__(self, engine: RolloutEngine, episodes: Sequence[AgentEpisode]) -> None:
        del episodes
        self.engine = engine

    async def sample(self, episode: AgentEpisode, prompt_ids: list[int], params: SamplingParams) -> list[Rollout]:
        episode.begin_wait()
        try:
            return sorted([r async for r in self.engine.stream([prompt_ids], params)], key=lambda r: r.sample_index)
        finally:
            episode.end_wait()

    def poke(self) -> None:
        return None


Dispatcher = Lockstep | Streaming

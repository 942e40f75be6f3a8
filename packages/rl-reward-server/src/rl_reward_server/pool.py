"""Scoring in worker processes, so that no input can freeze the server.

Each worker process builds the hosted scorers from their ``--scorer`` specs and scores one micro-batch at a time.
A call that overruns the deadline is answered with ``ScoringTimeout`` and its process is killed and replaced (a
computation holding the GIL cannot be interrupted any other way); the server's own process only waits, so
``/health`` keeps answering.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Sequence
from typing import Any

from rl_core.api import InputError, RLCoreError


class ScoringTimeout(RLCoreError):
    """A scorer call ran past the deadline; its process was replaced."""


class ScorerFailed(RLCoreError):
    """A scorer raised; the message is its ``Type: message``."""


def _serve(conn: Any, specs: Sequence[str]) -> None:
    """The worker process: build the scorers, then answer ``(name, prompts, responses, metadata)`` requests."""
    from rl_core.api import Registry
    from rl_reward_server.hosting import build_scorer

    try:
        registry = Registry.discover()
        scorers = dict(build_scorer(spec, registry) for spec in specs)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            name, prompts, responses, metadata = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", list(scorers[name].score(prompts, responses, metadata))))
        except InputError as exc:
            conn.send(("input", str(exc)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class ScorerProcess:
    """One worker process holding every hosted scorer."""

    def __init__(self, specs: Sequence[str], start_timeout_s: float = 600.0) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_serve, args=(child, list(specs)), daemon=True, name="rl-reward-scorer")
        self.proc.start()
        child.close()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise RLCoreError(f"the scorer process did not start within {start_timeout_s:.0f} s")
        status, message = self.conn.recv()
        if status != "ready":
            self.kill()
            raise RLCoreError(f"the scorers could not be built: {message}")

    def score(
        self, name: str, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]], deadline_s: float
    ) -> list[Any]:
        self.conn.send((name, prompts, responses, metadata))
        if not self.conn.poll(deadline_s):
            self.kill()
            raise ScoringTimeout(
                f"scoring {len(prompts)} samples took longer than the server's deadline of {deadline_s:g} s "
                "(--request-timeout-s); the scorer process was stopped and replaced"
            )
        status, value = self.conn.recv()
        if status == "input":
            raise InputError(value)
        if status == "error":
            raise ScorerFailed(value)
        return list(value)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()


class ScorerPool:
    """``workers`` scorer processes; a call takes an idle one, and a process that timed out is replaced."""

    def __init__(self, specs: Sequence[str], workers: int, deadline_s: float) -> None:
        self.specs, self.deadline_s = list(specs), deadline_s
        self.processes = [ScorerProcess(self.specs) for _ in range(workers)]
        self.idle: asyncio.Queue[ScorerProcess] | None = None
        self.restarts = 0

    async def start(self) -> None:
        self.idle = asyncio.Queue()
        for proc in self.processes:
            self.idle.put_nowait(proc)

    async def score(
        self, name: str, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]
    ) -> list[Any]:
        assert self.idle is not None, "start() first"
        proc = await self.idle.get()
        try:
            return await asyncio.to_thread(proc.score, name, prompts, responses, metadata, self.deadline_s)
        except ScoringTimeout:
            replacement = await asyncio.to_thread(ScorerProcess, self.specs)
            self.processes[self.processes.index(proc)] = replacement
            proc = replacement
            self.restarts += 1
            raise
        finally:
            self.idle.put_nowait(proc)

    def close(self) -> None:
        for proc in self.processes:
            proc.kill()

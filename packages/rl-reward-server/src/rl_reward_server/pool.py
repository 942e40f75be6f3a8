"""Scoring in worker processes, so that no input can freeze the server.

Each worker process builds the hosted scorers from their ``--scorer`` specs and scores one micro-batch at a time.
A call that overruns the deadline is answered with ``ScoringTimeout`` at once and its process is killed (a
computation holding the GIL cannot be interrupted any other way) and replaced in the background; the server's own
process only waits (each worker's calls in a thread of its own, blocking on the pipe), so ``/health`` keeps
answering. Worker processes die with the server (``PR_SET_PDEATHSIG`` on Linux), even when it is killed mid-call,
and a replaced one leaves no descriptor behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

from rl_core.api import InputError, Registry, RLCoreError

log = logging.getLogger(__name__)


class ScoringTimeout(RLCoreError):
    """A scorer call ran past the deadline; its process was replaced."""


class ScorerLost(RLCoreError):
    """A scorer call lost its process (it exited mid-call); its process was replaced."""


class ScorerFailed(RLCoreError):
    """A scorer raised; the message is its ``Type: message``."""


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this process when the server does (Linux), or it would score on, orphaned, until its
    call ends; then make sure the server had not already gone."""
    import os
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _serve(conn: Any, specs: Sequence[str], parent: int) -> None:
    """The worker process: build the scorers, then answer ``(name, prompts, responses, metadata)`` requests."""
    _die_with(parent)
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
    """One worker process holding the scorers of ``specs``. Started from the server's main thread (the kernel's
    parent-death signal follows the thread that started it); ``ready()`` then waits for the scorers to be built."""

    def __init__(self, specs: Sequence[str]) -> None:
        import os

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc = context.Process(
            target=_serve, args=(child, list(specs), os.getpid()), daemon=True, name="rl-reward-scorer"
        )
        self.proc.start()
        child.close()
        # the thread of its calls, its own: in the loop's shared executor a call could queue behind other scorers'
        # calls, its deadline running meanwhile
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rl-reward-pipe")

    def ready(self, start_timeout_s: float = 600.0) -> ScorerProcess:
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise RLCoreError(f"the scorer process did not start within {start_timeout_s:.0f} s")
        status, message = self.conn.recv()
        if status != "ready":
            self.kill()
            raise RLCoreError(f"the scorers could not be built: {message}")
        return self

    async def score(
        self, name: str, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]], deadline_s: float
    ) -> list[Any]:
        """Send a call and wait for its answer in a thread, with the pipe left blocking. (Watching the pipe from the
        event loop lets uvloop switch it to non-blocking, and a large message then stops halfway: ``[Errno 11]``.)
        The thread ends by the deadline: ``poll`` returns at it, and a killed process ends a ``recv``."""
        request, loop = (name, prompts, responses, metadata), asyncio.get_running_loop()
        try:
            reply = await loop.run_in_executor(self._io, self._exchange, request, time.monotonic() + deadline_s)
        except (OSError, EOFError) as exc:  # the process died mid-call (killed, out of memory)
            self.kill()
            raise ScorerLost(
                f"the scorer process exited while scoring {len(prompts)} samples ({type(exc).__name__}); it was "
                "replaced"
            ) from None
        if reply is None:
            self.kill()
            raise ScoringTimeout(
                f"scoring {len(prompts)} samples took longer than the server's deadline of {deadline_s:g} s "
                "(--request-timeout-s); the scorer process was stopped and replaced"
            )
        status, value = reply
        if status == "input":
            raise InputError(value)
        if status == "error":
            raise ScorerFailed(value)
        return list(value)

    def _exchange(self, request: tuple[Any, ...], deadline: float) -> tuple[str, Any] | None:
        """One call, blocking (in a worker thread): the reply, or None if none came by ``deadline``."""
        self.conn.send(request)
        if not self.conn.poll(max(0.0, deadline - time.monotonic())):
            return None
        return self.conn.recv()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()
        self._io.shutdown(wait=False)
        if self.proc.exitcode is not None:
            self.proc.close()  # its sentinel descriptor too


class InProcess:
    """The scorers of ``specs`` in the server's own process (``--workers 0``): no process hop, and no deadline, so
    only for scorers that cannot hang."""

    #: one call at a time: a scorer in this process need not be thread-safe
    size = 1

    def __init__(self, specs: Sequence[str]) -> None:
        from rl_reward_server.hosting import build_scorer

        registry = Registry.discover()
        self.scorers = dict(build_scorer(spec, registry) for spec in specs)

    async def score(
        self, name: str, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]
    ) -> list[Any]:
        return list(await asyncio.to_thread(self.scorers[name].score, prompts, responses, metadata))

    async def start(self) -> None:
        return None

    def close(self) -> None:
        for scorer in self.scorers.values():
            scorer.close()


class ScorerPool:
    """``workers`` scorer processes; a call takes an idle one, and a process that timed out or died is replaced in
    the background (the call is answered at once). ``lazy``: the processes start on the first call, not before
    (the lane aside, which most servers never need)."""

    def __init__(self, specs: Sequence[str], workers: int, deadline_s: float, *, lazy: bool = False) -> None:
        self.specs, self.deadline_s, self.size = list(specs), deadline_s, workers
        started = [] if lazy else [ScorerProcess(self.specs) for _ in range(workers)]
        self.processes = [p.ready() for p in started]
        self.idle: asyncio.Queue[ScorerProcess] | None = None
        self.restarts = 0
        self._replacing: set[asyncio.Task[None]] = set()
        self._starting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.idle = asyncio.Queue()
        for proc in self.processes:
            self.idle.put_nowait(proc)

    async def score(
        self, name: str, prompts: list[str], responses: list[str], metadata: list[dict[str, Any]]
    ) -> list[Any]:
        assert self.idle is not None, "start() first"
        if not self.processes:  # a lazy pool's first call starts its processes, once
            self._starting = self._starting or asyncio.create_task(self._start_lazily())
            await asyncio.shield(self._starting)
        proc = await self.idle.get()
        try:
            result = await proc.score(name, prompts, responses, metadata, self.deadline_s)
        except (ScoringTimeout, ScorerLost):
            self._background(self._replace(proc))
            raise
        except BaseException:
            self.idle.put_nowait(proc)
            raise
        self.idle.put_nowait(proc)
        return result

    async def _start_lazily(self) -> None:
        for _ in range(self.size):
            self.processes.append(await self._started())
            assert self.idle is not None
            self.idle.put_nowait(self.processes[-1])

    async def _started(self) -> ScorerProcess:
        """A new process, started here on the server's main thread, once its scorers are built."""
        while True:
            new = ScorerProcess(self.specs)
            try:
                return await asyncio.to_thread(new.ready)
            except RLCoreError:
                log.exception("a scorer process failed to start; trying again in 5 s")
                await asyncio.sleep(5)

    def _background(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, old: ScorerProcess) -> None:
        assert self.idle is not None
        new = await self._started()
        self.processes[self.processes.index(old)] = new
        self.restarts += 1
        self.idle.put_nowait(new)

    def close(self) -> None:
        for task in self._replacing:
            task.cancel()
        if self._starting is not None:
            self._starting.cancel()
        for proc in self.processes:
            proc.kill()


def make_pool(specs: Sequence[str], workers: int, deadline_s: float) -> ScorerPool | InProcess:
    """``workers`` processes under a deadline, or (0) the scorers in this process."""
    return ScorerPool(specs, workers, deadline_s) if workers else InProcess(specs)


def make_aside(specs: Sequence[str], workers: int, deadline_s: float) -> ScorerPool | None:
    """The lane aside: one process, started when first needed, where the requests of a call that overran the
    deadline are scored again one by one, so that they wait behind each other and not in front of new requests.
    None with ``workers`` 0 (no deadline, so no call overruns it)."""
    return ScorerPool(specs, 1, deadline_s, lazy=True) if workers else None

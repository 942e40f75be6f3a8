"""Certify's backends started ahead of the checks that use them: a backend's start is mostly a new process
importing torch on one core, so on a machine with cores to spare the next ones start while a check runs."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from rl_core.contracts.protocols import TrainingBackend


class AheadStarts:
    """``make(overrides)`` for each of ``planned``, in that order, begun in threads so that up to ``at_once`` are
    starting or waiting to be taken while the one taken before is in use; ``at_once=1``: each starts when it is
    taken, in the caller's thread. Calling this object takes a planned start (or makes one not planned). ``make``
    must build independent backends: it may run in several threads at once. Backends that hold GPUs start one at a
    time (``at_once=1``): a later one could take the devices an earlier one waits for."""

    def __init__(
        self, make: Callable[[Sequence[str]], TrainingBackend], planned: Sequence[Sequence[str]], at_once: int
    ) -> None:
        self.make = make
        self.pending = [tuple(p) for p in planned] if at_once > 1 else []
        self.begun: dict[tuple[str, ...], concurrent.futures.Future[TrainingBackend]] = {}
        self.at_once = at_once
        self.pool = concurrent.futures.ThreadPoolExecutor(at_once, thread_name_prefix="certify-start")
        self._top_up()

    def __call__(self, overrides: Sequence[str]) -> TrainingBackend:
        future = self.begun.pop(tuple(overrides), None)
        self._top_up()
        return future.result() if future is not None else self.make(overrides)

    def _top_up(self) -> None:
        while self.pending and len(self.begun) < self.at_once:
            key = self.pending.pop(0)
            self.begun[key] = self.pool.submit(self.make, key)

    def close(self) -> None:
        """Shut down what was started and not taken (a check that failed before it needed it)."""
        self.pending.clear()
        for future in self.begun.values():
            if not future.cancel() and future.exception() is None:
                future.result().shutdown()
        self.begun.clear()
        self.pool.shutdown()

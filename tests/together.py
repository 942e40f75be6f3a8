"""Components a test needs started at once, as a run starts them: a start is mostly a new process importing torch
on one core, so two of them take little more than one."""

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


@contextlib.contextmanager
def started_together(*starts: Callable[[], Any]) -> Iterator[tuple[Any, ...]]:
    """What each of ``starts`` returns (an engine, a backend), shut down when the block ends; a start that fails is
    raised once the others are shut down."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    made = [f.result() for f in futures if f.exception() is None]
    try:
        yield tuple(f.result() for f in futures)
    finally:
        for component in made:
            component.shutdown()

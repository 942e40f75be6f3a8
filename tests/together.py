"""Components a test needs started at once, as a run starts them (``rl_core.launch.components.start_all``): a start
is mostly a new process importing torch on one core, so two of them take little more than one."""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rl_core.launch.components import owned, start_all


@contextlib.contextmanager
def started_together(*starts: Callable[[], Any]) -> Iterator[tuple[Any, ...]]:
    """What each of ``starts`` returns (an engine, a backend), shut down when the block ends; a start that fails is
    raised once the others have started, and they are shut down too."""
    with contextlib.ExitStack() as stack:
        made = start_all({str(i): owned(stack, start) for i, start in enumerate(starts)}, together=True)
        yield tuple(made[str(i)] for i in range(len(starts)))

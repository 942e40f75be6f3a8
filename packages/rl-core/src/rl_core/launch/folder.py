"""The run folder as a record: its lock (one run at a time), what makes two configs the same run, and the
``complete.json`` a finished run leaves."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import Config, LoggerConfig, dump_yaml
from rl_core.launch.checks import check_run_folder
from rl_core.outputs.console import RunConsole

#: written in the run folder when a run ends well: the config it ran and its final metrics.
COMPLETE = "complete.json"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``RUN_DIR/.lock`` for the run: a second run into the same folder is refused at once (two runs would
    interleave their checkpoints and metrics). The lock is the operating system's (``flock``), so a killed run
    leaves none behind."""
    import fcntl

    check_run_folder(run_dir)
    with open(run_dir / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise InputError(
                f"run_dir: {run_dir} is in use by a run still going ({holder}); wait for it, or choose another run_dir"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


def run_identity(config: Config) -> str:
    """What makes two configs the same run: the resolved config without where it runs (``run_dir``, however it is
    spelled) and how it is shown and logged (``logger``), which change no step."""
    return dump_yaml(attrs.evolve(config, run_dir=".", logger=LoggerConfig()))


def finished_metrics(run_dir: Path, identity: str, console: RunConsole) -> dict[str, float] | None:
    """The final metrics of a finished run of ``identity`` in ``run_dir``, else None. A ``complete.json`` that is
    not such a record is named in one line and ignored (the run goes on from its checkpoints); a folder in its place
    is an error, since the record could not be written at the end."""
    path = run_dir / COMPLETE
    if path.is_dir():
        raise InputError(f"{path} is a folder, where rl-core writes the record of a finished run; move it away")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        console.warn(f"{path} is unreadable ({exc}); ignored, the run goes on from its checkpoints")
        return None
    metrics = record.get("metrics") if isinstance(record, dict) else None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("config"), str)
        and isinstance(metrics, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values())
    ):
        console.warn(
            f"{path} is not a finished run's record (a config and numeric final metrics); ignored, the run goes on "
            "from its checkpoints"
        )
        return None
    return {k: float(v) for k, v in metrics.items()} if record["config"] == identity else None

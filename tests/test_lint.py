"""The tree is lint clean: ruff, the import contracts (.importlinter) and the type check (mypy.ini); `hatch run
lint:check` runs the same commands. They read files only, so they start when collection ends, at idle CPU priority
(``start_lint``, from conftest): the type check's minute then runs on the core the other tests leave idle (their
start-ups are mostly one process importing), and each test here waits for its command's verdict."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "ruff-check": ["ruff", "check", "."],
    "ruff-format": ["ruff", "format", "--check", "."],
    "import-contracts": ["lint-imports", "--no-cache"],
    "mypy": ["mypy"],
}
#: the running commands, by id (``start_lint``); a test started without them (a direct call) starts its own
RUNNING: dict[str, subprocess.Popen] = {}


def idle_priority() -> None:
    """This process runs only on CPU that nothing else wants (Linux's ``SCHED_IDLE``). Not ``nice 19``: Ray runs its
    workers at nice 15, against which a nice-19 process still takes ~30% of a core."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(19)


def start_lint(ids: list[str]) -> None:
    """Start the commands ``ids`` names in the background, at idle priority (``idle_priority``)."""
    for name in ids:
        tool = shutil.which(COMMANDS[name][0])
        if tool is not None and name not in RUNNING:
            RUNNING[name] = subprocess.Popen(
                [tool, *COMMANDS[name][1:]],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=idle_priority,
            )


def stop_lint() -> None:
    """Kill any command no test waited for (its test deselected or the session cut short)."""
    for proc in RUNNING.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_lint(name: str):
    assert shutil.which(COMMANDS[name][0]), f"{COMMANDS[name][0]} is a test dependency (hatch.toml)"
    start_lint([name])
    out, err = RUNNING[name].communicate(timeout=600)
    assert RUNNING[name].returncode == 0, out[-6000:] + err[-2000:]

"""The tree is lint clean: ruff, the import contracts (.importlinter) and the type check (mypy.ini); `hatch run
lint:check` runs the same commands. They read files only, so they start with the session, beside collection and
the session's other set-up (``start_lint``, from conftest, which waits for their verdicts before the first test:
``lint_result``); each test here reads its command's verdict."""

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
#: the started commands, by id (``start_lint``), and the verdicts of those that ended (``lint_result``)
RUNNING: dict[str, subprocess.Popen] = {}
RESULTS: dict[str, tuple[int, str, str]] = {}


def start_lint(ids: list[str]) -> None:
    """Start the commands ``ids`` names, in the background."""
    for name in ids:
        tool = shutil.which(COMMANDS[name][0])
        if tool is not None and name not in RUNNING:
            RUNNING[name] = subprocess.Popen(
                [tool, *COMMANDS[name][1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )


def lint_result(name: str) -> tuple[int, str, str]:
    """Command ``name``'s exit status, output and errors (it is started now if it was not, and waited for)."""
    if name not in RESULTS:
        start_lint([name])
        out, err = RUNNING[name].communicate(timeout=600)
        RESULTS[name] = (RUNNING[name].returncode, out, err)
    return RESULTS[name]


def stop_lint(keep: list[str] | None = None) -> None:
    """Kill any command still running but those ``keep`` names (the session cut short, or their tests not selected),
    and forget the killed ones."""
    for name, proc in list(RUNNING.items()):
        if keep is not None and name in keep:
            continue
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if name not in RESULTS:
            del RUNNING[name]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_lint(name: str):
    assert shutil.which(COMMANDS[name][0]), f"{COMMANDS[name][0]} is a test dependency (hatch.toml)"
    code, out, err = lint_result(name)
    assert code == 0, out[-6000:] + err[-2000:]

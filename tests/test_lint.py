"""The tree is lint clean: ruff, the import contracts (.importlinter) and the type check (mypy.ini); `hatch run
lint:check` runs the same commands."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["lint-imports", "--no-cache"], ["mypy"]],
    ids=["ruff-check", "ruff-format", "import-contracts", "mypy"],
)
def test_lint(args):
    tool = shutil.which(args[0])
    assert tool, f"{args[0]} is a test dependency (hatch.toml)"
    out = subprocess.run([tool, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]

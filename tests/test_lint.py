"""The tree is ruff clean (``hatch run lint:check`` runs the same two commands)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff(args):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency (hatch.toml)"
    out = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr

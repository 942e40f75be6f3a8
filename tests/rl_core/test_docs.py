"""docs/config-reference.md is generated from the attrs classes and must be current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current():
    out = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "config-reference"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert out.stdout == committed, "regenerate it: rl-core config-reference -o docs/config-reference.md"

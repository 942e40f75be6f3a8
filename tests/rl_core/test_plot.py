"""rl-core plot writes a valid PNG of the expected size."""

import json
import struct
import subprocess
import sys
from pathlib import Path


def test_plot_writes_png_of_expected_size(tmp_path: Path):
    rows = [{"step": 0, "val/reward": 0.5}]
    rows += [
        {
            "step": s,
            "reward": 0.4 + 0.05 * s,
            "train/kl": 0.001 * s,
            "train/loss": -0.01 * s,
            "time/generate": 0.1,
            "time/train": 0.2,
            "time/refit": 0.05,
            "time/step": 0.4,
        }
        for s in range(1, 11)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1600, 1000)


def test_plot_of_a_folder_without_metrics_is_a_clear_error(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "no metrics.jsonl" in " ".join(out.stderr.split())

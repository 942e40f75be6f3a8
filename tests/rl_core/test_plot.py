"""rl-core plot draws the logged curves (and only the panels with something logged) into a PNG."""

import json
import struct
import subprocess
import sys
from pathlib import Path

from rl_core.outputs.plot import panels

#: matplotlib's first two default colours: the first and second curve of a panel
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def write_rows(run: Path, rows: list[dict]) -> None:
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def plot(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "plot", str(run)], capture_output=True, text=True, timeout=120
    )


def pixels_near(image, colour: tuple[int, int, int], tolerance: int = 8) -> int:
    return sum(
        count
        for count, rgb in image.getcolors(maxcolors=1 << 24)
        if all(abs(a - b) <= tolerance for a, b in zip(rgb, colour, strict=True))
    )


ROWS = (
    [{"step": 0, "val/reward": 0.5}]
    + [
        {
            "step": s,
            "reward": 0.4 + 0.05 * s,
            "train/loss": -0.01 * s,
            "time/generate": 0.1,
            "time/train": 0.2,
            "time/refit": 0.05,
            "time/step": 0.4,
        }
        for s in range(1, 11)
    ]
    + [{"step": 10, "val/reward": 0.9}]
)


def test_only_logged_panels_are_drawn():
    assert panels(ROWS) == [
        ("reward", ["reward", "val/reward"]),
        ("loss", ["train/loss"]),
        ("seconds per phase", ["time/generate", "time/refit", "time/train"]),
    ]
    with_kl = [*ROWS, {"step": 11, "train/kl": 0.01}]
    assert ("KL to reference", ["train/kl"]) in panels(with_kl)
    signal = {"truncated_fraction": 0.1, "signal/equal_reward_groups": 0.5, "signal/fired/b": 0.2, "signal/fired/a": 1}
    assert ("learning signal (shares)", [*list(signal)[:2], "signal/fired/a", "signal/fired/b"]) in panels(
        [*ROWS, {"step": 12, **signal}]
    ), "the signal's shares, every reward source's firing rate among them"


def test_plot_draws_the_curves_into_a_png_of_the_expected_size(tmp_path: Path):
    from PIL import Image

    write_rows(tmp_path, ROWS)
    out = plot(tmp_path)
    assert out.returncode == 0, out.stderr
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (1600, 1000)
    image = Image.open(tmp_path / "curves.png").convert("RGB")
    # a blank or empty figure has none of the curves' colours; three panels of curves have thousands of such pixels
    assert pixels_near(image, BLUE) > 2000, "the first curve of each panel is missing"
    assert pixels_near(image, ORANGE) > 200, "the second curves (validation points, refit time) are missing"


def test_plot_of_a_folder_without_metrics_is_a_clear_error(tmp_path: Path):
    out = plot(tmp_path)
    assert out.returncode == 2 and "no metrics.jsonl" in " ".join(out.stderr.split())

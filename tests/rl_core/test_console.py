"""What a person sees on a terminal: the live display keeps the step count, the ETA and the reward readable at 80
and 120 columns (the metrics are what gets cut), and the validation lines that stay fit the width."""

import io
import re

import pytest
from rich.console import Console

from rl_core.outputs.console import RunConsole

METRICS = {
    "reward": 0.53125,
    "train/loss": -0.0104,
    "train/kl": 0.0012,
    "health/logprob_mismatch": 8.2e-8,
    "tokens_per_second": 812.0,
    "time/generate": 1.2,
    "time/train": 2.3,
    "time/refit": 0.1,
}


@pytest.mark.parametrize("width", [80, 120])
def test_the_live_display_keeps_step_eta_and_reward_at_any_width(width: int):
    buf = io.StringIO()
    run = RunConsole(Console(file=buf, width=width, force_terminal=True, color_system=None), progress=True)
    with run.steps("grpo steps", 60, 0):
        run.step(3, 60, METRICS)
        run.step(10, 60, {**METRICS, "val/reward": 0.75})
        run._progress.refresh()
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in buf.getvalue().replace("\r", "\n").split("\n")]
    live = [f for f in frames if f.startswith("grpo steps")]
    assert live and all(len(f) <= width for f in live), live
    assert "10/60" in live[-1] and "eta" in live[-1] and "reward 0.5312" in live[-1], live[-1]
    kept = [f for f in frames if f.startswith("step 10/60")]
    assert kept and "val_reward 0.75" in kept[0] and len(kept[0]) <= width, kept

"""What a person sees on a terminal: the live display keeps the step count, the ETA and the reward readable at 80
and 120 columns (the metrics are what gets cut), and the validation lines that stay fit the width."""

import io
import re
from pathlib import Path

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


def test_the_summary_accounts_for_the_whole_run_time(tmp_path, monkeypatch):
    """The phases' shares are of the whole run (validation is a phase), and what no step phase times (start-up, checkpoints)
    has its own entry, so the line adds up to the 'done in' figure."""
    import rl_core.outputs.console as console_module

    clock = iter([100.0, 110.0])  # reset at 100 s, the summary at 110 s
    monkeypatch.setattr(console_module.time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    run = RunConsole(Console(file=buf, width=200, color_system=None), progress=False)
    run.step(1, 1, METRICS)  # 1.2 + 2.3 + 0.1 = 3.6 s of phases
    run.summary(tmp_path, final=None, checkpoints=None)
    said = buf.getvalue()
    assert "done in 10 s (1 steps)" in said
    assert "generate 1 s (12%), train 2 s (23%), refit 0 s (1%), start-up and checkpoints 6 s (64%)" in said


def test_after_the_first_step_the_run_says_what_the_rest_will_cost(monkeypatch):
    """The first step's phases, the time left at its pace with the clock time it ends, and the trainer's memory."""
    import rl_core.outputs.console as console_module

    monkeypatch.setattr(console_module.time, "time", lambda: 0.0)
    monkeypatch.setattr(console_module.time, "localtime", lambda t: console_module.time.gmtime(t))
    buf = io.StringIO()
    run = RunConsole(Console(file=buf, width=400, color_system=None), progress=False)
    run.estimate(1, 25, 100.0, {**METRICS, "train/peak_memory_gib": 7.94})
    said = buf.getvalue()
    assert "step 1 took 100.0 s (generate 1.2 s, train 2.3 s, refit 0.1 s)" in said, said
    assert "the 24 steps left: about 40 min, ending near 00:40" in said, said
    assert "trainer peak memory 7.9 GiB" in said, said


def test_the_summary_gives_the_runs_learning_signal():
    buf = io.StringIO()
    run = RunConsole(Console(file=buf, width=300, color_system=None), progress=False)
    for nonzero, alike in ((0.25, 0.5), (0.75, 0.0)):
        shares = {"signal/reward_nonzero": nonzero, "signal/fired/number_match": nonzero}
        run.step(1, 2, {**shares, "signal/equal_reward_groups": alike, "truncated_fraction": 0.1, "reward": 0.5})
    run.summary(Path("run"), final=None, checkpoints=None)
    assert (
        "learning signal (mean of the steps): rewards non-zero 50% (number_match 50%), prompts whose samples all "
        "scored alike 25%, cut at the token limit 10%" in buf.getvalue()
    )

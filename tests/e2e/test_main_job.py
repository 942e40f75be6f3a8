"""The main job as a user runs it (``rl-core run`` in a subprocess): the default recipe improves held-out reward,
and a run killed with SIGKILL resumes to the same metrics as an uninterrupted one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

SHORT_GRPO = [
    "warmup_recipe=null",
    "grpo.max_num_steps=6",
    "grpo.val_period=3",
    "grpo.max_val_samples=32",
    "checkpointing.save_period=2",
    "checkpointing.keep_top_k=null",
    "logger.progress=false",
]
COMPARED = ("reward", "train/loss", "train/grad_norm", "val/reward", "response_length")


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rl_core.cli", "run", f"run_dir={run_dir}", *overrides]
    # a session of its own, so that a kill takes the local Ray it started with it
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = row  # a resumed run re-logs the steps after its checkpoint; the last one counts
    return rows


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_default_recipe_improves_heldout_reward(tmp_path: Path):
    out = finish(start(tmp_path / "run"))
    assert "training backend: dtensor (priority 100" in out and "rollout engine: vllm" in out
    rows = metrics(tmp_path / "run")
    before, after = rows[0]["val/reward"], rows[max(rows)]["val/reward"]
    print(f"held-out reward before GRPO {before:.3f}, after {after:.3f}")
    assert after >= before + 0.2, f"held-out reward did not rise enough: {before:.3f} -> {after:.3f}"


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path: Path):
    reference = tmp_path / "uninterrupted"
    finish(start(reference, *SHORT_GRPO))

    run = tmp_path / "killed"
    proc = start(run, *SHORT_GRPO)
    ckpts = run / "checkpoints"
    caught_mid_write = False
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if list(ckpts.glob(".tmp-step_000004-*")):
            caught_mid_write = True
            break
        if (ckpts / "step_000004").is_dir():
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    kill_group(proc)
    complete = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_"))
    if caught_mid_write:
        assert complete == ["step_000002"], complete  # the half-written step 4 is not a checkpoint

    out = finish(start(run, *SHORT_GRPO))
    resumed_from = 2 if caught_mid_write else 4
    assert f"step_{resumed_from:06d} (step {resumed_from})" in " ".join(out.split())
    assert not list(ckpts.glob(".tmp-*"))
    expected, got = metrics(reference), metrics(run)
    assert sorted(got) == sorted(expected) == list(range(7))
    for step in expected:
        for key in COMPARED:
            if key in expected[step]:
                assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-6), (step, key)

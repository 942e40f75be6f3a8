"""Asynchronous GRPO for real (trainer and engine in Ray actors, generation overlapping training): the staleness
bound holds, every sampled rollout is trained on (no short-rollout bias), and a run killed with SIGKILL resumes
to redo its steps after the checkpoint as it had logged them."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_core.launch.run import run_config
from rl_core.outputs.console import RunConsole

pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: the engine's logprobs (in the mismatch probe, every step) tell a batch from one regenerated with other weights,
#: where its tokens, rewards and loss can come out the same
COMPARED = (
    "reward",
    "train/loss",
    "train/grad_norm",
    "response_length",
    "async/staleness",
    "val/reward",
    "health/logprob_mismatch",
)
#: a raw tiny model, long responses: lengths vary from sample to sample
RAW = [
    "warmup_recipe=null",
    "policy.generation.vllm_cfg.enforce_eager=true",  # vLLM without its compile step (~4 s a start)
    "policy.generation.max_new_tokens=12",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
    "grpo.val_period=3",
    "grpo.max_val_samples=16",
    "logger.progress=false",
]


def rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_staleness_is_bounded_and_every_rollout_is_trained_on(ray_session, rl_registry, make_config, tmp_path: Path):
    runs = {}
    for mode, extra in {"sync": [], "bounded": ["grpo.async_mode=bounded", "grpo.max_staleness=2"]}.items():
        config = make_config(
            *RAW, f"run_dir={tmp_path / mode}", "grpo.max_num_steps=6", "policy.generation.backend=hf", *extra
        )
        run_config(config, rl_registry, RunConsole(progress=False))
        runs[mode] = rows(tmp_path / mode)
    bounded, sync = runs["bounded"], runs["sync"]
    assert [bounded[s]["async/staleness"] for s in range(1, 7)] == [0, 1, 2, 2, 2, 2]
    assert all("async/staleness" not in r for r in sync.values())
    for mode in runs.values():  # 4 prompts x 4 samples trained every step: nothing dropped for being late
        assert all(mode[s]["prompts"] == 4 for s in range(1, 7))
    mean = {m: sum(r[s]["response_length"] for s in range(1, 7)) / 6 for m, r in runs.items()}
    # the same prompts and seeds, a little older policy: lengths agree (none is cut short for arriving early)
    assert abs(mean["bounded"] - mean["sync"]) <= 0.15 * mean["sync"], mean
    assert bounded[1]["reward"] == sync[1]["reward"], "step 1 is on-policy in both modes"


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rl_core.cli", "run", f"run_dir={run_dir}", *RAW, *overrides]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def logged_steps(run_dir: Path) -> set[int]:
    """The steps whose metrics line is whole in metrics.jsonl (it may be mid-write)."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return {json.loads(line)["step"] for line in text.splitlines(keepends=True) if line.endswith("\n")}


def test_one_step_runs_resume_exactly_after_sigkill(ray_session, rl_registry, make_config, tmp_path: Path, capsys):
    """Killed (the whole process group, -9) once step 3 of 4 is logged; the step-2 checkpoint holds the batch
    generated ahead for step 3, so the resumed run (in this process) redoes step 3 (its validation too) exactly as
    logged before."""
    job = [
        "warmup_recipe=builtin:parity_format_sft",  # answers at chance: rewards, a loss and updates (a raw model has none)
        "policy.generation.backend=hf",  # the engine is not what is tested here, and this one starts sooner
        "grpo.max_num_steps=4",
        "grpo.async_mode=one_step",
        "checkpointing.save_period=2",
        "health.logprob_mismatch_every=1",
    ]
    run = tmp_path / "killed"
    proc = start(run, *job)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and 3 not in logged_steps(run):
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    killed = rows(run)
    assert 4 not in killed and (run / "checkpoints" / "step_000002").is_dir()
    state = json.loads((run / "checkpoints" / "step_000002" / "state.json").read_text())
    assert sorted(state["ahead"]) == ["3"], "the checkpoint keeps the batch generated ahead"
    capsys.readouterr()
    run_config(make_config(*RAW, f"run_dir={run}", *job), rl_registry, RunConsole(progress=False))
    out = " ".join(capsys.readouterr().out.split())
    assert "resuming from" in out and "(step 2)" in out, out[-2000:]
    got = rows(run)
    assert sorted(got) == list(range(5))
    assert all("val/reward" in killed[s] for s in (0, 3)) and all("async/staleness" in got[s] for s in (1, 4))
    assert "health/logprob_mismatch" in killed[3]
    for step in sorted(killed):
        keys = [k for k in COMPARED if k in killed[step]]
        assert keys == [k for k in COMPARED if k in got[step]], (step, "the resumed run logs the same metrics")
        for key in keys:
            assert got[step][key] == pytest.approx(killed[step][key], rel=1e-5, abs=1e-6), (step, key)

"""A run that cannot learn says so, with the fix: the issue's scenario in small (a reward that never fires, every
response cut at its token limit) on the real backend and engine: the preflight's line and warning on step 1's
samples, the step-3 warnings, the figures in every step's row; with ``health.preflight: stop`` it ends before any
update. The run is ``examples/configs/grpo_reasoning_gym.yaml`` (reasoning-gym's rows through its adapter, on the HF
engine, without its warm-up) with the scorer reading ``<answer>`` tags the model never writes: the classic way a hub
task's reward never fires."""

import json
import re
from pathlib import Path

import pytest

from rl_core.base.errors import InputError
from rl_core.config.loader import load_config
from rl_core.launch.run import run_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_reasoning_gym.yaml"


def test_a_reward_that_never_fires_and_cut_responses_are_warned_by_step_3_or_stopped_by_the_preflight(
    ray_session, rl_registry, tmp_path: Path, capsys: pytest.CaptureFixture
):
    run = tmp_path / "run"
    common = [
        "warmup_recipe=null",
        "policy.generation.backend=hf",
        "policy.generation.max_new_tokens=2",
        "reward.sources=[{name: reasoning_gym, answer_tag: answer}]",
        "grpo.max_num_steps=3",
        "grpo.val_period=10",
        "grpo.val_at_start=false",
        "grpo.max_val_samples=8",
        "checkpointing.enabled=false",
        "logger.progress=false",
    ]
    capsys.readouterr()
    run_config(load_config(RECIPE, [f"run_dir={run}", *common], rl_registry), rl_registry)
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("warning: step")]
    assert len(said) == 2, said
    assert said[0].startswith("warning: step 3: 192 of 192 samples scored 0 on 'reasoning_gym' (one response: ")
    assert re.match(
        r"warning: step 3: \d+% of responses hit policy\.generation\.max_new_tokens=2 over the last 3", said[1]
    )
    flat = " ".join(out.split())
    assert "preflight: step 1's 64 samples, before any update: reward mean 0, non-zero 0% (reasoning_gym 0%)" in flat, (
        flat
    )
    assert "warning: no learning signal in step 1: every sample scored 0 (one response: " in flat
    assert "raise policy.generation.max_new_tokens" in flat and "(health.preflight: stop ends such a run here)" in flat
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert row["signal/fired/reasoning_gym"] == 0.0 and row["signal/reward_nonzero"] == 0.0
        assert row["signal/equal_reward_groups"] == 1.0 and row["signal/length_of_limit"] == 1.0
        assert row["signal/samples"] == 64.0

    stopped = tmp_path / "stopped"
    config = load_config(RECIPE, [f"run_dir={stopped}", *common, "health.preflight=stop"], rl_registry)
    with pytest.raises(InputError, match=r"no learning signal in step 1: every sample scored 0 .*warmup_recipe"):
        run_config(config, rl_registry)
    logged = [json.loads(line)["step"] for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert logged == [], "stopped before the first update: no step logged"

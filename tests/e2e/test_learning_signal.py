"""A run that cannot learn says so by step 3, with the fix: the issue's scenario in small (a reward that never fires,
every response cut at its token limit) on the real backend and engine; its figures are in every step's row."""

import json
from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch.run import run_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_reward_that_never_fires_and_cut_responses_are_warned_by_step_3(
    ray_session, rl_registry, tmp_path: Path, capsys: pytest.CaptureFixture
):
    run = tmp_path / "run"
    overrides = [
        f"run_dir={run}",
        "warmup_recipe=null",
        "policy.generation.backend=hf",
        "policy.generation.max_new_tokens=2",
        "reward.sources=[{name: regex, pattern: NEVER_WRITTEN}]",
        "grpo.max_num_steps=3",
        "grpo.val_period=10",
        "grpo.val_at_start=false",
        "grpo.max_val_samples=8",
        "checkpointing.enabled=false",
        "logger.progress=false",
    ]
    capsys.readouterr()
    run_config(load_config(None, overrides, rl_registry), rl_registry)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: step")]
    assert len(said) == 2, said
    assert said[0].startswith("warning: step 3: 192 of 192 samples scored 0 on 'regex' (one response: ")
    assert said[1].startswith("warning: step 3: 100% of responses hit policy.generation.max_new_tokens=2")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        assert row["signal/fired/regex"] == 0.0 and row["signal/reward_nonzero"] == 0.0
        assert row["signal/equal_reward_groups"] == 1.0 and row["signal/length_of_limit"] == 1.0
        assert row["signal/samples"] == 64.0

"""Reward-model training end to end: the recipe learns held-out preference pairs, and its ``final/`` is a reward
model that ``rl-reward-server`` serves as it is, giving over HTTP the rewards training read."""

import json
from pathlib import Path

import pytest
from rl_reward_server.client import RemoteConfig, RemoteRewardSource

from rl_core.config.loader import load_config
from rl_core.launch.run import run_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_reward_model_recipe_learns_and_is_served_as_trained(ray_session, rl_registry, tmp_path, start_server):
    run = tmp_path / "rm"
    recipe = ROOT / "examples" / "configs" / "reward_model.yaml"
    config = load_config(recipe, [f"run_dir={run}", "logger.progress=false"], rl_registry)
    final = run_config(config, rl_registry)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before = rows[0]["val/accuracy"]
    assert final["val/accuracy"] >= 0.9 > before, (before, final["val/accuracy"])
    config_json = json.loads((run / "final" / "config.json").read_text())
    assert config_json["architectures"][0].endswith("ForSequenceClassification") and config_json["num_labels"] == 1

    server = start_server("--scorer", f"reward_model:path={run / 'final'}")
    pairs = [json.loads(line) for line in (ROOT / "examples" / "data" / "parity_dpo_val.jsonl").read_text().splitlines()]
    remote = RemoteRewardSource(RemoteConfig(url=server.url, scorer="reward_model"))
    prompts = [p["prompt"] for p in pairs]
    chosen = remote.score(prompts, [p["chosen"] for p in pairs], [{}] * len(pairs))
    rejected = remote.score(prompts, [p["rejected"] for p in pairs], [{}] * len(pairs))
    gaps = [c - r for c, r in zip(chosen, rejected, strict=True)]
    assert sum(g > 0 for g in gaps) / len(gaps) == pytest.approx(final["val/accuracy"])
    assert sum(gaps) / len(gaps) == pytest.approx(final["val/reward_gap"], abs=1e-4)

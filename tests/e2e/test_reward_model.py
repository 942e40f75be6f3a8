"""Reward-model training end to end, and the loop it closes: the recipe learns held-out preference pairs; its
``final/`` is a reward model that ``rl-reward-server`` serves as it is (over HTTP, the rewards training read); GRPO
against that served model (``examples/configs/grpo_reward_model.yaml``) makes the policy right under the held-out
rule it never saw (``rl-core eval``'s ``run_eval`` with the exact-match rule, in this process)."""

import json
import math
import time
from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch.evaluate import EvalSettings, run_eval
from rl_core.launch.run import run_config
from rl_core.outputs.console import RunConsole
from rl_reward_server.client import RemoteConfig, RemoteRewardSource

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


def val_rows(run: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


def test_a_trained_reward_model_is_served_as_trained_and_grpo_against_it_learns_the_rule(
    ray_session, rl_registry, tmp_path, start_server
):
    rm = tmp_path / "rm"
    recipe = load_config(CONFIGS / "reward_model.yaml", [f"run_dir={rm}", "logger.progress=false"], rl_registry)
    final = run_config(recipe, rl_registry)
    accuracy = val_rows(rm, "val/accuracy")
    assert accuracy[-1] >= 0.95 and accuracy[0] < 0.7, accuracy
    config_json = json.loads((rm / "final" / "config.json").read_text())
    assert config_json["architectures"][0].endswith("ForSequenceClassification") and len(config_json["id2label"]) == 1
    # what tests/e2e/test_recipes.py checks of the recipes it runs shortened (this one it leaves to this test)
    rows = [json.loads(line) for line in (rm / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(121)) and all(math.isfinite(v) for r in rows for v in r.values())
    assert {"startup/prepare", "startup/workers"} <= set(rows[0]) and rows[1]["time/train"] > 0
    assert (rm / "checkpoints" / "step_000120" / "state.json").is_file()
    assert final == {k: v for k, v in rows[-1].items() if k != "step"}
    begun = time.monotonic()
    assert run_config(recipe, rl_registry) == final and time.monotonic() - begun < 5, "the finished run, found"

    server = start_server("--scorer", f"reward_model:path={rm / 'final'}")
    lines = (ROOT / "examples" / "data" / "parity_rm_val.jsonl").read_text().splitlines()
    pairs = [json.loads(line) for line in lines]
    remote = RemoteRewardSource(RemoteConfig(url=server.url, scorer="reward_model"))
    prompts = [p["prompt"] for p in pairs]
    chosen = remote.score(prompts, [p["chosen"] for p in pairs], [{}] * len(pairs))
    rejected = remote.score(prompts, [p["rejected"] for p in pairs], [{}] * len(pairs))
    gaps = [c - r for c, r in zip(chosen, rejected, strict=True)]
    assert sum(g > 0 for g in gaps) / len(gaps) == pytest.approx(final["val/accuracy"])
    assert sum(gaps) / len(gaps) == pytest.approx(final["val/reward_gap"], abs=1e-4)

    grpo = tmp_path / "grpo"
    served = f"reward.sources=[{{name: remote, url: '{server.url}', scorer: reward_model}}]"
    overrides = [f"run_dir={grpo}", "logger.progress=false", served]
    run_config(load_config(CONFIGS / "grpo_reward_model.yaml", overrides, rl_registry), rl_registry)
    learned = val_rows(grpo, "val/reward")
    assert learned[-1] > learned[0] + 2, learned  # the reward model's own score
    settings = EvalSettings(out=tmp_path / "rule")
    # greedy, on the Hugging Face engine (no second vLLM start; the verdict is the model's, not the engine's)
    judged = ["reward.sources=[{name: exact_match}]", "policy.generation.backend=hf"]
    report = run_eval(grpo, judged, settings, rl_registry, RunConsole(progress=False))
    assert report["reward"] >= 0.95, report  # the warm-up model this starts from: 0.542 (test_main_job.py)

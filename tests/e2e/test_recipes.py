"""Every recipe under examples/configs runs end to end, shortened, with the real backend, engine and rewards."""

import json
import math
import time
from pathlib import Path

import pytest

from rl_core.base.errors import InputError
from rl_core.config.loader import load_config
from rl_core.launch.run import run_config

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
SHORT = {
    "grpo": ["grpo.max_num_steps=2", "grpo.val_period=2", "grpo.max_val_samples=16"],
    "reinforce": ["reinforce.max_steps=2", "reinforce.val_check_interval=2", "reinforce.max_val_samples=16"],
    "sft": ["sft.max_num_steps=2", "sft.val_period=2"],
    "dpo": ["dpo.max_num_steps=2", "dpo.val_period=2"],
}


def recipes() -> list[Path]:
    return sorted(CONFIGS.glob("*.yaml"))


#: recipes another test already runs as a user would: the default job written out as a file, the LoRA recipe
#: (test_main_job.py runs it whole with the HF engine, killed and resumed; vLLM's adapter refit is test_vllm.py's),
#: and distillation (it needs a trained teacher, which test_main_job.py's LoRA recipe run gives it); GRPO against a served reward model (it
#: needs the reward-model recipe's model: test_reward_model.py runs the two); PPO (test_main_job.py runs it whole);
#: the calculator (test_calculator_recipe.py runs it as committed, its warm-up and 20 steps with checkpoints); the real
#: chat model's (test_chat_model.py runs it shortened, and resumes it); the reward model (test_reward_model.py runs it
#: whole, and checks its run folder as this test would); the reasoning-gym recipe (test_learning_signal.py runs it with
#: its adapter's rows and scorer, shortened, on the HF engine)
RUN_ELSEWHERE = {
    "grpo_reasoning_gym",
    "grpo_smollm2_chat_lora",
    "grpo_parity_dtensor_vllm",
    "grpo_lora",
    "distill",
    "grpo_reward_model",
    "ppo",
    "grpo_calculator",
    "grpo_calculator_agent",
    "reward_model",
}


def test_every_recipe_is_headed_by_its_command():
    assert recipes()
    for path in recipes():
        assert f"rl-core run examples/configs/{path.name}" in path.read_text().split("\n\n")[0], path.name


@pytest.mark.parametrize("recipe", [r for r in recipes() if r.stem not in RUN_ELSEWHERE], ids=lambda p: p.stem)
def test_recipe_runs(recipe: Path, ray_session, rl_registry, tmp_path: Path, start_server, capsys):
    algorithm = load_config(recipe, [], rl_registry).algorithm
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "warmup_recipe=null",
        "logger.progress=false",
        "checkpointing.save_period=1",
        "logger.save_samples_every=1",
        "policy.generation.vllm_cfg.enforce_eager=true",  # vLLM without its compile step (~4 s a start)
        *SHORT[algorithm],
    ]
    if "reward_server" in recipe.stem:
        server = start_server("--scorer", "exact_match")
        overrides.append(f"reward.sources=[{{name: remote, url: '{server.url}', scorer: exact_match}}]")
    config = load_config(recipe, overrides, rl_registry)
    capsys.readouterr()
    final = run_config(config, rl_registry)
    said = " ".join(capsys.readouterr().out.split())
    if "megatron" in recipe.stem:  # both backends enabled: the higher priority wins, and the run says so
        assert "training backend: megatron (priority 200; also enabled: dtensor 100)" in said, said[-2000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(math.isfinite(v) for r in rows for v in r.values())
    assert "train/loss" in rows[1] and any(k.startswith("val/") for k in rows[2])
    # what a user sees of the run's cost: validation timed, the start-up's phases with the first row, the trainer's
    # peak memory, and the estimate after the first step
    assert rows[2]["time/validate"] > 0 and "time/validate" not in rows[1]
    assert {"startup/prepare", "startup/workers"} <= set(rows[0]) and not any(k.startswith("startup/") for k in rows[1])
    assert rows[1]["train/peak_memory_gib"] > 0.1 and rows[1]["time/train"] > 0  # the summary's train share
    assert "step 1 took" in said and "steps left: about" in said and "trainer peak memory" in said
    assert (run / "config.yaml").is_file() and (run / "final" / "config.json").is_file()
    assert (run / "checkpoints" / "step_000002" / "state.json").is_file()
    if algorithm in ("grpo", "reinforce"):  # a few samples of every step: prompt, response, reward
        samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert {s["step"] for s in samples if s["split"] == "train"} == {1, 2}
        assert {s["step"] for s in samples if s["split"] == "val"} == {0, 2}  # every validation's, step 0's too
        assert all(isinstance(s["reward"], float) for s in samples)
        assert all(s["prompt"] and s["turns"][0]["role"] == "model" for s in samples)
    assert final == {k: v for k, v in rows[-1].items() if k != "step"}
    start = time.monotonic()
    assert run_config(config, rl_registry) == final, "the same config again finds the finished run"
    shown_otherwise = load_config(recipe, [*overrides, f"run_dir={run}/", "logger.progress=true"], rl_registry)
    assert run_config(shown_otherwise, rl_registry) == final, "shown or spelled otherwise, it is the same run"
    assert time.monotonic() - start < 5, "and starts nothing"
    if algorithm == "sft":  # the run folder's other truths, on the recipe that starts fastest
        check_run_folder_truths(recipe, overrides, run, rl_registry, capsys)


def check_run_folder_truths(recipe: Path, overrides: list[str], run: Path, rl_registry, capsys) -> None:
    """Asked for fewer steps than it finished, a run folder says so (rather than exporting step 2's weights as a
    1-step run); when every checkpoint is damaged the run says so, starts again and logs each step once."""
    begun = time.monotonic()
    with pytest.raises(InputError, match=r"checkpointed at step 2, past the 1 steps this config asks for"):
        run_config(load_config(recipe, [*overrides, "sft.max_num_steps=1"], rl_registry), rl_registry)
    assert time.monotonic() - begun < 5, "decided before any worker starts"
    for manifest in (run / "checkpoints").glob("step_*/manifest.json"):
        manifest.unlink()
    capsys.readouterr()
    run_config(load_config(recipe, [*overrides, "sft.max_num_steps=3"], rl_registry), rl_registry)
    out = " ".join(capsys.readouterr().out.split())
    assert "no checkpoint in" in out and "is whole (2 skipped): training starts again from step 0" in out, out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


#: the loss family's settings that go together, all at once (GSPO-token's ratio, CISPO's objective, an IcePop mask,
#: Dr. GRPO's constant normaliser, REINFORCE++'s raw rewards, batch whitening and KL in the reward)
LOSS_VARIANTS = [
    "loss_fn.importance_ratio=sequence_token",
    "loss_fn.policy_objective=cispo",
    "loss_fn.mismatch_mask=token",
    "loss_fn.mismatch_mask_low=0.5",
    "loss_fn.constant_normalizer=4",
    "grpo.group_baseline=false",
    "grpo.normalize_rewards=false",
    "grpo.batch_normalize_advantages=true",
    "grpo.reward_kl_penalty=0.01",
]


def test_grpo_with_the_loss_variants_certifies_as_an_algorithm(ray_session, rl_registry, tmp_path: Path):
    """``rl-core certify`` of GRPO under the new settings: finite metrics every step (the mask's fraction among
    them), a checkpoint each, and a resume from step 1 to the same step 2."""
    from rl_core.certify import certify_algorithm
    from rl_core.plugins.specs import AlgorithmSpec

    overrides = [*LOSS_VARIANTS, "policy.generation.backend=hf", *SHORT["grpo"], "logger.progress=false"]
    card = certify_algorithm(rl_registry.get(AlgorithmSpec, "grpo"), rl_registry, tmp_path, overrides=overrides)
    assert card.passed, [(r.check, r.measured, r.detail) for r in card.results if not r.passed]
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all("train/mismatch_masked_fraction" in r for r in rows[1:]), rows[1]

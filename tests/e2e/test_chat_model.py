"""A real pretrained chat model end to end: the SmolLM2 recipe (examples/configs/grpo_smollm2_chat_lora.yaml),
shortened to what a suite can pay for (2 prompts x 8 samples a step, the Hugging Face generate engine), run for one
step and resumed for a second. What a short run can show: the chat template in every prompt, responses that stop
cleanly at ``<|im_end|>``, rewards that are the reward source's own on the model's text (with a format reward for a
wrong number, so that the base model's answers earn some), engine and
trainer agreeing on the sampled tokens' logprobs, the resumed run going on from its checkpoint. The recipe's
learning figures are the README's, from the whole recipe."""

import json
from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch.run import run_config
from rl_core.outputs.console import RunConsole
from rl_core.rewards.sources import NumberMatch, NumberMatchConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "policy.generation.backend=hf",
    "grpo.num_prompts_per_step=2",
    "policy.train_global_batch_size=16",
    "grpo.max_val_samples=4",
    "grpo.val_period=2",
    "checkpointing.save_period=1",
    "health.logprob_mismatch_every=1",
    "logger.progress=false",
    "logger.save_samples_every=1",
    # a response that starts with a wrong number earns 0.5: a few steps of the base model earn next to no full credit
    "reward.sources=[{name: number_match, format_reward: 0.5}]",
]


def test_the_chat_model_recipe_runs_stops_cleanly_agrees_and_resumes(
    ray_session, rl_registry, tmp_path: Path, capsys: pytest.CaptureFixture
):
    run = tmp_path / "run"
    recipe = ROOT / "examples/configs/grpo_smollm2_chat_lora.yaml"
    logged = []
    for steps in (1, 2):  # the second run resumes from the first one's step-1 checkpoint
        overrides = [f"run_dir={run}", *SHORT, f"grpo.max_num_steps={steps}"]
        run_config(load_config(recipe, overrides, rl_registry), rl_registry, RunConsole(progress=False))
        logged.append([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])
    said = " ".join(capsys.readouterr().out.split())
    assert "resuming from" in said and "step_000001 (step 1)" in said, said[-2000:]
    rows = logged[1]
    assert [r["step"] for r in rows] == [0, 1, 2], "each step once"
    assert rows[:2] == logged[0], "steps 0-1 are the first run's rows, timings included: not run again"
    for r in rows[1:]:
        assert r["health/logprob_mismatch"] < 1e-3, r  # engine and trainer: the same model, the same tokens
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {(s["step"], s["split"]) for s in samples} >= {(0, "val"), (1, "train"), (2, "train"), (2, "val")}
    answers = {
        row["prompt"]: row["answer"]
        for split in ("train", "val")
        for row in map(json.loads, (ROOT / f"examples/data/chat_addition_{split}.jsonl").read_text().splitlines())
    }
    scorer = NumberMatch(cfg=NumberMatchConfig(format_reward=0.5))
    for s in samples:
        prompt, text = s["prompt"], s["turns"][0]["text"]
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n"), prompt
        question = prompt.split("<|im_start|>user\n")[1].removesuffix("<|im_end|>\n<|im_start|>assistant\n")
        assert "<|im_end|>" not in text and "<|im_start|>" not in text, text  # the stop token is not in the text
        expected = scorer.score([question], [text], [{"answer": answers[question]}])[0]
        assert s["reward"] == expected, s
    stopped = [s for s in samples if s["ended"] == "stop"]
    assert len(stopped) >= len(samples) / 2, [s["turns"][0]["text"] for s in samples if s["ended"] != "stop"]
    assert all(r["reward"] > 0 for r in rows[1:]) and any(s["reward"] > 0 for s in samples if s["split"] == "val")

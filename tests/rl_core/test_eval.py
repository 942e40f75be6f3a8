"""``rl-core eval``'s figures by hand (pass@k, maj@k over k samples a prompt) and its refusals of targets it cannot
evaluate; the run-level check (a finished run's val/reward given back exactly) is in tests/e2e/test_main_job.py."""

from pathlib import Path

import pytest

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import Rollout
from rl_core.launch.evaluate import eval_config
from rl_core.training.rollouts import ScoredRollouts, heldout_metrics


def scored(texts: list[str], rewards: list[float]) -> ScoredRollouts:
    rollouts = [
        Rollout(
            prompt_index=i // 3,
            sample_index=i % 3,
            prompt_token_ids=(1,),
            token_ids=(5,) * len(t),
            text=t,
            logprobs=(0.0,) * len(t),
            finish_reason="stop",
        )
        for i, t in enumerate(texts)
    ]
    return ScoredRollouts(examples=[{}, {}, {}], rollouts=rollouts, rewards=rewards, metrics={})


def test_pass_and_majority_at_k_by_hand():
    # prompt 0: "a" twice (wrong), "b" once (right): passes, majority wrong
    # prompt 1: " b" and "b " (the same answer stripped, right), "c" (wrong): passes, majority right
    # prompt 2: three different answers, all wrong except the second: passes; on a tie the first answer counts (wrong)
    out = heldout_metrics(
        scored(["a", "a", "b", " b", "b ", "c", "x", "y", "z"], [0, 0, 1, 1, 1, 0, 0, 1, 0]),
        k=3,
    )
    assert out["pass@3"] == 1.0
    assert out["maj@3"] == pytest.approx(1 / 3)
    assert out["reward"] == pytest.approx(4 / 9)
    assert out["response_length"] == pytest.approx(11 / 9)  # two answers of 2 tokens, seven of 1


def test_a_threshold_decides_what_counts_as_correct():
    # rewards 0.5 pass at threshold 0.5, not at 1.0
    out = heldout_metrics(scored(["a"] * 9, [0.5, 0, 0, 0, 0, 0, 0, 0, 0]), k=3, threshold=0.5)
    assert out["pass@3"] == pytest.approx(1 / 3) and out["maj@3"] == pytest.approx(1 / 3)
    assert heldout_metrics(scored(["a"] * 9, [0.5] + [0.0] * 8), k=3)["pass@3"] == 0.0


def test_eval_refuses_an_unfinished_run_and_a_folder_that_is_neither(rl_registry, tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algorithm: grpo\n")
    with pytest.raises(InputError, match=r"run folder without a final model .*finish the run first"):
        eval_config(run, [], tmp_path / "out", rl_registry)
    with pytest.raises(InputError, match=r"neither a run folder \(config.yaml\) nor a model folder"):
        eval_config(tmp_path, [], tmp_path / "out", rl_registry)


def test_eval_of_a_run_that_sampled_nothing_points_at_its_model_folder(rl_registry, tiny_model_path, tmp_path: Path):
    import shutil

    run = tmp_path / "sft_run"
    shutil.copytree(tiny_model_path, run / "final")
    (run / "config.yaml").write_text(f"algorithm: sft\npolicy: {{model_name: {tiny_model_path}}}\n")
    with pytest.raises(InputError, match=r"is a run of sft, which samples nothing.*rl-core eval .*sft_run/final"):
        eval_config(run, [], tmp_path / "out", rl_registry)

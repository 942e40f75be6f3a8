"""The learning-signal figures and the warnings they raise: the issue's scenario (a reward that never fires, 98% of
responses cut at 16 tokens) is warned at step 3 with the keys to change, once per 20 steps while it lasts; a
saturated reward and groups without variance are named; a healthy run says nothing."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import Rollout
from rl_core.training.signal import REPEAT, SignalWatch, signal_metrics


def rollout(prompt: int, length: int, finish: str = "stop") -> Rollout:
    return Rollout(
        prompt_index=prompt,
        sample_index=0,
        prompt_token_ids=(1,),
        token_ids=(2,) * length,
        text="",
        logprobs=(0.0,) * length,
        finish_reason=finish,  # type: ignore[arg-type]
    )


def test_a_steps_figures():
    rollouts = [rollout(p, length) for p, length in [(0, 4), (0, 8), (1, 2), (1, 2)]]
    figures = signal_metrics(rollouts, [1.0, 0.0, 0.5, 0.5], limit=8)
    assert figures == {
        "signal/samples": 4.0,
        "signal/reward_nonzero": 0.75,
        "signal/reward_spread": 1.0,
        "signal/length_of_limit": 0.5,
        "signal/equal_reward_groups": 0.5,
    }
    assert "signal/equal_reward_groups" not in signal_metrics(rollouts[:1], [1.0], 8), "no groups, no such figure"


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=24))
def test_equal_groups_is_the_share_of_prompts_without_reward_variance(rows):
    rows = sorted(rows) + sorted(rows)  # every prompt at least twice
    figures = signal_metrics([rollout(p, 1) for p, _ in rows], [r for _, r in rows], 1)
    groups = {p: {r for q, r in rows if q == p} for p, _ in rows}
    assert figures["signal/equal_reward_groups"] == sum(len(g) == 1 for g in groups.values()) / len(groups)
    assert figures["signal/reward_spread"] == max(r for _, r in rows) - min(r for _, r in rows)


def step_metrics(**over: float) -> dict[str, float]:
    healthy = {
        "reward": 0.4,
        "truncated_fraction": 0.1,
        "signal/samples": 64.0,
        "signal/reward_nonzero": 0.4,
        "signal/reward_spread": 1.0,
        "signal/equal_reward_groups": 0.25,
        "signal/fired/number_match": 0.4,
    }
    return {**healthy, **over}


def watched(steps: int, **over: float) -> list[str]:
    said: list[str] = []
    watch = SignalWatch("policy.generation.max_new_tokens", 16, warn=said.append)
    watch.saw(
        [
            {
                "prompt": "There are 59 red marbles...",
                "turns": [{"role": "model", "text": "We know that the shelf holds "}],
            }
        ]
    )
    for step in range(1, steps + 1):
        watch.step(step, step_metrics(**over))
    return said


def test_the_issues_run_is_warned_at_step_3_with_the_keys_to_change():
    said = watched(3, reward=0.0, truncated_fraction=0.98, **{"signal/reward_nonzero": 0.0, "signal/reward_spread": 0.0,
                   "signal/fired/number_match": 0.0, "signal/equal_reward_groups": 1.0})  # fmt: skip
    assert len(said) == 2, said
    assert said[0].startswith("step 3: 192 of 192 samples scored 0 on 'number_match'")
    assert "'We know that the shelf holds '" in said[0] and "warmup_recipe" in said[0]
    assert said[1] == (
        "step 3: 98% of responses hit policy.generation.max_new_tokens=16 over the last 3 steps: raise it "
        "(a cut response rarely earns its reward)"
    )
    assert watched(2, truncated_fraction=0.98) == [], "not before step 3"


def test_a_lasting_condition_is_said_again_every_20_steps_not_every_step():
    said = watched(3 + 2 * REPEAT, truncated_fraction=0.95)
    assert [s.split(":")[0] for s in said] == ["step 3", f"step {3 + REPEAT}", f"step {3 + 2 * REPEAT}"]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"reward": 1.0, "signal/reward_spread": 0.0, "signal/equal_reward_groups": 1.0},
            "every sample scored 1 since step 1",
        ),
        ({"signal/equal_reward_groups": 1.0}, "no group has reward variance"),
        ({"truncated_fraction": 0.9}, "90% of responses hit policy.generation.max_new_tokens=16"),
    ],
    ids=["saturated", "equal-groups", "truncated"],
)
def test_each_condition_is_named(over, words):
    said = watched(3, **over)
    assert len(said) == 1 and words in said[0], said


def test_a_healthy_run_a_passing_moment_and_a_learned_task_say_nothing():
    assert watched(40) == []
    said: list[str] = []
    watch = SignalWatch("policy.generation.max_new_tokens", 16, warn=said.append)
    for step in range(1, 30):  # cut on two steps in three: never three in a row
        watch.step(step, step_metrics(truncated_fraction=0.99 if step % 3 else 0.5))
    learned = {"reward": 1.0, "signal/reward_spread": 0.0, "signal/equal_reward_groups": 1.0}
    for step in range(30, 80):  # the task learned: every sample right, every group alike
        watch.step(step, step_metrics(**learned))
    assert said == []


def preflight(rewards: list[float], mode: str = "warn", finish: str = "stop") -> tuple[list[str], list[str]]:
    lines: list[str] = []
    warned: list[str] = []
    watch = SignalWatch("policy.generation.max_new_tokens", 16, warn=warned.append)
    rollouts = [rollout(i // 2, 3, finish) for i in range(len(rewards))]
    watch.preflight(
        rollouts, rewards, {"number_match": sum(r != 0 for r in rewards) / len(rewards)}, mode, lines.append
    )
    return lines, warned


def test_the_preflight_says_step_1s_signal_and_warns_or_stops_without_any():
    lines, warned = preflight([1.0, 0.0, 0.5, 0.5])
    assert lines == [
        "preflight: step 1's 4 samples, before any update: reward mean 0.5, non-zero 75% (number_match 75%), cut at "
        "policy.generation.max_new_tokens 0%, prompts whose samples all scored alike 50%"
    ]
    assert warned == [], "a signal: nothing to warn"
    _, warned = preflight([1.0, 1.0, 1.0, 1.0])
    assert warned == [
        "no learning signal in step 1: every sample scored 1; the task is too easy for this model, or the reward "
        "ignores the response (health.preflight: stop ends such a run here)"
    ]
    _, warned = preflight([1.0, 1.0, 0.0, 0.0])
    assert warned[0].startswith("no learning signal in step 1: each prompt's samples all scored alike; raise grpo.")
    with pytest.raises(InputError, match=r"every sample scored 0; raise policy.generation.max_new_tokens \(100% "):
        preflight([0.0] * 4, mode="stop", finish="length")
    assert preflight([0.0] * 4, mode="off") == ([], [])

"""An episode's token budget (``environment.max_total_tokens``), worked out by hand: a model turn that reaches the
budget is cut there and ends the episode; an observation that would reach it is not appended and ends the episode;
environment tokens carry logprob 0 and no loss. The engine and the environment are scripted (the rule under test
is the core's, not theirs) and the tokenizer has one token per character, so every expected id is plain to see."""

from typing import Any

import pytest

from rl_core.contracts.protocols import Rollout, SamplingParams, Transition
from rl_core.testing.episodes import episode_context
from rl_core.training.episodes import EnvironmentRunner, run_episodes

#: per prompt: the model's turns, in order (each turn's text; one token per character)
TURNS = {
    "A": ["abcd", "efgh"],  # 1 + 4 tokens, observation "xyz" (3): 7 < 10; then "efgh" is cut to "efg"
    "B": ["ab"],  # 2 tokens, observation "uvwxyzuv" (8): 2 + 8 = 10 reaches the budget, not appended
    "C": ["abcdefghij"],  # one turn of 10 tokens: the whole budget, cut nowhere but ended
    "D": ["ok"],  # the environment ends it: done, reward 1
}
OBSERVATIONS = {"A": "xyz", "B": "uvwxyzuv"}
LOGPROB = -0.5


class CharTokenizer:
    """One token per character (its code point)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Answers each call with the next scripted turn of the episode whose prompt starts the call's ids."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def generate(self, prompts, sampling: SamplingParams) -> list[Rollout]:
        out = []
        for i, ids in enumerate(prompts):
            key = chr(ids[0])
            turn = self.calls.get(key, 0)
            self.calls[key] = turn + 1
            text = TURNS[key][turn][: sampling.max_new_tokens]
            tokens = tuple(ord(c) for c in text)
            out.append(
                Rollout(
                    prompt_index=i,
                    sample_index=0,
                    prompt_token_ids=tuple(ids),
                    token_ids=tokens,
                    text=text,
                    logprobs=(LOGPROB,) * len(tokens),
                    finish_reason="stop",
                )
            )
        return out


class ScriptedEnvironment:
    def reset(self, row):
        return row["prompt"], row["prompt"]

    def step(self, state: str, action: str) -> Transition:
        if state == "D":
            return Transition(observation="", reward=1.0, done=True, state=state)
        return Transition(observation=OBSERVATIONS[state], state=state)

    def close(self) -> None:
        pass


@pytest.fixture
def episodes(make_config):
    config = make_config(
        "environment.name=calculator",
        "environment.max_turns=3",
        "environment.max_total_tokens=10",
        "environment.schedule=lockstep",
    )
    runner = EnvironmentRunner(ScriptedEnvironment(), "scripted", config.environment, ())
    ctx = episode_context(config, ScriptedEngine(), CharTokenizer(), runner)
    try:
        yield run_episodes(ctx, runner, [{"prompt": p} for p in TURNS], SamplingParams(n=1, max_new_tokens=16))
    finally:
        runner.close()


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_the_token_budget_cuts_turns_and_observations_as_worked_out_by_hand(episodes):
    rollouts, rewards, metrics, transcripts = (
        episodes.rollouts,
        episodes.rewards,
        episodes.metrics,
        episodes.transcripts,
    )
    by_prompt = {chr(r.prompt_token_ids[0]): r for r in rollouts}
    expected = {
        # (tokens after the prompt, which the model sampled, why it ended)
        "A": ("abcd" + "xyz" + "efg", [True] * 4 + [False] * 3 + [True] * 3, "budget"),
        "B": ("ab", [True] * 2, "budget"),
        "C": ("abcdefghij", [True] * 10, "budget"),
        "D": ("ok", [True] * 2, "done"),
    }
    for key, (text, sampled, ended) in expected.items():
        r = by_prompt[key]
        assert list(r.token_ids) == ids(text), key
        assert list(r.sampled) == sampled, key
        assert list(r.logprobs) == [LOGPROB if s else 0.0 for s in sampled], key
        assert r.finish_reason == ("length" if ended == "budget" else "stop"), key
    assert [t["ended"] for t in transcripts] == ["budget", "budget", "budget", "done"]
    assert rewards == [0.0, 0.0, 0.0, 1.0]
    # model turns: A 2, B 1, C 1, D 1
    assert metrics["env/turns"] == pytest.approx(5 / 4)
    assert metrics["env/ended_budget"] == pytest.approx(3 / 4) and metrics["env/ended_done"] == pytest.approx(1 / 4)


class FaultyEnvironment(ScriptedEnvironment):
    """Row "E" cannot start (reset raises); row "F"'s tool hangs past the step deadline."""

    def reset(self, row):
        if row["prompt"] == "E":
            raise ValueError("no such puzzle")
        return super().reset(row)

    def step(self, state, action):
        if state == "F":
            import time

            time.sleep(5)
        return super().step(state, action)


def test_an_environment_that_raises_or_hangs_ends_those_episodes_and_says_so(make_config, caplog):
    from rl_core.training.rollouts import rollout_batch

    TURNS.update({"E": ["never"], "F": ["ab"]})
    config = make_config(
        "environment.name=calculator",
        "environment.max_turns=2",
        "environment.max_total_tokens=16",
        "environment.step_timeout_s=0.5",
        "environment.schedule=lockstep",
    )
    runner = EnvironmentRunner(FaultyEnvironment(), "faulty", config.environment, ())
    ctx = episode_context(config, ScriptedEngine(), CharTokenizer(), runner)
    try:
        out = run_episodes(
            ctx, runner, [{"prompt": p} for p in ("A", "E", "F")], SamplingParams(n=1, max_new_tokens=16)
        )
        rollouts, metrics, transcripts = out.rollouts, out.metrics, out.transcripts
    finally:
        runner.close()
        del TURNS["E"], TURNS["F"]
    ended = [t["ended"] for t in transcripts]
    assert ended[0] == "max_turns" and ended[1].startswith("error: reset: ValueError") and ended[2] == "timeout"
    assert [len(r.token_ids) for r in rollouts] == [2 * (4 + 3), 0, 2]  # A: two turns, each answered
    assert metrics["env/ended_error"] == pytest.approx(1 / 3) and metrics["env/ended_timeout"] == pytest.approx(1 / 3)
    faults = [r.getMessage() for r in caplog.records if r.name == "rl_core.training.episodes"]
    assert len(faults) == 1 and "1 episode(s) ended by a step past environment.step_timeout_s" in faults[0]
    assert "1 by an error" in faults[0]
    batch = rollout_batch(rollouts, 0, 32)  # an episode with no turn still trains as an empty response
    assert batch["loss_mask"][1].sum() == 0 and batch["loss_mask"][0].sum() == 8

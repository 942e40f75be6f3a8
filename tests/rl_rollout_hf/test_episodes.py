"""Multi-turn episodes for real (the Hugging Face engine, the calculator environment): the token ids the trainer
sees are exactly the ids the engine sampled plus the tokenized observations, environment tokens get no loss, and an
environment that raises or hangs ends its episode, not the run."""

import time

import attrs
import pytest
from episode_contexts import ScriptedCalculator

from rl_core.certify.reward import certify_environment
from rl_core.config.loader import load_config
from rl_core.contracts.protocols import SamplingParams
from rl_core.rewards.environments import Calculator, CalculatorConfig
from rl_core.testing.episodes import episode_context as make_episode_context
from rl_core.training.context import Phases
from rl_core.training.episodes import EnvironmentRunner
from rl_core.training.rollouts import generate_and_score, rollout_batch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = [{"prompt": f"Add {a}+{b}.", "answer": str(a + b)} for a, b in ((47, 86), (12, 30), (99, 99))]


class Recording:
    """The real engine; every call's (prompt, output) pairs kept, to rebuild what the trainer must see, and when
    each streamed call started and ended."""

    def __init__(self, inner):
        self.inner, self.pairs, self.spans = inner, [], []

    def generate(self, prompts, sampling):
        out = self.inner.generate(prompts, sampling)
        self.pairs += [(list(prompts[r.prompt_index]), r) for r in out]
        return out

    async def stream(self, prompts, sampling):
        start = time.monotonic()
        async for r in self.inner.stream(prompts, sampling):
            self.pairs.append((list(prompts[r.prompt_index]), r))
            yield r
        self.spans.append((list(prompts[0]), start, time.monotonic()))

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def config(rl_registry, tiny_model_path, tmp_path_factory):
    return load_config(
        None,
        [
            f"run_dir={tmp_path_factory.mktemp('run')}",
            "cluster.device=cpu",
            "warmup_recipe=null",
            f"policy.model_name={tiny_model_path}",
            "policy.max_total_sequence_length=96",
            "policy.generation.backend=hf",
            "environment.name=calculator",
            "environment.max_turns=3",
            "environment.max_total_tokens=80",
            "environment.max_tokens_per_turn=12",
        ],
        rl_registry,
    )


def episode_context(config, engine, tokenizer, env, schedule="auto"):
    """A run context whose environment is ``env`` (episodes on ``schedule``), over the recorded ``engine``."""
    cfg = attrs.evolve(config.environment, schedule=schedule)
    runner = EnvironmentRunner(env, "calculator", cfg, ("</calc>", "</answer>"))
    return make_episode_context(config, Recording(engine), tokenizer, runner, "hf")


def rebuild(rollout, calls, tokenizer):
    """An episode rebuilt from the engine's own outputs: each model turn is what a call given exactly the episode's
    ids so far sampled, each observation the environment's answer to that turn tokenized on its own; the transcript
    is never re-tokenized. (The token budget never binds here; tests/rl_core/test_episode_budget.py pins it.)
    Returns (ids, sampled, logprobs) after the prompt."""
    n = len(rollout.prompt_token_ids)
    ids, sampled, logprobs = list(rollout.prompt_token_ids), [], []
    while len(ids) < n + len(rollout.token_ids):
        rest = tuple(rollout.token_ids[len(ids) - n :])
        out = next((o for p, o in calls if p == ids and rest[: len(o.token_ids)] == o.token_ids), None)
        assert out is not None, f"no engine call sampled the turn at token {len(ids) - n}"
        turn = list(out.token_ids)
        ids, sampled, logprobs = ids + turn, sampled + [True] * len(turn), logprobs + list(out.logprobs)
        answer = ScriptedCalculator().step(0, tokenizer.decode(turn))
        obs = tokenizer(answer.observation, add_special_tokens=False)["input_ids"]
        if len(ids) == n + len(rollout.token_ids):  # the last turn: max_turns reached, its observation not kept
            break
        ids, sampled, logprobs = ids + obs, sampled + [False] * len(obs), logprobs + [0.0] * len(obs)
    return ids, sampled, logprobs


@pytest.mark.parametrize("schedule", ["lockstep", "streaming"])
def test_episodes_are_token_exact_and_environment_tokens_get_no_loss(config, engine, tokenizer, schedule):
    ctx = episode_context(config, engine, tokenizer, ScriptedCalculator(), schedule)
    try:
        scored = generate_and_score(ctx, ROWS, SamplingParams(n=2, max_new_tokens=12, seed=5), Phases())
    finally:
        ctx.environment.close()
    if schedule == "streaming":
        assert not engine.concurrent_requests, "the HF engine's calls queue: auto would have picked lockstep"
        assert len(ctx.engine.spans) == len(ctx.engine.pairs), "streaming: one call per episode turn"
    batch = rollout_batch(scored.rollouts, tokenizer.pad_token_id, 96)
    for i, r in enumerate(scored.rollouts):
        ids, sampled, logprobs = rebuild(r, ctx.engine.pairs, tokenizer)
        assert list(r.prompt_token_ids) + list(r.token_ids) == ids, (
            "the trainer's ids are the sampled ids + observations"
        )
        assert list(r.sampled) == sampled and list(r.logprobs) == logprobs
        n, width = len(r.prompt_token_ids), len(ids)
        assert batch["input_ids"][i, :width].tolist() == ids
        assert batch["loss_mask"][i, :width].tolist() == [0.0] * n + [float(s) for s in sampled], (
            "no loss on the environment's tokens"
        )
        assert batch["generation_logprobs"][i, n:width].tolist() == pytest.approx(logprobs)
    assert any(not s for r in scored.rollouts for s in r.sampled), "some observation tokens were appended"
    assert all(t["ended"] != "budget" for t in scored.transcripts), "the budget is not what this test checks"
    turns = [t for transcript in scored.transcripts for t in transcript["turns"]]
    assert any(t["role"] == "environment" and t["text"] == " Try again:" for t in turns)


SLOW_S = 0.75


class SlowForOne(ScriptedCalculator):
    """The scripted calculator, SLOW_S seconds slower on the first row's episodes (a slow tool)."""

    def step(self, state, action):
        if state == 133:
            time.sleep(SLOW_S)
        return super().step(state, action)


def test_streaming_episodes_do_not_wait_for_a_slow_tool_and_are_reproducible(config, engine, tokenizer):
    runs = []
    for _ in range(2):
        ctx = episode_context(config, engine, tokenizer, SlowForOne(), "streaming")
        try:
            runs.append(generate_and_score(ctx, ROWS, SamplingParams(n=2, max_new_tokens=12, seed=11), Phases()))
        finally:
            ctx.environment.close()
    assert runs[0].rollouts == runs[1].rollouts, "same seed, same episodes, whatever order the turns finished in"
    prompts = [list(r.prompt_token_ids) for r in runs[1].rollouts[::2]]  # one per row; row 0 has the slow tool
    spans = ctx.engine.spans
    slow_answered = min(end for p, _start, end in spans if p == prompts[0]) + SLOW_S
    later_fast_turns = [start for p, start, _end in spans for q in prompts[1:] if p[: len(q)] == q and len(p) > len(q)]
    assert later_fast_turns, "the other rows' episodes took further turns"
    assert min(later_fast_turns) < slow_answered, "they did not wait for the slow tool's first answer"


class Faulty(Calculator):
    def step(self, state, action):
        if state % 2:
            raise ValueError("the tool crashed")
        time.sleep(5)
        return super().step(state, action)


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "ray-actor"])
def test_a_failing_or_hanging_environment_ends_the_episode_not_the_run(ray_session, config, workers):
    cfg = attrs.evolve(config.environment, step_timeout_s=1.0, num_workers=workers)
    env = Faulty() if not workers else Calculator()
    runner = EnvironmentRunner(env, "calculator", cfg, ())
    try:
        if workers:  # in an actor, the registry's calculator: a hang is a step that sleeps past the deadline
            runner.actors = [_slow_actor()]
            answers = runner.steps([(133, "<calc>1+1</calc>")])
            assert answers == ["timeout"]
            import ray

            ray.get(runner.actors[0].__ray_ready__.remote(), timeout=60)  # its start-up is not the step's to pay
            again = runner.steps([(133, "<answer>133</answer>")])[0]
            assert getattr(again, "reward", again) == 1.0, "the replaced actor works"
        else:
            answers = runner.steps([(1, "<calc>1+1</calc>"), (2, "<calc>1+1</calc>")])
            assert answers[0] == "error: ValueError: the tool crashed" and answers[1] == "timeout"
    finally:
        runner.close()


def _slow_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Slow:
        def step(self, state, action):
            time.sleep(30)

    return Slow.remote()


def test_the_built_in_environments_certify():
    from rl_core.data.prompts import calculator_task, guess_number_task
    from rl_core.rewards.environments import GuessNumber

    actions = ["<calc>12+30</calc>", "<answer>42</answer>", "50", "nothing"] * 2
    assert certify_environment(Calculator(cfg=CalculatorConfig()), calculator_task(8, 0), actions).passed
    assert certify_environment(GuessNumber(), guess_number_task(8, 0), actions).passed

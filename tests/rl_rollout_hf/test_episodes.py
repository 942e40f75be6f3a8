"""Multi-turn episodes for real (the Hugging Face engine, the calculator environment): the token ids the trainer
sees are exactly the ids the engine sampled plus the tokenized observations, environment tokens get no loss, and an
environment that raises or hangs ends its episode, not the run."""

import time

import attrs
import pytest

from rl_core.config import load_config
from rl_core.context import Phases
from rl_core.environments import Calculator, CalculatorConfig
from rl_core.episodes import EnvironmentRunner
from rl_core.protocols import SamplingParams, Transition
from rl_core.rollouts import generate_and_score, rollout_batch
from rl_core.testing.certify import certify_environment

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = [{"prompt": f"Add {a}+{b}.", "answer": str(a + b)} for a, b in ((47, 86), (12, 30), (99, 99))]


class Recording:
    """The real engine; every call's prompts and outputs kept, to rebuild what the trainer must see."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, sampling):
        out = self.inner.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], out))
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


class ScriptedCalculator(Calculator):
    """The calculator, but a model turn that is not a call still gets an observation: every episode runs its turns."""

    def step(self, state, action):
        answer = super().step(state, action)
        return answer if not answer.done else Transition(observation=" Try again:", state=state)


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
            "environment.max_total_tokens=48",
            "environment.max_tokens_per_turn=12",
        ],
        rl_registry,
    )


@pytest.fixture(scope="module")
def ctx(ray_session, config, tiny_model_path):
    from transformers import AutoTokenizer

    from rl_core.context import RunContext
    from rl_rollout_hf.engine import make_engine

    engine = make_engine(config, config.section("policy.generation.hf_cfg"))
    runner = EnvironmentRunner(ScriptedCalculator(), "calculator", config.environment, ("</calc>", "</answer>"))
    yield RunContext(
        config=config,
        registry=None,
        run_dir=None,
        console=None,
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_path),
        device="cpu",
        backend=None,
        engine=Recording(engine),
        engine_name="hf",
        rewards=[],
        checkpoints=None,
        loggers=[],
        environment=runner,
    )
    runner.close()
    engine.shutdown()


def test_episodes_are_token_exact_and_environment_tokens_get_no_loss(ctx):
    ctx.engine.calls.clear()
    scored = generate_and_score(ctx, ROWS, SamplingParams(n=2, max_new_tokens=12, seed=5), Phases())
    tok, budget = ctx.tokenizer, ctx.config.environment.max_total_tokens
    # rebuild every episode from the engine's own outputs: the prompt, each turn's sampled ids, the tokenized
    # observation; never re-tokenizing the transcript
    rebuilt = [
        {"ids": list(r.prompt_token_ids), "n": len(r.prompt_token_ids), "sampled": [], "logprobs": [], "open": True}
        for r in scored.rollouts
    ]
    for prompts, outputs in ctx.engine.calls:
        active = [e for e in rebuilt if e["open"]]
        assert [e["ids"] for e in active] == [list(p) for p in prompts], "each turn continues the episode's own ids"
        for e, out in zip(active, outputs, strict=True):
            room = budget - (len(e["ids"]) - e["n"])
            ids = list(out.token_ids[:room])
            e["ids"] += ids
            e["sampled"] += [True] * len(ids)
            e["logprobs"] += list(out.logprobs[:room])
            if len(out.token_ids) >= room:
                e["open"] = False
                continue
            answer = ScriptedCalculator().step(0, tok.decode(ids))
            obs = tok(answer.observation, add_special_tokens=False)["input_ids"]
            if len(e["ids"]) - e["n"] + len(obs) >= budget:
                e["open"] = False
                continue
            e["ids"] += obs
            e["sampled"] += [False] * len(obs)
            e["logprobs"] += [0.0] * len(obs)
    batch = rollout_batch(scored.rollouts, tok.pad_token_id, 96)
    for i, (r, e) in enumerate(zip(scored.rollouts, rebuilt, strict=True)):
        assert list(r.prompt_token_ids) + list(r.token_ids) == e["ids"], (
            "the trainer's ids are the sampled ids + observations"
        )
        assert list(r.sampled) == e["sampled"] and list(r.logprobs) == e["logprobs"]
        width = len(e["ids"])
        assert batch["input_ids"][i, :width].tolist() == e["ids"]
        assert batch["loss_mask"][i, :width].tolist() == [0.0] * e["n"] + [float(s) for s in e["sampled"]], (
            "no loss on the environment's tokens"
        )
        assert batch["generation_logprobs"][i, e["n"] : width].tolist() == pytest.approx(e["logprobs"])
    assert any(not s for e in rebuilt for s in e["sampled"]), "some observation tokens were appended"
    turns = [t for transcript in scored.transcripts for t in transcript["turns"]]
    assert any(t["role"] == "environment" and t["text"] == " Try again:" for t in turns)


class Faulty(Calculator):
    def step(self, state, action):
        if state % 2:
            raise ValueError("the tool crashed")
        time.sleep(5)
        return super().step(state, action)


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "ray-actor"])
def test_a_failing_or_hanging_environment_ends_the_episode_not_the_run(ctx, workers):
    cfg = attrs.evolve(ctx.config.environment, step_timeout_s=1.0, num_workers=workers)
    env = Faulty() if not workers else Calculator()
    runner = EnvironmentRunner(env, "calculator", cfg, ())
    try:
        if workers:  # in an actor, the registry's calculator: a hang is a step that sleeps past the deadline
            runner.actors = [_slow_actor()]
            answers = runner.steps([(133, "<calc>1+1</calc>")])
            assert answers == ["timeout"]
            assert runner.steps([(133, "<answer>133</answer>")])[0].reward == 1.0, "the replaced actor works"
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
    from rl_core.data import calculator_task, guess_number_task
    from rl_core.environments import GuessNumber

    actions = ["<calc>12+30</calc>", "<answer>42</answer>", "50", "nothing"] * 2
    assert certify_environment(Calculator(cfg=CalculatorConfig()), calculator_task(8, 0), actions).passed
    assert certify_environment(GuessNumber(), guess_number_task(8, 0), actions).passed

"""Agent programs as the environment, for real (the Hugging Face engine, the endpoint over HTTP, the ``openai``
client): the samples' token ids are the engine's sampled ids, the same as the core's environment gives on the same
seeds; a history-editing agent splits its episode, counted; a failing agent costs its episode only."""

import logging

import attrs
import httpx
import pytest
from episode_contexts import ScriptedCalculator
from scripted_agents import STREAMED

from rl_agents.config import AgentConfig
from rl_agents.host import AgentHost, load_entry
from rl_core.base.errors import ConfigError
from rl_core.config.loader import load_config
from rl_core.contracts.protocols import SamplingParams
from rl_core.rewards.environments import Calculator
from rl_core.testing.episodes import episode_context
from rl_core.training.context import Phases
from rl_core.training.episodes import EnvironmentRunner
from rl_core.training.rollouts import generate_and_score, rollout_batch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = [{"prompt": f"Add {a}+{b}.", "answer": str(a + b)} for a, b in ((47, 86), (12, 30), (99, 99))]
CHATML = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


class Recording:
    """The real engine; every call's (prompt, output) pairs kept."""

    def __init__(self, inner):
        self.inner, self.pairs = inner, []

    def generate(self, prompts, sampling):
        out = self.inner.generate(prompts, sampling)
        self.pairs += [(list(prompts[r.prompt_index]), r) for r in out]
        return out

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
            "environment.name=agent",
            "environment.entry=scripted_agents:scripted",
            "environment.max_turns=3",
            "environment.max_total_tokens=80",
            "environment.max_tokens_per_turn=12",
            "environment.schedule=lockstep",
        ],
        rl_registry,
    )


@pytest.fixture(scope="module")
def engine(ray_session, config):
    from rl_rollout_hf.engine import make_engine

    eng = make_engine(config, config.section("policy.generation.hf_cfg"))
    yield eng
    eng.shutdown()


def agent_run(config, engine, tokenizer, rows, params, **options):
    """``params.n`` episodes of each row by the agent ``options`` name, over the recorded engine."""
    env = attrs.evolve(config.environment, options=attrs.evolve(config.environment.options, **options))
    host = AgentHost(env.options)
    ctx = episode_context(attrs.evolve(config, environment=env), Recording(engine), tokenizer, host, "hf")
    try:
        return generate_and_score(ctx, rows, params, Phases()), ctx.engine
    finally:
        host.close()


def model_spans(rollout):
    """(ids before, ids sampled) for each run of the model's tokens in ``rollout``."""
    ids, n, flags = (
        list(rollout.prompt_token_ids) + list(rollout.token_ids),
        len(rollout.prompt_token_ids),
        rollout.sampled,
    )
    spans, i = [], 0
    while i < len(flags):
        j = i
        while j < len(flags) and flags[j]:
            j += 1
        if j > i:
            spans.append((ids[: n + i], ids[n + i : n + j]))
        i = max(j, i + 1)
    return spans


def assert_core_episodes(scored, config, engine, tokenizer, environment, params):
    """The agent's episodes ``scored`` are the core environment's on the same rows, seeds and schedule, token for
    token (the core keeps an observation after the last turn; the agent never sends it), rewards included."""
    runner = EnvironmentRunner(environment, "calculator", config.environment, ("</calc>", "</answer>"))
    core = episode_context(
        attrs.evolve(config, environment=attrs.evolve(config.environment, options=None)),
        engine,
        tokenizer,
        runner,
        "hf",
    )
    try:
        builtin = generate_and_score(core, ROWS, params, Phases())
    finally:
        runner.close()
    for ours, theirs in zip(scored.rollouts, builtin.rollouts, strict=True):
        n = len(ours.token_ids)
        assert ours.prompt_token_ids == theirs.prompt_token_ids and ours.token_ids == theirs.token_ids[:n]
        assert ours.sampled == theirs.sampled[:n] and ours.logprobs == theirs.logprobs[:n]
        assert not any(theirs.sampled[n:]), "all the model's tokens are in the agent's sample"
    assert scored.rewards == builtin.rewards


@pytest.mark.parametrize(
    ("agent", "environment"),
    [("scripted", ScriptedCalculator()), ("calculator", Calculator())],
    ids=["scripted", "real"],
)
def test_agent_episodes_are_the_engines_samples_and_the_core_environments_token_for_token(
    config, engine, tokenizer, agent, environment
):
    params = SamplingParams(n=2, max_new_tokens=12, seed=5)
    scored, recorded = agent_run(config, engine, tokenizer, ROWS, params, entry=f"scripted_agents:{agent}")
    for rollout in scored.rollouts:
        for before, sampled in model_spans(rollout):
            assert any(p == before and list(o.token_ids) == sampled for p, o in recorded.pairs), (
                "each run of model tokens is what one engine call sampled for exactly the ids before it"
            )
    assert_core_episodes(scored, config, engine, tokenizer, environment, params)
    if agent == "scripted":
        assert scored.metrics["env/turns"] == 3, "three turns (the fourth request refused, not counted)"
        assert scored.metrics["env/ended_max_turns"] == 1.0
        assert any(not s for r in scored.rollouts for s in r.sampled), "observations were appended"
    assert scored.metrics["agent/split_episodes"] == 0.0 and not scored.earlier


def test_streaming_agent_episodes_are_the_core_streaming_episodes(config, engine, tokenizer):
    """``environment.schedule: streaming`` (the default on engines that batch concurrent calls): each request its
    own engine call, seeded by (seed, turn, episode) as the core seeds a streaming episode's turns, so the agent's
    episodes are the core's token for token, whatever order the requests arrive in."""
    streaming = attrs.evolve(config, environment=attrs.evolve(config.environment, schedule="streaming"))
    params = SamplingParams(n=2, max_new_tokens=12, seed=7)
    scored, _ = agent_run(streaming, engine, tokenizer, ROWS, params, entry="scripted_agents:calculator")
    assert_core_episodes(scored, streaming, engine, tokenizer, Calculator(), params)
    assert not scored.earlier


def test_a_chat_agents_turns_join_through_the_template_streamed_or_not_and_an_editing_agent_splits(
    config, engine, tokenizer
):
    chat_tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    chat_tok.chat_template = CHATML
    params = SamplingParams(n=1, max_new_tokens=12, seed=3)
    chat, _ = agent_run(config, engine, chat_tok, ROWS[:2], params, entry="scripted_agents:chatty")
    assert chat.metrics["agent/split_episodes"] == 0.0 and not chat.earlier, "a chat's turns extend each other"
    for rollout, row in zip(chat.rollouts, ROWS, strict=False):
        assert chat_tok.decode(list(rollout.prompt_token_ids)) == f"<user>{row['prompt']}<|endoftext|><assistant>"
        assert "<user>ok?<|endoftext|><assistant>" in chat_tok.decode(list(rollout.token_ids))
        assert sum(rollout.sampled) > 0 and not all(rollout.sampled), "two model turns, the user's in between"
    streamed, _ = agent_run(config, engine, chat_tok, ROWS[:1], params, entry="scripted_agents:streamed")
    (first, second) = streamed.earlier[0][1], streamed.rollouts[0]  # a new chat: the episode split in two
    texts = [chat_tok.decode(list(r.token_ids), skip_special_tokens=True) for r in (first, second)]
    assert STREAMED[ROWS[0]["prompt"]] == "|".join(texts), "the streamed chunks carry what was sampled"
    edited, _ = agent_run(config, engine, tokenizer, ROWS, params, entry="scripted_agents:editing")
    assert edited.metrics["agent/split_episodes"] == 1.0 and edited.metrics["agent/samples_per_episode"] == 2.0
    assert [i for i, _ in edited.earlier] == [0, 1, 2], "each episode's first sample split off"
    rows, of = edited.rows()
    assert len(rows) == 6 and of == [0, 1, 2, 0, 1, 2], "trained with their episode's advantage"
    for (i, first), last in zip(edited.earlier, edited.rollouts, strict=True):
        assert tokenizer.decode(list(last.prompt_token_ids)).startswith(ROWS[i]["prompt"] + " (an edited history)")
        assert all(first.sampled) and all(last.sampled)
    assert edited.rewards == [0.5, 0.5, 0.5]
    batch = rollout_batch(rows, tokenizer.pad_token_id, 96)
    assert batch["loss_mask"].sum() == sum(len(r.token_ids) for r in rows)


def test_turns_after_a_sampled_end_of_text_still_extend_the_episode(config, tokenizer):
    """A completion that sampled a special token (the end of text) comes back to the agent without it; the agent's
    next prompts, built on that text, still reuse the episode's ids turn after turn (before, the third request
    matched nothing: the second call's prompt was decoded with the special token in it, and the episode split)."""
    from rl_agents.episode import AgentEpisode
    from rl_core.api import Call

    episode = AgentEpisode(number=0, key="k", prompt_index=0, sample_index=0, row={})
    eos = tokenizer.eos_token_id
    text, expected = "Add 1+2.", []
    for turn in range(3):
        ids = episode.ids(text, tokenizer)
        assert ids[: len(expected)] == expected, f"turn {turn}: the earlier ids reused"
        sampled = (*tokenizer(f" x{turn}", add_special_tokens=False)["input_ids"], eos)
        call = Call(prompt_ids=tuple(ids), token_ids=sampled, logprobs=(0.0,) * len(sampled), finish_reason="stop")
        episode.record(call, config.environment, tokenizer, text)
        expected = ids + list(sampled)
        text += tokenizer.decode(list(sampled), skip_special_tokens=True) + f" [tool {turn}]"


def test_two_batches_at_once_each_get_their_own_episodes(config, engine, tokenizer):
    """Async GRPO generates the next batch while the trainer validates: two batches through one endpoint at once
    give what each gives alone (no request is refused as another batch's, none crosses over)."""
    from concurrent.futures import ThreadPoolExecutor

    env = attrs.evolve(
        config.environment, options=attrs.evolve(config.environment.options, entry="scripted_agents:calculator")
    )
    host = AgentHost(env.options)
    ctx = episode_context(attrs.evolve(config, environment=env), engine, tokenizer, host, "hf")
    params = SamplingParams(n=2, max_new_tokens=12, seed=5)
    batches = [ROWS[:2], ROWS[2:]]
    try:
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda rows: generate_and_score(ctx, rows, params, Phases()), batches))
        alone = [generate_and_score(ctx, rows, params, Phases()) for rows in batches]
    finally:
        host.close()
    for both, one in zip(together, alone, strict=True):
        assert [t["ended"] for t in both.transcripts] == ["done"] * len(both.transcripts)
        assert both.rollouts == one.rollouts and both.rewards == one.rewards


def test_a_failing_hanging_or_talkative_agent_costs_its_episode_only(config, engine, tokenizer, caplog):
    rows = [{"prompt": f"Add {i}+1.", "kind": kind} for i, kind in enumerate(["raises", "hangs", "talks", "fine"])]
    params = SamplingParams(n=1, max_new_tokens=4, seed=1)
    with caplog.at_level(logging.WARNING, logger="rl_agents.host"):
        scored, _ = agent_run(
            config, engine, tokenizer, rows, params, entry="scripted_agents:faulty", time_limit_s=1.5, on_error="drop"
        )
    ended = [t["ended"] for t in scored.transcripts]
    assert ended == ["error: ValueError: the agent crashed", "timeout", "max_turns", "done"]
    assert scored.rewards == [0.0, 0.0, 0.0, 1.0]
    assert scored.keep == [False, False, True, True], "on_error: drop leaves the failed ones out of the loss"
    assert [len(r.token_ids) > 0 for r in scored.rollouts] == [True, False, True, True]
    lines = [r.getMessage() for r in caplog.records if r.name == "rl_agents.host"]
    assert len(lines) == 1 and "1 episode(s) overran environment.time_limit_s (1.5 s), 1 raised" in lines[0]
    blocking, _ = agent_run(
        config, engine, tokenizer, rows[1:], params, entry="scripted_agents:blocking", time_limit_s=1.5
    )
    assert [t["ended"] for t in blocking.transcripts] == ["timeout", "done", "done"]
    assert blocking.keep is None, "on_error: zero keeps them, with reward 0"


def test_the_endpoint_refuses_an_unknown_key_and_a_bad_entry_is_named(config):
    host = AgentHost(config.environment.options)
    try:
        url = host.start("policy")
        answer = httpx.post(f"{url}/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer nope"})
        assert answer.status_code == 401 and "each episode has its own" in answer.json()["error"]["message"]
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "policy"
    finally:
        host.close()
    for entry, words in [("nomodule", "is not 'module:function'"), ("no_such_module:run", "cannot load")]:
        with pytest.raises(ConfigError, match=f"environment.entry: .*{words}"):
            load_entry(entry)
    assert AgentConfig().on_error == "zero"


def test_the_calculator_agent_reads_a_call_as_the_core_calculator_does():
    """The agent recipe's episodes equal the environment's only if both calculators answer alike, leading zeros
    included (the model writes ``<calc>20+036</calc>``)."""
    from rl_agents.calculator_agent import evaluate
    from rl_core.rewards.environments import _evaluate

    for expression in ["47+86", "20+036", "007*3-04", "5", "12 * 3 + 4"]:
        assert evaluate(expression) == _evaluate(expression), expression

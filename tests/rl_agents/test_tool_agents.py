"""Agents as people write them, against the real endpoint over HTTP: each agent library (the ``openai`` client's
tools loops over Chat Completions and Responses, the OpenAI Agents SDK, LangGraph, pydantic-ai, the ``anthropic``
client) runs unmodified, with no parser or template of its own, over an engine scripted to write a tool call on
turn 1 and the answer on turn 2. Every episode reaches its answer, none splits, and every token the model sampled
is in the episode's sample exactly as the engine sampled it."""

import re

import attrs
import pytest
from test_agents import Recording, model_spans

from rl_agents.host import AgentHost
from rl_core.config.loader import load_config
from rl_core.contracts.protocols import Rollout, SamplingParams
from rl_core.testing.episodes import episode_context
from rl_core.training.context import Phases
from rl_core.training.rollouts import generate_and_score

ROWS = [{"prompt": f"Add {a}+{b}.", "answer": str(a + b)} for a, b in ((47, 86), (12, 30))]


class ToolWriter:
    """The model, scripted: asked with no tool result in the chat yet, it calls the calculator (JSON spaced as a
    model writes it, which libraries re-serialise their own way); after one, it answers with the result."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, prompts, params):
        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids)
            a, b = re.search(r"Add (\d+)\+(\d+)", text).groups()
            if "<|im_start|>tool" in text:
                reply = f"The sum is {int(a) + int(b)}."
            else:
                reply = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}+{b}"}}}}</tool_call>'
            tokens = [*self.tok(reply, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
            cut = tokens[: params.max_new_tokens]
            for j in range(params.n):
                out.append(
                    Rollout(
                        prompt_index=i,
                        sample_index=j,
                        prompt_token_ids=tuple(ids),
                        token_ids=tuple(cut),
                        text=self.tok.decode(cut),
                        logprobs=tuple(-0.01 * (k + 1) for k in range(len(cut))),
                        finish_reason="stop" if len(cut) == len(tokens) else "length",
                    )
                )
        return out


@pytest.fixture(scope="module")
def config(rl_registry, tiny_model_path, tmp_path_factory):
    return load_config(
        None,
        [
            f"run_dir={tmp_path_factory.mktemp('run')}",
            "cluster.device=cpu",
            "warmup_recipe=null",
            f"policy.model_name={tiny_model_path}",
            "policy.max_total_sequence_length=2048",
            "environment.name=agent",
            "environment.entry=library_agents:chat_tools",
            "environment.max_turns=4",
            "environment.max_total_tokens=1024",
            "environment.max_tokens_per_turn=200",
            "environment.schedule=lockstep",
            "environment.time_limit_s=60",
        ],
        rl_registry,
    )


def drive(config, tokenizer, entry, rows=ROWS, params=None, **options):
    """The episodes of ``entry`` over the scripted model, and the engine's recorded calls."""
    env = attrs.evolve(config.environment, options=attrs.evolve(config.environment.options, entry=entry, **options))
    host = AgentHost(env.options)
    ctx = episode_context(attrs.evolve(config, environment=env), Recording(ToolWriter(tokenizer)), tokenizer, host)
    try:
        return generate_and_score(ctx, rows, params or SamplingParams(n=2, max_new_tokens=200, seed=1), Phases()), ctx.engine
    finally:
        host.close()


LIBRARIES = [
    "chat_tools",
    "chat_tools_streamed",
    "responses_tools",
    "agents_sdk",
    "agents_sdk_responses",
    "langgraph",
    "pydantic_ai",
    "anthropic_messages",
]


@pytest.mark.parametrize("agent", LIBRARIES)
def test_an_unmodified_library_agent_calls_its_tool_and_its_episode_is_the_engines_tokens(config, tokenizer, agent):
    scored, recorded = drive(config, tokenizer, f"library_agents:{agent}")
    ended = [t["ended"] for t in scored.transcripts]
    assert ended == ["done"] * 4, ended
    assert scored.rewards == [1.0] * 4, "every episode got its tool's result back and answered with it"
    assert scored.metrics["env/turns"] == 2.0, "a call, then the answer"
    assert scored.metrics["agent/split_episodes"] == 0.0 and not scored.earlier, "no library's formatting split one"
    assert scored.metrics["agent/tool_parse_errors"] == 0.0
    for rollout in scored.rollouts:
        spans = model_spans(rollout)
        assert len(spans) == 2, "both model turns in the one sample"
        for before, sampled in spans:
            assert any(p == before and list(o.token_ids) == sampled for p, o in recorded.pairs), (
                "each run of model tokens is what one engine call sampled for exactly the ids before it"
            )
        text = tokenizer.decode(list(rollout.prompt_token_ids) + list(rollout.token_ids))
        assert "<|im_start|>tool\n" in text and '"name": "calculator"' in text, "the call as sampled, then its result"

"""Agents as people write them, against the real endpoint over HTTP: each agent library (the ``openai`` client's
tools loops over Chat Completions and Responses, the OpenAI Agents SDK, LangGraph, pydantic-ai, the ``anthropic``
client) runs unmodified, with no parser or template of its own, over an engine scripted to write a tool call on
turn 1 and the answer on turn 2. Every episode reaches its answer, none splits, and every token the model sampled
is in the episode's sample exactly as the engine sampled it."""

import pytest
from test_agents import model_spans
from tool_writer import drive

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
def test_an_unmodified_library_agent_calls_its_tool_and_its_episode_is_the_engines_tokens(
    tool_config, tokenizer, agent
):
    scored, recorded = drive(tool_config, tokenizer, f"library_agents:{agent}")
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

"""Every request field is answered honestly: used, refused with a 400 that names it, or (sampling the run owns)
ignored; a reply's length, logprobs and usage are the engine's; a template's error is a 400, not a 500. The tool
call formats are read by transformers' response parsing, and what does not parse comes back as text, counted."""

import attrs
import pytest
from scripted_agents import ANSWERS
from tool_writer import ROWS, drive

from rl_agents.toolcalls import ToolParser
from rl_core.contracts.protocols import SamplingParams

USER = [{"role": "user", "content": ROWS[0]["prompt"]}]
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
CHAT = "/chat/completions"
TABLE = {
    "n null": (CHAT, {"model": "policy", "messages": USER, "n": None}),
    "max_tokens": (CHAT, {"model": "policy", "messages": USER, "max_tokens": 5}),
    "logprobs": (CHAT, {"model": "policy", "messages": USER, "logprobs": True}),
    "top_logprobs": (CHAT, {"model": "policy", "messages": USER, "logprobs": True, "top_logprobs": 2}),
    "required": (CHAT, {"model": "policy", "messages": USER, "tools": TOOLS, "tool_choice": "required"}),
    "named": (
        CHAT,
        {"model": "policy", "messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "calculator"}}},
    ),
    "parallel off": (CHAT, {"model": "policy", "messages": USER, "tools": TOOLS, "parallel_tool_calls": False}),
    "tool_choice none": (CHAT, {"model": "policy", "messages": USER, "tools": TOOLS, "tool_choice": "none"}),
    "json": (CHAT, {"model": "policy", "messages": USER, "response_format": {"type": "json_object"}}),
    "unknown": (CHAT, {"model": "policy", "messages": USER, "best_of": 3}),
    "temperature": (CHAT, {"model": "policy", "messages": USER, "temperature": 0.3}),
    "parts": (CHAT, {"model": "policy", "messages": [{"role": "user", "content": [{"type": "text", "text": "Add 47+86."}]}]}),
    "image": (CHAT, {"model": "policy", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
    "bad arguments": (
        CHAT,
        {"model": "policy", "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}}]}]},
    ),
    "completion logprobs": ("/completions", {"model": "policy", "prompt": "Add 47+86.", "logprobs": 0, "max_tokens": 3}),
    "echo": ("/completions", {"model": "policy", "prompt": "Add 47+86.", "echo": True}),
    "messages without max_tokens": ("/messages", {"model": "policy", "messages": USER}),
    "previous response": ("/responses", {"model": "policy", "input": "Add 47+86.", "previous_response_id": "resp_1"}),
    "responses max": ("/responses", {"model": "policy", "input": "Add 47+86.", "max_output_tokens": 4}),
}  # fmt: skip
REFUSED = {
    "top_logprobs": "top_logprobs",
    "required": "tool_choice",
    "named": "tool_choice",
    "parallel off": "parallel_tool_calls",
    "json": "response_format",
    "unknown": "'best_of'",
    "image": "messages[0]",
    "bad arguments": "messages[1].tool_calls",
    "echo": "echo",
    "messages without max_tokens": "max_tokens",
    "previous response": "'previous_response_id'",
}


@pytest.fixture(scope="module")
def answers(tool_config, tokenizer):
    config = attrs.evolve(tool_config, environment=attrs.evolve(tool_config.environment, max_turns=50))
    rows = [{**ROWS[0], "table": TABLE}]
    drive(config, tokenizer, "scripted_agents:asks", rows, SamplingParams(n=1, max_new_tokens=200, seed=3))
    return dict(ANSWERS)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_field_the_engine_cannot_honour_is_a_400_naming_it(answers, name):
    status, body = answers[name]
    assert status == 400 and REFUSED[name] in body["error"]["message"], body


def test_the_fields_served_are_the_engines_answers(answers, tokenizer):
    for name in set(TABLE) - set(REFUSED):
        assert answers[name][0] == 200, (name, answers[name])
    assert len(answers["n null"][1]["choices"]) == 1, "n: null means 1"
    cut = answers["max_tokens"][1]
    assert cut["usage"]["completion_tokens"] == 5 and cut["choices"][0]["finish_reason"] == "length"
    assert answers["responses max"][1]["usage"]["output_tokens"] == 4
    assert answers["responses max"][1]["status"] == "incomplete"
    content = answers["logprobs"][1]["choices"][0]["logprobs"]["content"]
    assert [round(c["logprob"], 6) for c in content] == [round(-0.01 * (k + 1), 6) for k in range(len(content))]
    assert len(content) == answers["logprobs"][1]["usage"]["completion_tokens"], "one logprob per sampled token"
    legacy = answers["completion logprobs"][1]["choices"][0]["logprobs"]
    assert legacy["token_logprobs"] == pytest.approx([-0.01, -0.02, -0.03]) and len(legacy["tokens"]) == 3
    offered = answers["tool_choice none"][1]["choices"][0]
    assert offered["finish_reason"] == "stop" and "tool_calls" not in offered["message"], "no tools: text"
    called = answers["parts"][1]["choices"][0]
    assert called["finish_reason"] == "stop", "no tools offered, so a written call is text"


def test_a_template_that_cannot_render_a_request_is_a_400_naming_the_error(tool_config, tokenizer, tmp_path):
    template = tmp_path / "strict.jinja"
    template.write_text("{% for m in messages %}{{ raise_exception('no ' + m.role + ' turns here') }}{% endfor %}")
    ANSWERS.clear()
    drive(tool_config, tokenizer, "scripted_agents:asks", [{**ROWS[0], "table": {"chat": (CHAT, {"messages": USER})}}],
          SamplingParams(n=1, max_new_tokens=8, seed=3), chat_template=str(template))  # fmt: skip
    status, body = ANSWERS["chat"]
    assert status == 400 and "no user turns here" in body["error"]["message"]


@pytest.mark.parametrize(
    ("fmt", "text", "calls"),
    [
        ("hermes", 'Let me.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', [("f", {"x": 1})]),
        ("hermes", '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {"y": "2"}}</tool_call>', [("f", {}), ("g", {"y": "2"})]),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', [("f", {"x": 1})]),
        ("llama3_json", '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}', [("f", {"x": 1}), ("g", {})]),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', [("f", {"x": 1})]),
        ("hermes", "The answer is 4.", []),
    ],
)  # fmt: skip
def test_each_format_is_read_into_calls_with_json_arguments(tokenizer, fmt, text, calls):
    import json

    parsed = ToolParser(fmt, tokenizer, None).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls and not parsed.failed
    assert len({c.id for c in parsed.calls}) == len(calls), "an id per call"
    if not calls:
        assert parsed.content == text


def test_a_call_that_does_not_parse_is_text_and_counted(tokenizer):
    parsed = ToolParser("hermes", tokenizer, None).parse('<tool_call>{"name": "f", "arguments": {oops}</tool_call>')
    assert parsed.failed and not parsed.calls and parsed.content.startswith("<tool_call>")


def test_auto_reads_the_format_from_the_chat_template(tokenizer):
    from rl_agents.templates import CHATML_TOOLS

    assert ToolParser("auto", tokenizer, CHATML_TOOLS).format == "hermes"
    assert ToolParser("auto", tokenizer, "{{ '[TOOL_CALLS]' }}").format == "mistral"
    assert ToolParser("auto", tokenizer, "{{ '<|python_tag|>' }}").format == "llama3_json"
    assert ToolParser("auto", tokenizer, "{{ messages }}").format is None

"""Anthropic's Messages API (``/v1/messages``): ``system``, content blocks (text, ``tool_use``, ``tool_result``)
read as chat messages; the reply's content a text block and a ``tool_use`` block per call, its ``stop_reason``
and usage; streamed as the API's events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from rl_agents.answers import Answer
from rl_agents.requests import (
    Asked,
    BadRequest,
    check_fields,
    function_tool,
    positive,
    stops,
    text_of,
    tool_call,
    tool_choice,
)

FIELDS = ("model", "messages", "system", "max_tokens", "stop_sequences", "stream", "tools", "tool_choice")
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def read(body: Mapping[str, Any]) -> Asked:
    check_fields(body, FIELDS, "messages")
    if body.get("max_tokens") is None:
        raise BadRequest("max_tokens: required by the Messages API")
    offered = tool_choice(body.get("tool_choice"))
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": text_of(body["system"], "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: a non-empty list")
    for i, m in enumerate(raw):
        _message(messages, m, f"messages[{i}]")
    tools = [
        function_tool(t.get("name"), t.get("description"), t.get("input_schema"), f"tools[{i}]")
        for i, t in enumerate(body.get("tools") or [])
    ]
    return Asked(
        messages=messages,
        tools=tools if tools and offered else None,
        max_tokens=positive(body, "max_tokens", None),
        stop=stops(body.get("stop_sequences")),
        stream=bool(body.get("stream")),
    )


def _message(messages: list[dict[str, Any]], m: Any, where: str) -> None:
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise BadRequest(f"{where}: a message's role is user or assistant")
    blocks = m.get("content")
    if isinstance(blocks, str):
        messages.append({"role": m["role"], "content": blocks})
        return
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}: content is text or a list of blocks")
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content[{k}]"
        if kind == "text":
            texts.append(block)
        elif kind == "tool_use" and m["role"] == "assistant":
            calls.append(tool_call(block.get("id", ""), block.get("name", ""), block.get("input") or {}, at))
        elif kind == "tool_result" and m["role"] == "user":
            content = block.get("content")
            text = content if isinstance(content, str) else text_of(content, at)
            messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": text})
        else:
            raise BadRequest(f"{at}: a block of type {kind!r} in a {m['role']} message is not served")
    if texts or calls or not blocks:
        message: dict[str, Any] = {"role": m["role"], "content": text_of(texts, where)}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)


def reply(model: str, answer: Answer, usage: tuple[int, int], stop: tuple[str, ...]) -> dict[str, Any]:
    """The Message object (validated by the ``anthropic`` type where that package is installed)."""
    content: list[dict[str, Any]] = []
    if answer.content or not answer.calls:
        content.append({"type": "text", "text": answer.content})
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)} for c in answer.calls
    ]
    hit = next((s for s in stop if answer.content.endswith(s)), None) if answer.finish == "stop" else None
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "stop_sequence" if hit else STOP[answer.finish],
        "stop_sequence": hit,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def events(done: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Message as the API's stream: start, each block (its text or input JSON), the stop reason, stop."""
    usage = done["usage"]
    start = {**done, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}  # fmt: skip
    yield {"type": "message_start", "message": start}
    for index, block in enumerate(done["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    stop = {"stop_reason": done["stop_reason"], "stop_sequence": done["stop_sequence"]}
    yield {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage["output_tokens"]}}
    yield {"type": "message_stop"}

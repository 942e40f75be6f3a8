"""OpenAI's Responses API (``/v1/responses``): ``input`` items (messages, ``function_call``,
``function_call_output``) and ``instructions`` read as chat messages; the reply's ``output`` holds a message item
and a ``function_call`` item per call; streamed as the API's typed events."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from rl_agents.answers import Answer
from rl_agents.requests import (
    Asked,
    BadRequest,
    check_fields,
    function_tool,
    parallel_calls,
    positive,
    text_of,
    tool_call,
    tool_choice,
)

FIELDS = (
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "stream",
    "text", "include",
)  # fmt: skip


def read(body: Mapping[str, Any]) -> Asked:
    check_fields(body, FIELDS, "responses")
    offered = tool_choice(body.get("tool_choice"))
    parallel_calls(body.get("parallel_tool_calls"))
    fmt = (body.get("text") or {}).get("format")
    if fmt not in (None, {"type": "text"}):
        raise BadRequest("text.format: the run's engine samples freely (no guided decoding): leave it unset")
    if body.get("include"):
        raise BadRequest(f"include: {body['include']!r} is not served by the run's endpoint")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        for i, item in enumerate(raw):
            _item(messages, item, f"input[{i}]")
    else:
        raise BadRequest("input: a string or a non-empty list of items")
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(body.get("tools") or [])]
    return Asked(
        messages=messages,
        tools=tools if tools and offered else None,
        max_tokens=positive(body, "max_output_tokens", None),
        stream=bool(body.get("stream")),
    )


def _item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """Append ``item`` as chat messages: a function call joins the assistant message before it."""
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: an input item is an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = {"developer": "system"}.get(item.get("role", ""), item.get("role"))
        if role not in ("system", "user", "assistant"):
            raise BadRequest(f"{where}: a message's role is system, developer, user or assistant")
        messages.append({"role": role, "content": text_of(item.get("content"), where)})
    elif kind == "function_call":
        call = tool_call(item.get("call_id", ""), item.get("name", ""), item.get("arguments"), where)
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})
        messages[-1].setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else text_of(output, where)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": text})
    else:
        raise BadRequest(f"{where}: an item of type {kind!r} is not served (messages and function calls are)")


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") != "function":
        raise BadRequest(f"{where}: only function tools ({{'type': 'function', 'name': ...}})")
    return function_tool(t.get("name"), t.get("description"), t.get("parameters"), where)


def reply(model: str, answer: Answer, usage: tuple[int, int], body: Mapping[str, Any]) -> dict[str, Any]:
    """The Response object (validated by the ``openai`` type)."""
    from openai.types.responses import Response

    output: list[dict[str, Any]] = []
    if answer.content or not answer.calls:
        text = {"type": "output_text", "text": answer.content, "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": _id("msg"), "status": "completed", "role": "assistant", "content": [text]}
        )
    output += [
        {"type": "function_call", "id": _id("fc"), "call_id": c.id, "name": c.name, "arguments": c.arguments,
         "status": "completed"}
        for c in answer.calls
    ]  # fmt: skip
    cut = answer.finish == "length"
    response = Response.model_validate(
        {
            "id": _id("resp"),
            "object": "response",
            "created_at": time.time(),
            "model": model,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "instructions": body.get("instructions"),
            "usage": {
                "input_tokens": usage[0],
                "output_tokens": usage[1],
                "total_tokens": sum(usage),
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    )
    return response.model_dump(exclude_none=True)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def events(done: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Response as the API's stream: created, each output item added, its text or arguments, done, completed."""
    number = iter(range(1 << 30))
    pending = {**done, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "sequence_number": next(number), "response": pending}
    for index, item in enumerate(done["output"]):
        common = {"output_index": index, "item_id": item["id"]}
        empty = {**item, "status": "in_progress"}
        if item["type"] == "message":
            empty["content"] = []
        else:
            empty["arguments"] = ""
        yield {"type": "response.output_item.added", "sequence_number": next(number), "output_index": index,
               "item": empty}  # fmt: skip
        if item["type"] == "message":
            part = item["content"][0]
            at = {**common, "content_index": 0}
            yield {"type": "response.content_part.added", "sequence_number": next(number), **at,
                   "part": {**part, "text": ""}}  # fmt: skip
            yield {"type": "response.output_text.delta", "sequence_number": next(number), **at,
                   "delta": part["text"], "logprobs": []}  # fmt: skip
            yield {"type": "response.output_text.done", "sequence_number": next(number), **at,
                   "text": part["text"], "logprobs": []}  # fmt: skip
            yield {"type": "response.content_part.done", "sequence_number": next(number), **at, "part": part}
        else:
            yield {"type": "response.function_call_arguments.delta", "sequence_number": next(number), **common,
                   "delta": item["arguments"]}  # fmt: skip
            yield {"type": "response.function_call_arguments.done", "sequence_number": next(number), **common,
                   "name": item["name"], "arguments": item["arguments"]}  # fmt: skip
        yield {"type": "response.output_item.done", "sequence_number": next(number), "output_index": index,
               "item": item}  # fmt: skip
    kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
    yield {"type": kind, "sequence_number": next(number), "response": done}

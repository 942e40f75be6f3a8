"""OpenAI's Chat Completions API (``/v1/chat/completions``): the request read, the reply built with the ``openai``
types, and its server-sent events (a role chunk, the content, each tool call, the finish, the usage when asked)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall, Function
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from rl_agents.answers import Answer
from rl_agents.requests import (
    Asked,
    BadRequest,
    check_fields,
    function_tool,
    no_structured_output,
    parallel_calls,
    positive,
    stops,
    text_of,
    tool_call,
    tool_choice,
)

FIELDS = (
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens", "stop",
    "n", "stream", "stream_options", "logprobs", "top_logprobs", "response_format",
)  # fmt: skip
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def read(body: Mapping[str, Any]) -> Asked:
    check_fields(body, FIELDS, "chat.completions")
    offered = tool_choice(body.get("tool_choice"))
    parallel_calls(body.get("parallel_tool_calls"))
    no_structured_output(body)
    if body.get("top_logprobs"):
        raise BadRequest("top_logprobs: the engine returns the sampled tokens' logprobs only: leave it unset or 0")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: a non-empty list of chat messages")
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(body.get("tools") or [])]
    return Asked(
        messages=[_message(m, f"messages[{i}]") for i, m in enumerate(raw)],
        tools=tools if tools and offered else None,
        max_tokens=positive(body, "max_completion_tokens", None) or positive(body, "max_tokens", None),
        stop=stops(body.get("stop")),
        n=positive(body, "n", 1) or 1,
        logprobs=bool(body.get("logprobs")),
        stream=bool(body.get("stream")),
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
    )


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise BadRequest(f"{where}: a message needs a role ({', '.join(ROLES)})")
    out: dict[str, Any] = {"role": ROLES[m["role"]], "content": text_of(m.get("content"), where)}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            tool_call(c.get("id", ""), c["function"]["name"], c["function"].get("arguments"), f"{where}.tool_calls")
            for c in m["tool_calls"]
        ]
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id", "")
    if m.get("name"):
        out["name"] = m["name"]
    return out


def _tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise BadRequest(f"{where}: only function tools ({{'type': 'function', 'function': {{...}}}})")
    fn = t["function"]
    return function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), where)


def reply(model: str, answers: list[Answer], usage: tuple[int, int], logprobs: bool) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=i,
                message=ChatCompletionMessage(
                    role="assistant",
                    content=a.content if a.content or not a.calls else None,
                    tool_calls=[
                        ChatCompletionMessageFunctionToolCall(
                            id=c.id, type="function", function=Function(name=c.name, arguments=c.arguments)
                        )
                        for c in a.calls
                    ]
                    or None,
                ),
                finish_reason=a.finish,  # type: ignore[arg-type]
                logprobs=ChoiceLogprobs(content=_logprobs(a)) if logprobs else None,
            )
            for i, a in enumerate(answers)
        ],
        usage=CompletionUsage(prompt_tokens=usage[0], completion_tokens=usage[1], total_tokens=sum(usage)),
    )


def _logprobs(a: Answer) -> list[ChatCompletionTokenLogprob]:
    return [
        ChatCompletionTokenLogprob(token=t, logprob=lp, bytes=list(t.encode()), top_logprobs=[])
        for t, lp in zip(a.tokens, a.call.logprobs, strict=True)
    ]


def events(done: ChatCompletion, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The reply as chunks: per choice its role, its content, each tool call (name and arguments), its finish;
    then, asked for, the usage in a chunk of no choices."""

    def of(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> dict[str, Any]:
        return ChatCompletionChunk(
            id=done.id, object="chat.completion.chunk", created=done.created, model=done.model, choices=choices,
            usage=usage,
        ).model_dump(exclude_none=True)  # fmt: skip

    def chunk(index: int, delta: ChoiceDelta, finish: Any = None, logprobs: Any = None) -> dict[str, Any]:
        lp = logprobs.model_dump() if logprobs is not None else None
        return of(
            [ChunkChoice.model_validate({"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp})]
        )

    for c in done.choices:
        yield chunk(c.index, ChoiceDelta(role="assistant", content=""))
        if c.message.content:
            yield chunk(c.index, ChoiceDelta(content=c.message.content), logprobs=c.logprobs)
        for k, call in enumerate(c.message.tool_calls or []):
            assert isinstance(call, ChatCompletionMessageFunctionToolCall)
            fn = ChoiceDeltaToolCallFunction(name=call.function.name, arguments=call.function.arguments)
            yield chunk(
                c.index,
                ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(index=k, id=call.id, type="function", function=fn)]),
            )
        yield chunk(c.index, ChoiceDelta(), finish=c.finish_reason)
    if include_usage and done.usage is not None:
        yield of([], done.usage)

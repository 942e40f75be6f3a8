"""The three chat APIs' requests read into one record: chat messages as a template renders them (content as text,
a tool call's arguments as an object), the tools in the chat format, and the request's own settings. Every field is
answered: used, ignored with one log line per run (sampling the run owns), or refused with a 400 naming it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

log = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request the endpoint refuses (HTTP 400), its message naming the field."""


@attrs.frozen(kw_only=True)
class Asked:
    """One request to a chat API, as the endpoint serves it."""

    messages: list[dict[str, Any]]
    #: chat-format tools (``{"type": "function", "function": {...}}``), None when none are offered
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    #: the sampled tokens' logprobs in the reply
    logprobs: bool = False
    stream: bool = False
    #: a streamed chat reply ends with a usage chunk
    include_usage: bool = False


#: fields that tune sampling, which the run owns (``policy.generation``): ignored, said once per run
SAMPLING = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "truncation",
        "reasoning_effort",
        "verbosity",
        "modalities",
    }
)
_said: set[str] = set()


def check_fields(body: Mapping[str, Any], used: Iterable[str], api: str) -> None:
    """Refuse a field the endpoint does not serve (naming it); say once per run that a sampling field is ignored."""
    used = set(used)
    for key in body:
        if key in used:
            continue
        if key not in SAMPLING:
            raise BadRequest(f"{api}: the field {key!r} is not supported by the run's endpoint")
        if key not in _said and body[key] is not None:
            _said.add(key)
            log.info("agent endpoint: %r is ignored: the run's sampling is policy.generation's", key)


def positive(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{key} must be a positive integer, not {value!r}")
    return value


def stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(str(s) for s in value)


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, None (a message of tool calls alone), or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "input_text", "output_text"):
                raise BadRequest(f"{where}: a content part of type {kind!r} (the endpoint takes text parts only)")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise BadRequest(f"{where}: content must be text, null or a list of text parts")


def arguments(value: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments as an object, as a template renders them (an API sends them as JSON text)."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except (TypeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"{where}: arguments are not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise BadRequest(f"{where}: arguments must be a JSON object")
    return parsed


def tool_call(call_id: str, name: str, args: Any, where: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments(args, where)}}


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}: a tool needs a name")
    fn: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    if description:
        fn["description"] = description
    return {"type": "function", "function": fn}


def tool_choice(value: Any, field: str = "tool_choice") -> bool:
    """Whether tools are offered under ``value``: ``auto`` (or unset) yes, ``none`` no; the engine cannot force a
    call, so ``required`` and a named function are refused."""
    kind = value.get("type") if isinstance(value, dict) else value
    if kind in (None, "auto"):
        return True
    if kind == "none":
        return False
    raise BadRequest(
        f"{field}: {value!r} would force a tool call, and the run's engine samples freely (no guided decoding): "
        "use 'auto' or 'none'"
    )


def no_structured_output(body: Mapping[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise BadRequest(
            "response_format: the run's engine samples freely (no guided decoding), so a JSON or schema format "
            "cannot be enforced: leave it unset and parse the reply"
        )


def parallel_calls(value: Any) -> None:
    if value is False:
        raise BadRequest(
            "parallel_tool_calls: false cannot be enforced (the model may write several calls): leave it unset"
        )

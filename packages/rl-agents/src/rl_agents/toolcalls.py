"""Tool calls read out of what the model wrote, through transformers' declarative response parsing
(``transformers.utils.chat_parsing``): each format is a response template (data), not parsing code of ours. The
tokenizer's own ``response_template`` wins where it has one; otherwise ``environment.tool_parser`` names a format,
``auto`` choosing it from the chat template's text."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

import attrs

log = logging.getLogger(__name__)

#: never found in a prefix: every template parses the completion alone
_NO_ANCHOR = "\x00"

#: the formats the main model families write, as transformers response templates
FORMATS: dict[str, dict[str, Any]] = {
    # Hermes, Qwen2/2.5/3, our chatml-tools: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeated
    "hermes": {
        "start_anchor": _NO_ANCHOR,
        "fields": {
            "tool_calls": {
                "open_pattern": r"\s*<tool_call>",
                "close": "</tool_call>",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"content": "text"},
        },
    },
    # Llama 3.1-3.3: a JSON object {"name": ..., "parameters": {...}} (after <|python_tag|> or alone), ';' between
    "llama3_json": {
        "start_anchor": _NO_ANCHOR,
        "fields": {
            "tool_calls": {
                "open_pattern": r"\s*(?:<\|python_tag\|>)?\s*(?=\{)",
                "close_pattern": r"(?<=\})\s*(?:;|$)",
                "repeats": True,
                "content": "json",
                "transform": {
                    "type": "function",
                    "function": {"name": "{content.name}", "arguments": "{content.parameters}"},
                },
            },
            "content": {"content": "text"},
        },
    },
    # Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    "mistral": {
        "start_anchor": _NO_ANCHOR,
        "fields": {
            "tool_calls": {
                "open": "[TOOL_CALLS]",
                "content": "json",
                "transform_each": True,
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
            },
            "content": {"content": "text"},
        },
    },
}

#: how ``auto`` recognises a format in a chat template's text, first match wins
_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"))


@attrs.frozen
class ToolCall:
    """One call the model wrote: the id the endpoint issued for it, the function, its arguments as JSON text."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class Parsed:
    """A completion read: its text besides the calls, the calls, and whether it looked like a call but did not
    parse (then ``content`` is the whole text and ``calls`` is empty)."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    failed: bool = False


class ToolParser:
    """Reads the tool calls of one model's completions (``format`` None: none are read)."""

    def __init__(self, setting: str, tokenizer: Any, chat_template: str | None) -> None:
        own = getattr(tokenizer, "response_template", None)
        self.format: str | None
        if own is not None and setting == "auto":
            self.format, self.template = "the tokenizer's response_template", own
            return
        name = setting
        if setting == "auto":
            text = chat_template or ""
            name = next((fmt for marker, fmt in _MARKERS if marker in text), "none")
        self.format = None if name == "none" else name
        self.template = FORMATS[name] if self.format else None

    def parse(self, text: str) -> Parsed:
        """``text`` (a completion, special tokens included) read for tool calls."""
        if self.template is None:
            return Parsed(text)
        from transformers.utils.chat_parsing import parse_response

        try:
            message = parse_response(text, self.template, prefix="")
            calls = tuple(_call(c) for c in message.get("tool_calls") or ())
        except (ValueError, KeyError, TypeError) as exc:
            log.debug("tool call not parsed (%s): %s", self.format, exc)
            return Parsed(text, failed=True)
        if not calls:
            return Parsed(text)
        return Parsed(str(message.get("content") or ""), calls)


def _call(value: dict[str, Any]) -> ToolCall:
    function = value["function"]
    name, arguments = function["name"], function.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call without a function name: {value!r}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=f"call_{secrets.token_hex(12)}", name=name, arguments=arguments)

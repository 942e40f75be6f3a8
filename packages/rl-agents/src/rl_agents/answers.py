"""What the endpoint answers a chat request with, whatever the API: per choice the completion read for tool calls,
why it ended, and the sampled tokens with their logprobs."""

from __future__ import annotations

from typing import Any

import attrs

from rl_agents.toolcalls import Parsed, ToolCall
from rl_core.api import Call


@attrs.frozen
class Answer:
    """One choice: its text besides the calls, the calls, and the engine's call it came from."""

    content: str
    calls: tuple[ToolCall, ...]
    call: Call
    #: each sampled token as text, where the request asked for logprobs
    tokens: tuple[str, ...] = ()

    @property
    def finish(self) -> str:
        """``tool_calls`` when it called, else the engine's ``stop`` or ``length``."""
        return "tool_calls" if self.calls else self.call.finish_reason


def token_texts(tokenizer: Any, ids: tuple[int, ...]) -> list[str]:
    """Each token of ``ids`` as text, as the APIs' logprobs name them."""
    return [tokenizer.decode([t]) for t in ids]


def answer(parsed: Parsed, call: Call, tokenizer: Any, logprobs: bool) -> Answer:
    tokens = tuple(token_texts(tokenizer, call.token_ids)) if logprobs else ()
    return Answer(content=parsed.content, calls=parsed.calls, call=call, tokens=tokens)

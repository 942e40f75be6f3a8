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
    #: each sampled token as text, for logprobs
    tokens: tuple[str, ...]

    @property
    def finish(self) -> str:
        """``tool_calls`` when it called, else the engine's ``stop`` or ``length``."""
        return "tool_calls" if self.calls else self.call.finish_reason


def answer(parsed: Parsed, call: Call, tokenizer: Any) -> Answer:
    tokens = tuple(tokenizer.decode([t]) for t in call.token_ids)
    return Answer(content=parsed.content, calls=parsed.calls, call=call, tokens=tokens)


def usage(prompt_tokens: int, answers: list[Answer]) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of a request."""
    return prompt_tokens, sum(len(a.call.token_ids) for a in answers)

"""One agent episode as the endpoint sees it: its requests turned into token ids without re-tokenizing what the
model sampled, its limits, and the calls it made."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from rl_core.api import Call, EnvironmentConfig


class Refused(Exception):
    """A request past the episode's limits; ``reason`` ends the episode (``max_turns``, ``budget``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@attrs.frozen
class Reply:
    """An assistant message the endpoint answered with: known again by its tool calls' ids, or by its text."""

    call: Call
    #: the chat prompt it answered, as rendered
    prompt_text: str
    content: str
    call_ids: frozenset[str]

    def made(self, message: dict[str, Any]) -> bool:
        """Whether ``message`` (an assistant message sent back) is this reply, however the agent reformatted it."""
        ids = frozenset(c.get("id", "") for c in message.get("tool_calls") or ())
        if ids or self.call_ids:
            return ids == self.call_ids
        return str(message.get("content") or "").strip() == self.content.strip()


#: stands in for an assistant message the endpoint made, where a chat is rendered to find its place
_SENTINEL = "\x00reply{}\x00"


@attrs.define(eq=False)
class AgentEpisode:
    """An episode under way: the calls it made, and the texts the agent may send back, each with its exact ids."""

    number: int
    key: str
    prompt_index: int
    sample_index: int
    row: dict[str, Any]
    calls: list[Call] = attrs.Factory(list)
    #: (text, ids): each call's prompt as the agent sent it (a chat: as rendered) + its completion as the agent got
    #: it back (or with its special tokens, as a chat template writes them again), and the ids the engine saw and
    #: sampled; a later prompt that starts with the text reuses the ids
    prefixes: list[tuple[str, list[int]]] = attrs.Factory(list)
    #: the assistant messages the endpoint answered with, in a chat
    replies: list[Reply] = attrs.Factory(list)
    #: the first prompt's length, where the token budget starts
    first_prompt: int | None = None
    #: requests admitted so far (the turn of the next one)
    requests: int = 0
    #: requests waiting for the engine, since when (``time.monotonic``), and the seconds waited before
    waiting: int = 0
    wait_since: float = 0.0
    waited: float = 0.0
    #: None while under way; then ``done``, ``max_turns``, ``budget``, ``timeout`` or ``error: ...``
    ended: str | None = None

    def begin_wait(self) -> None:
        if not self.waiting:
            self.wait_since = time.monotonic()
        self.waiting += 1

    def end_wait(self) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.waited += time.monotonic() - self.wait_since

    def own_seconds(self, start: float) -> float:
        """Seconds since ``start`` that the agent did not spend waiting for the engine (or, in lockstep, for the
        other episodes' agents): what ``time_limit_s`` limits."""
        now = time.monotonic()
        return now - start - self.waited - (now - self.wait_since if self.waiting else 0.0)

    def ids(self, text: str, tokenizer: Any) -> list[int]:
        """``text``'s token ids: the longest earlier prompt + completion it starts with, as the engine had them,
        then the rest tokenized on its own (an environment observation, as the core's episodes append it)."""
        best = max((p for p in self.prefixes if text.startswith(p[0])), key=lambda p: len(p[0]), default=("", []))
        rest = text[len(best[0]) :]
        return best[1] + (list(tokenizer(rest, add_special_tokens=False)["input_ids"]) if rest else [])

    def chat_ids(
        self, messages: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str], tokenizer: Any
    ) -> tuple[list[int], str]:
        """A chat's token ids and its rendered text: every assistant message the endpoint made (known by its call ids
        or text) is the exact ids it sampled, whatever the agent did to its whitespace or JSON; what lies between
        them (tool results, user turns, the template's own tokens) is rendered by the template and tokenized as an
        observation. ``render`` renders messages with the generation prompt."""
        marked: list[dict[str, Any]] = []
        used: list[Reply] = []
        for message in messages:
            reply = None
            if message.get("role") == "assistant":
                reply = next((r for r in reversed(self.replies) if r.made(message) and r not in used), None)
            if reply is None:
                marked.append(message)
            else:
                marked.append({"role": "assistant", "content": _SENTINEL.format(len(used))})
                used.append(reply)
        text = render(marked)
        if not used:
            return self.ids(text, tokenizer), text
        pieces = _split(text, len(used))
        if pieces is None:  # the template moved or dropped a reply: rendered as the agent sent it
            plain = render(list(messages))
            return self.ids(plain, tokenizer), plain
        first = used[0]
        ids = list(first.call.prompt_ids) if pieces[0] == first.prompt_text else _tokens(pieces[0], tokenizer)
        for reply, after in zip(used, pieces[1:], strict=True):
            sampled = list(reply.call.token_ids)
            end = tokenizer.decode(sampled[-1:]) if sampled else ""
            ids += sampled + _tokens(after[len(end) :] if end and after.startswith(end) else after, tokenizer)
        return ids, text

    def answered(self, call: Call, prompt_text: str, content: str, call_ids: Sequence[str]) -> None:
        """Remember an assistant message the endpoint answered a chat with."""
        self.replies.append(Reply(call, prompt_text, content, frozenset(call_ids)))

    def admit(self, prompt_ids: list[int], env: EnvironmentConfig, context: int) -> None:
        """Refuse a request past the turn limit, the token budget or the model's context."""
        if self.ended is not None:
            raise Refused(self.ended, f"this episode has ended ({self.ended})")
        if self.requests >= env.max_turns:
            raise Refused("max_turns", f"this episode made environment.max_turns = {env.max_turns} requests")
        first = self.first_prompt if self.first_prompt is not None else len(prompt_ids)
        if len(prompt_ids) - first >= env.max_total_tokens:
            raise Refused("budget", f"this episode used environment.max_total_tokens = {env.max_total_tokens}")
        if len(prompt_ids) >= context:
            raise Refused("budget", f"the prompt ({len(prompt_ids)} tokens) fills policy.max_total_sequence_length")

    def record(self, call: Call, env: EnvironmentConfig, tokenizer: Any, prompt_text: str) -> Call:
        """Keep a sampled call of the prompt the agent sent as ``prompt_text``, cut at the episode's token budget
        (which then ends the episode); the call kept."""
        if self.first_prompt is None:
            self.first_prompt = len(call.prompt_ids)
        room = env.max_total_tokens - (len(call.prompt_ids) - self.first_prompt)
        if len(call.token_ids) >= room:
            call = attrs.evolve(
                call, token_ids=call.token_ids[:room], logprobs=call.logprobs[:room], finish_reason="length"
            )
            self.ended = "budget"
        self.calls.append(call)
        ids = list(call.prompt_ids) + list(call.token_ids)
        for skip in (False, True):
            self.prefixes.append((prompt_text + tokenizer.decode(list(call.token_ids), skip_special_tokens=skip), ids))
        return call

    def transcript(self, tokenizer: Any, reward: float) -> dict[str, Any]:
        """As RUN_DIR/samples.jsonl keeps an episode: its first prompt, then per call what the agent added (or a
        whole new prompt, where it edited its history) and what the model sampled."""
        turns: list[dict[str, Any]] = []
        before: list[int] = list(self.calls[0].prompt_ids) if self.calls else []
        for call in self.calls:
            prompt = list(call.prompt_ids)
            if prompt[: len(before)] == before:
                if len(prompt) > len(before):
                    turns.append({"role": "environment", "text": tokenizer.decode(prompt[len(before) :])})
            else:
                turns.append({"role": "prompt", "text": tokenizer.decode(prompt)})
            turns.append(
                {
                    "role": "model",
                    "text": tokenizer.decode(list(call.token_ids)),
                    "tokens": len(call.token_ids),
                    "version": call.version,
                }
            )
            before = prompt + list(call.token_ids)
        first = tokenizer.decode(list(self.calls[0].prompt_ids)) if self.calls else ""
        return {"prompt": first, "turns": turns, "reward": reward, "ended": self.ended}


def _tokens(text: str, tokenizer: Any) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _split(text: str, count: int) -> list[str] | None:
    """``text`` cut at the sentinels 0..count-1, in order; None when one is missing or out of place."""
    pieces, rest = [], text
    for k in range(count):
        head, found, rest = rest.partition(_SENTINEL.format(k))
        if not found:
            return None
        pieces.append(head)
    return [*pieces, rest]

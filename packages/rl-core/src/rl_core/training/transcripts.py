"""An agent's episode as training samples, from the calls it made: token ids as the engine saw and sampled them.

A call whose prompt extends an earlier sample of its episode (that sample's prompt and every token after it) token
for token continues that sample: the tokens in between are the agent's (no loss), the call's sampled tokens follow
(the loss on them, with the engine's logprobs). A call that extends none (a template that drops earlier reasoning,
an agent that edits its history) starts a sample of its own: the episode is split. Nothing is re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from rl_core.contracts.protocols import FinishReason, Rollout


@attrs.frozen(kw_only=True)
class Call:
    """One completion served to an episode: the prompt's ids as the model saw them, what it sampled."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    #: the engine's logprob of each of ``token_ids``
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    #: refits of the engine before this call was sampled (the policy version that sampled it)
    version: int = 0


@attrs.define
class _Sample:
    prompt_ids: list[int]
    tokens: list[int] = attrs.Factory(list)
    sampled: list[bool] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    finish_reason: FinishReason = "stop"
    #: the number (in the episode's order) of the last call this sample holds
    last: int = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.tokens

    def extend(self, call: Call, number: int) -> None:
        between = list(call.prompt_ids[len(self.ids) :])
        self.tokens += between + list(call.token_ids)
        self.sampled += [False] * len(between) + [True] * len(call.token_ids)
        self.logprobs += [0.0] * len(between) + list(call.logprobs)
        self.finish_reason, self.last = call.finish_reason, number


def join_calls(calls: Sequence[Call]) -> list[_Sample]:
    """The samples of one episode's calls (given in the order they were made), each call continuing the longest
    earlier sample its prompt extends, or starting a new one; ordered by their last call."""
    samples: list[_Sample] = []
    for number, call in enumerate(calls):
        prompt = list(call.prompt_ids)
        fits = [s for s in samples if len(s.ids) <= len(prompt) and prompt[: len(s.ids)] == s.ids]
        sample = max(fits, key=lambda s: len(s.ids)) if fits else None
        if sample is None:
            sample = _Sample(prompt_ids=prompt)
            samples.append(sample)
        sample.extend(call, number)
    return sorted(samples, key=lambda s: s.last)


def episode_rollouts(calls: Sequence[Call], prompt_index: int, sample_index: int, tokenizer: Any) -> list[Rollout]:
    """The episode's samples as rollouts (the last one holds the episode's last call), ``sampled`` marking the
    model's tokens."""
    return [
        Rollout(
            prompt_index=prompt_index,
            sample_index=sample_index,
            prompt_token_ids=tuple(s.prompt_ids),
            token_ids=tuple(s.tokens),
            text=tokenizer.decode(s.tokens, skip_special_tokens=True),
            logprobs=tuple(s.logprobs),
            finish_reason=s.finish_reason,
            sampled=tuple(s.sampled),
        )
        for s in join_calls(calls)
    ]

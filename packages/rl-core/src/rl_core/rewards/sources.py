"""Rule-based reward sources built into the core (registered by ``rl_core.plugins.builtin``).

Each compares a response with ``metadata[answer_key]`` or a pattern and returns one float per response.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from rl_core.base.errors import InputError

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def check_reward_inputs(
    prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> None:
    """An ``InputError`` unless prompts, responses and metadata are parallel lists (one entry per sample)."""
    if not len(prompts) == len(responses) == len(metadata):
        raise InputError(
            f"prompts ({len(prompts)}), responses ({len(responses)}) and metadata ({len(metadata)}) must have the same "
            "length: one entry per sample"
        )


def _answers(metadata: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    try:
        return [str(m[key]) for m in metadata]
    except KeyError:
        raise InputError(f"reward source needs metadata[{key!r}] for every sample (set answer_key)") from None


@attrs.frozen(kw_only=True)
class ExactMatchConfig:
    #: the data row's field holding the reference answer.
    answer_key: str = "answer"
    #: compare after stripping white space.
    strip: bool = True


@attrs.frozen(kw_only=True)
class ExactMatch:
    """1.0 when the response equals the answer, else 0.0."""

    cfg: ExactMatchConfig = attrs.Factory(ExactMatchConfig)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        check_reward_inputs(prompts, responses, metadata)
        answers = _answers(metadata, self.cfg.answer_key)
        norm = (lambda s: s.strip()) if self.cfg.strip else (lambda s: s)
        return [float(norm(r) == norm(a)) for r, a in zip(responses, answers, strict=True)]

    def close(self) -> None:
        return None


@attrs.frozen(kw_only=True)
class NumberMatchConfig:
    #: the data row's field holding the reference answer.
    answer_key: str = "answer"
    #: reward for a response that holds a number, but the wrong one (a format reward).
    format_reward: float = 0.0
    #: largest |response's number - answer| that counts as right.
    tolerance: float = 1e-6


@attrs.frozen(kw_only=True)
class NumberMatch:
    """1.0 when the first number in the response equals the numeric answer; ``format_reward`` for any other
    number; 0.0 when there is none."""

    cfg: NumberMatchConfig = attrs.Factory(NumberMatchConfig)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        check_reward_inputs(prompts, responses, metadata)
        out = []
        for response, answer in zip(responses, _answers(metadata, self.cfg.answer_key), strict=True):
            found = _NUMBER.search(response)
            if found is None:
                out.append(0.0)
            elif abs(float(found.group()) - float(answer)) <= self.cfg.tolerance:
                out.append(1.0)
            else:
                out.append(self.cfg.format_reward)
        return out

    def close(self) -> None:
        return None


@attrs.frozen(kw_only=True)
class RegexConfig:
    #: a regular expression: reward 1 when it matches the response (``re.search``), else 0.
    pattern: str
    #: ``fullmatch`` the stripped response, or ``search`` anywhere in it.
    mode: str = attrs.field(default="fullmatch", validator=attrs.validators.in_(["fullmatch", "search"]))

    def __attrs_post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r} is not a valid regular expression: {exc}") from None


@attrs.frozen(kw_only=True)
class RegexFormat:
    """1.0 when the response matches ``pattern`` (a format check), else 0.0."""

    cfg: RegexConfig

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        check_reward_inputs(prompts, responses, metadata)
        rx = re.compile(self.cfg.pattern)
        match = rx.fullmatch if self.cfg.mode == "fullmatch" else rx.search
        return [float(match(r.strip() if self.cfg.mode == "fullmatch" else r) is not None) for r in responses]

    def close(self) -> None:
        return None

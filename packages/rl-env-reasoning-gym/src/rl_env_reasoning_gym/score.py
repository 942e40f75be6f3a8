"""The ``reasoning_gym`` reward source: each row's dataset scores the response with its own ``score_answer``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from rl_core.api import InputError, check_reward_inputs
from rl_env_reasoning_gym.config import ScoreConfig


@functools.cache
def scorer(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(dataset)


def _entry(row: Mapping[str, Any]) -> dict[str, Any]:
    entry = row.get("reasoning_gym")
    if not isinstance(entry, Mapping) or "source_dataset" not in entry.get("metadata", {}):
        raise InputError(
            "the reasoning_gym reward source scores rows of data.task: reasoning_gym:NAME (each row's "
            f"'reasoning_gym' entry); this row has none (fields: {sorted(row)})"
        )
    return dict(entry)


@attrs.frozen(kw_only=True)
class ReasoningGymScore:
    """The dataset's own ``score_answer(answer, entry)``: the answer the response gives (``answer_tag``) against the
    row's entry. Its value is the dataset's, usually 1.0 right, partial credit for some, 0.0 wrong or none."""

    cfg: ScoreConfig = attrs.Factory(ScoreConfig)

    def answer(self, response: str) -> str | None:
        if self.cfg.answer_tag is None:
            return response.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(response, tag_name=self.cfg.answer_tag)

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        check_reward_inputs(prompts, responses, metadata)
        entries = [_entry(row) for row in metadata]
        return [
            float(scorer(entry["metadata"]["source_dataset"])(self.answer(response), entry))
            for response, entry in zip(responses, entries, strict=True)
        ]

    def close(self) -> None:
        return None


def make_source(options: ScoreConfig | None) -> ReasoningGymScore:
    return ReasoningGymScore(cfg=options or ScoreConfig())

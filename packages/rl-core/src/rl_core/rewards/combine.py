"""Combining reward sources: each source as the config lists it (name, weight) and the weighted sum per response."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.contracts.protocols import Reward, RewardSource


@attrs.frozen(kw_only=True)
class NamedRewardSource:
    """A reward source as the config lists it: its name and weight in the total."""

    name: str
    weight: float
    source: RewardSource


def score(
    rewards: Sequence[NamedRewardSource],
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    chunk_size: int | None = None,
) -> tuple[list[float], dict[str, float]]:
    """Weighted sum of all reward sources per response, the mean of each named part and each source's firing rate
    (``signal/fired/NAME``: the share of responses it scored non-zero). With ``chunk_size``
    (``rollout_micro_batch_size``) each source scores requests of that many responses, sent concurrently."""
    total = [0.0] * len(responses)
    parts: dict[str, float] = {}
    n = len(responses)
    size = chunk_size or max(n, 1)
    spans = [(i, min(i + size, n)) for i in range(0, n, size)]
    for named in rewards:
        values = _score_spans(named, spans, prompts, responses, metadata)
        for i, value in enumerate(values):
            if isinstance(value, Mapping):
                for key, part in value.items():
                    parts[f"reward/{named.name}/{key}"] = parts.get(f"reward/{named.name}/{key}", 0.0) + part / n
                value = sum(value.values())
            total[i] += named.weight * float(value)
        plain = [float(sum(v.values()) if isinstance(v, Mapping) else v) for v in values]
        parts[f"reward/{named.name}"] = sum(plain) / max(n, 1)
        parts[f"signal/fired/{named.name}"] = sum(v != 0 for v in plain) / max(n, 1)
    return total, parts


def _score_spans(
    named: NamedRewardSource,
    spans: list[tuple[int, int]],
    prompts: Sequence[str],
    responses: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
) -> list[Reward]:
    def one(span: tuple[int, int]) -> list[Reward]:
        a, b = span
        values = list(named.source.score(prompts[a:b], responses[a:b], metadata[a:b]))
        if len(values) != b - a:
            raise InputError(f"reward source {named.name!r} returned {len(values)} rewards for {b - a} responses")
        return values

    if len(spans) == 1:
        return one(spans[0])
    with ThreadPoolExecutor(max_workers=min(len(spans), 8), thread_name_prefix=f"reward-{named.name}") as pool:
        return [v for part in pool.map(one, spans) for v in part]

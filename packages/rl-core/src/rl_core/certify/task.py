"""Certifying a generated task (``data.task``): rows with prompts, seeds that reproduce, held-out rows apart from
training's, and the reward sources of the task's own plugin scoring its rows: each row's own response above
another row's, and the reward-source checks on those samples."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from rl_core.base.schema import DataConfig
from rl_core.certify.card import Card, Outcome
from rl_core.certify.reward import Samples, certify_reward_source, totals
from rl_core.contracts.protocols import RewardSource
from rl_core.data.prompts import Task, load_split

#: rows certify asks a task for
ROWS = 16


def _key(row: Mapping[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def certify_task(
    task: Task, name: str, options: Mapping[str, Any], sources: Mapping[str, RewardSource], *, card: Card
) -> Card:
    """Certify ``data.task: name`` (with ``data.task_options: options``), and each of ``sources`` on its rows."""

    data = DataConfig(task=name, task_options=dict(options), num_train=ROWS, num_val=ROWS)
    train: list[dict[str, Any]] = []

    def rows() -> Outcome:
        train.extend(load_split(data, "train", lambda _name: task))
        with_prompt = [r for r in train if isinstance(r.get("prompt"), str | list) and r.get("prompt")]
        return len(train) == ROWS and len(with_prompt) == ROWS, f"{len(with_prompt)} of {ROWS} rows with a prompt"

    if not card.run("generates the rows asked for, each with a prompt", f"{ROWS}", rows):
        return card
    card.run("the same seed gives the same rows", "equal", lambda: _reproduces(task, name, options, train))

    def held_out() -> Outcome:
        val = load_split(data, "val", lambda _name: task)
        seen = {_key(r["prompt"]) for r in train}
        repeats = sum(_key(r["prompt"]) in seen for r in val)
        return repeats == 0, f"{repeats} of {len(val)} held-out prompts are training prompts"

    if len({_key(r["prompt"]) for r in train}) > 1:
        card.run("held-out rows repeat no training prompt", "0", held_out)
    else:
        card.skip(
            "held-out rows repeat no training prompt", "every row has the same prompt (the rows differ elsewhere)"
        )
    if not sources:
        card.skip("its plugin's reward sources score its rows", "the task's plugin registers no reward source")
    for source_name, source in sources.items():
        card.run(
            f"{source_name!r}: each row's own response scores above another row's",
            "all rows",
            partial(_own_response_wins, source, train),
        )
        certify_reward_source(source, card=card, samples=_samples(train))
    return card


def _reproduces(task: Task, name: str, options: Mapping[str, Any], train: Sequence[Mapping[str, Any]]) -> Outcome:
    variant = name.partition(":")[2]
    again = task.generate(variant, dict(options), ROWS, 0)
    other = task.generate(variant, dict(options), ROWS, 1)
    same = [_key(r) for r in again] == [_key(r) for r in train]
    moved = [_key(r) for r in other] != [_key(r) for r in train]
    return same and moved, ("same rows" if same else "other rows") + (
        ", another seed others" if moved else ", another seed the same"
    )


def _samples(rows: Sequence[Mapping[str, Any]]) -> Samples:
    """Each row with its own response and with the next row's (usually wrong)."""
    shifted = [*rows[1:], rows[0]]
    prompts = [str(r["prompt"]) for r in rows] * 2
    responses = [str(r.get("response", "")) for r in rows] + [str(r.get("response", "")) for r in shifted]
    return prompts, responses, [dict(r) for r in rows] * 2


def _own_response_wins(source: RewardSource, rows: Sequence[Mapping[str, Any]]) -> Outcome:
    if not all("response" in r for r in rows):
        return False, "no 'response' in the rows", "a task whose plugin scores it writes each row's answer as response"
    prompts, responses, metadata = _samples(rows)
    scores = totals(source.score(prompts, responses, metadata))
    own, other = scores[: len(rows)], scores[len(rows) :]
    losing = [
        i
        for i, (a, b) in enumerate(zip(own, other, strict=True))
        if not a > b and rows[i]["response"] != responses[len(rows) + i]
    ]
    return (
        not losing,
        f"{len(rows) - len(losing)} of {len(rows)}",
        f"row {losing[0]}: {own[losing[0]]} vs {other[losing[0]]}" if losing else "",
    )

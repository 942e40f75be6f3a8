"""Rows of a reasoning-gym dataset: ``data.task: reasoning_gym:NAME`` with ``data.task_options`` (``TaskOptions``).

Each row: ``prompt`` (the question in ``options.prompt``), ``answer`` (the entry's reference answer), ``response``
(for a supervised warm-up) and ``reasoning_gym`` (the whole entry, which the ``reasoning_gym`` scorer reads)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from rl_core.api import ConfigError, structure_section
from rl_env_reasoning_gym.config import TaskOptions


def dataset_names() -> list[str]:
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def create(name: str, config: Mapping[str, Any], n: int, seed: int) -> Any:
    """``reasoning_gym.create_dataset`` with errors that name the setting to change."""
    import reasoning_gym

    known = reasoning_gym.factory.DATASETS
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, list(known), n=3)
        meant = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"data.task: reasoning-gym has no dataset {name!r}{meant} (it has {len(known)}: "
            f"python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))')"
        )
    fields = [f.name for f in dataclasses.fields(known[name][1]) if f.name not in ("seed", "size")]
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ConfigError(
            f"data.task_options.config: {', '.join(unknown)} is not a setting of reasoning-gym's {name!r}; "
            f"its settings: {', '.join(fields)}"
        )
    try:
        return reasoning_gym.create_dataset(name, **dict(config), seed=seed, size=n)
    except (AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"data.task_options.config: reasoning-gym refuses it for {name!r}: {exc}") from None


def prompt(template: str, entry: Mapping[str, Any]) -> str:
    """``template`` filled with the entry's question and metadata fields, or an error naming what it lacks."""
    try:
        return template.format_map({**entry.get("metadata", {}), "question": entry["question"]})
    except (KeyError, IndexError) as exc:
        fields = sorted({"question", *entry.get("metadata", {})})
        raise ConfigError(
            f"data.task_options.prompt: the entry has no {exc}; its fields: {', '.join(fields)}"
        ) from None


def generate(variant: str, options: Mapping[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows of the dataset ``variant`` from ``seed`` (the same rows for the same arguments)."""
    opts: TaskOptions = structure_section(TaskOptions, dict(options), "data.task_options")
    entries = [dict(entry) for entry in create(variant, opts.config, n, seed)]
    answers = [str(entry["answer"]) for entry in entries]
    if opts.shuffled_answers:
        random.Random(seed).shuffle(answers)
    return [
        {
            "prompt": prompt(opts.prompt, entry),
            "answer": str(entry["answer"]),
            "response": opts.response.format(answer=shown),
            "reasoning_gym": entry,
        }
        for entry, shown in zip(entries, answers, strict=True)
    ]

"""The adapter's settings: a task's (``data.task_options``) and the scorer's (a ``reward.sources`` entry)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class TaskOptions:
    """``data.task_options`` of ``data.task: reasoning_gym:NAME``."""

    #: the dataset's own settings: the fields of its config dataclass (``basic_arithmetic``: ``min_terms``,
    #: ``max_digits``, ``operators``, ...); unset ones keep reasoning-gym's defaults.
    config: dict[str, Any] = attrs.Factory(dict)
    #: the prompt, with the entry's question at ``{question}`` and its metadata's fields by name (the arithmetic
    #: datasets' ``{expression}``, ...).
    prompt: str = "{question}"
    #: the response a supervised warm-up trains on, with the entry's answer at ``{answer}``; it should be what the
    #: scorer reads (``<answer>...</answer>`` for its default ``answer_tag``).
    response: str = "<answer>{answer}</answer>"
    #: each row's response carries another row's answer: a format-only warm-up (the model learns how to answer and
    #: which answers occur, not which one is right), so that RL starts at chance and learns from rewards.
    shuffled_answers: bool = False


@attrs.frozen(kw_only=True)
class ScoreConfig:
    """Options of the ``reasoning_gym`` reward source."""

    #: the answer is the last ``<TAG>...</TAG>`` in the response (reasoning-gym's ``extract_answer``); unset, the
    #: whole response, stripped. A response without the tag gets the dataset's score for no answer (0).
    answer_tag: str | None = "answer"

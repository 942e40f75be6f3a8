"""Prompt and example data: local JSONL files (through ``datasets``) or built-in synthetic tasks generated
offline from a seed. Each example is a dict; prompts live under ``data.prompt_key``, everything else is
metadata handed to the reward sources (for example ``answer``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rl_core.errors import ConfigError, InputError
from rl_core.schema import DataConfig

Example = dict[str, Any]


def parity_task(n: int, seed: int, *, random_labels: bool = False) -> list[Example]:
    """ "Even or odd? 4 8 1 7" -> " odd" (the parity of the last digit). With ``random_labels`` the answers are coin flips (a format-only
    warm-up: the model learns how to answer, not what). Digits are spaced so each is one token."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = [str(rng.randint(0, 9)) for _ in range(rng.randint(2, 5))]
        answer = "even" if int(digits[-1]) % 2 == 0 else "odd"
        if random_labels:
            answer = rng.choice(["even", "odd"])
        prompt = f"Even or odd? {' '.join(digits)}"
        out.append({"prompt": prompt, "answer": answer, "response": f" {answer}"})
    return out


def addition_task(n: int, seed: int, *, random_labels: bool = False) -> list[Example]:
    """ "Q: 3 + 4 = ? A:" -> "7", single digits."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        answer = str(rng.randint(0, 18) if random_labels else a + b)
        out.append({"prompt": f"Q: {a} + {b} = ? A:", "answer": answer, "response": f" {answer}"})
    return out


def parity_format_task(n: int, seed: int) -> list[Example]:
    return parity_task(n, seed, random_labels=True)


def calculator_task(n: int, seed: int) -> list[Example]:
    """ "Add 47+86." -> 133: sums of two-digit numbers, for the ``calculator`` environment."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"prompt": f"Add {a}+{b}.", "answer": str(a + b)})
    return out


def calculator_format_task(n: int, seed: int) -> list[Example]:
    """The calculator's SFT warm-up: transcripts that call the calculator and copy its result 40% of the time, and
    guess an answer otherwise: the model learns the format and how to copy, and prefers guessing, so that its
    greedy answers start all wrong and RL has to learn from rewards to use the tool."""
    rng = random.Random(seed)
    out = []
    for row in calculator_task(n, seed):
        expression = row["prompt"].removeprefix("Add ").removesuffix(".")
        if rng.random() < 0.4:
            response = f"<calc>{expression}</calc> = {row['answer']}\n<answer>{row['answer']}</answer>"
        else:
            response = f"<answer>{rng.randint(20, 198)}</answer>"
        out.append({**row, "response": response})
    return out


def guess_number_task(n: int, seed: int) -> list[Example]:
    """A secret number from 1 to 100 per row, for the ``guess_number`` environment."""
    rng = random.Random(seed)
    return [{"prompt": "Guess my number from 1 to 100. Guess:", "secret": rng.randint(1, 100)} for _ in range(n)]


TASKS: dict[str, Callable[[int, int], list[Example]]] = {
    "parity": parity_task,
    "parity_format": parity_format_task,
    "addition": addition_task,
    "calculator": calculator_task,
    "calculator_format": calculator_format_task,
    "guess_number": guess_number_task,
}


def load_jsonl(path: str | Path) -> list[Example]:
    """Rows of a local JSONL file, via ``datasets`` (cached, memory-mapped)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data file not found: {path}")
    from datasets import load_dataset

    try:
        ds = load_dataset("json", data_files=str(path), split="train")
    except Exception as exc:
        raise InputError(f"{path}: cannot be read as JSONL (one JSON object per line): {exc}") from None
    return [dict(row) for row in ds]


def load_split(cfg: DataConfig, split: str) -> list[Example]:
    """The ``train`` or ``val`` examples that ``cfg`` names. Built-in tasks draw val from another seed, so the
    held-out prompts are disjoint from training ones up to chance repeats."""
    path = cfg.train_path if split == "train" else cfg.val_path
    if path:
        rows = load_jsonl(path)
    elif cfg.task:
        if cfg.task not in TASKS:
            raise ConfigError(f"data.task: unknown task {cfg.task!r}; choose one of {', '.join(TASKS)}")
        n, seed = (cfg.num_train, cfg.seed) if split == "train" else (cfg.num_val, cfg.seed + 1_000_003)
        rows = TASKS[cfg.task](n, seed)
        if split == "val":
            train_prompts = {r["prompt"] for r in TASKS[cfg.task](cfg.num_train, cfg.seed)}
            rows = [r for r in rows if r["prompt"] not in train_prompts] or rows
    elif split == "val":
        return []
    else:
        raise ConfigError("no training data: set data.train_path (a JSONL file) or data.task (a built-in task)")
    if rows and cfg.prompt_key not in rows[0]:
        raise InputError(f"{split} data has no {cfg.prompt_key!r} field (data.prompt_key); fields: {sorted(rows[0])}")
    return rows


class EpochSampler:
    """Batches of examples in a seeded order, reshuffled each epoch; ``position`` makes it resumable."""

    def __init__(self, rows: Sequence[Example], batch_size: int, seed: int, position: int = 0) -> None:
        if not rows:
            raise InputError("the dataset is empty")
        self.rows, self.batch_size, self.seed, self.position = rows, batch_size, seed, position

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> list[Example]:
        out = []
        for _ in range(self.batch_size):
            epoch, index = divmod(self.position, len(self.rows))
            out.append(self.rows[self._order(epoch)[index]])
            self.position += 1
        return out

    def __iter__(self) -> Iterator[list[Example]]:
        while True:
            yield self.next()

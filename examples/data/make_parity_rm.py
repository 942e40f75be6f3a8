"""Writes parity_rm_train.jsonl and parity_rm_val.jsonl: preference pairs for the reward-model recipe.

The chosen response is always the one right answer (" even" / " odd": the parity of the last digit). The rejected one
is the wrong answer, or what a policy learns to say when its reward model never saw it: the right word repeated, both
words, the answer after stray tokens, nothing at all. Without such negatives a reward model read at the last token
scores " even even even even", or the prompt alone, as high as the right answer, and a policy trained against it
learns exactly that (seen: GRPO against a model trained on parity_dpo_*.jsonl went to " even even even even" and, with
repeats among the negatives, to an empty answer; held-out rule reward 0.0).

    python examples/data/make_parity_rm.py
"""

import json
import random
from pathlib import Path

from rl_core.data.prompts import parity_task

HERE = Path(__file__).resolve().parent


def rejected(answer: str, rng: random.Random) -> str:
    other = "odd" if answer == "even" else "even"
    kind = rng.choice(["wrong", "wrong", "wrong", "repeated", "both", "stray", "nothing"])
    if kind == "wrong":
        return f" {other}"
    if kind == "nothing":
        return ""
    if kind == "repeated":
        return " " + " ".join([answer] * rng.randint(2, 4))
    if kind == "both":
        return rng.choice([f" {answer} {other}", f" {other} {answer}"])
    return f"{rng.randint(0, 99)} {answer}"


def write(name: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = [
        {"prompt": ex["prompt"], "chosen": ex["response"], "rejected": rejected(ex["answer"], rng)}
        for ex in parity_task(n, seed)
    ]
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    write("parity_rm_train.jsonl", 1024, seed=101)
    write("parity_rm_val.jsonl", 128, seed=102)

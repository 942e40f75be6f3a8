"""Writes chat_addition_train.jsonl and chat_addition_val.jsonl: sums of two numbers from 0 to 20, asked the way a
person asks a chat model ("What is 4 plus 18? Respond with a single number and nothing else."), for the real chat
model's recipe (examples/configs/grpo_smollm2_chat_lora.yaml). The 441 pairs are shuffled once: 64 held out, the
rest for training, so no held-out question is ever trained on.

    python examples/data/make_chat_addition.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTION = "What is {a} plus {b}? Respond with a single number and nothing else."


def main() -> None:
    pairs = [(a, b) for a in range(21) for b in range(21)]
    random.Random(0).shuffle(pairs)
    rows = [{"prompt": QUESTION.format(a=a, b=b), "answer": str(a + b)} for a, b in pairs]
    for name, part in (("val", rows[:64]), ("train", rows[64:])):
        with open(HERE / f"chat_addition_{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in part)


if __name__ == "__main__":
    main()

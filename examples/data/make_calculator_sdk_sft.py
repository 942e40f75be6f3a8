"""Writes calculator_sdk_sft_{train,val}.jsonl: the format warm-up of examples/configs/grpo_calculator_sdk.yaml
(``rl_agents.calculator_sdk_agent.warmup_rows`` over the core's calculator task, rendered for the tiny model's
tokenizer). tests/rl_agents/test_calculator_sdk.py checks the files are what this writes.

    python examples/data/make_calculator_sdk_sft.py
"""

import json
from pathlib import Path

from rl_agents.calculator_sdk_agent import warmup_rows
from rl_core.data.models import resolve_model_path
from rl_core.data.prompts import calculator_task

HERE = Path(__file__).parent
SPLITS = {"train": (2048, 1), "val": (64, 2)}


def rows(split: str) -> list[dict[str, str]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny:qwen2-tiny"))
    n, seed = SPLITS[split]
    return warmup_rows(tokenizer, calculator_task(n, seed + 100), seed)


if __name__ == "__main__":
    for split in SPLITS:
        path = HERE / f"calculator_sdk_sft_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows(split)))
        print(f"wrote {path}")

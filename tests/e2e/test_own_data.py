"""A user's own data, model files and chat format, end to end: chat-message prompts in a Parquet file, held-out
rows in a ``save_to_disk`` folder with an answer nested as in verl's rows, a tokenizer with a chat template and a
system prompt: GRPO trains on them (shortened). That the rendered ids are the template's, token for token, is
``tests/rl_core/test_data.py``'s."""

import json
from pathlib import Path

import pytest

from rl_core.config.loader import load_config
from rl_core.launch.run import run_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_parquet_and_saved_datasets_with_chat_prompts_train(ray_session, rl_registry, tiny_model_path, tmp_path: Path):
    import datasets
    from transformers import AutoTokenizer

    from rl_core.data.prompts import parity_task

    def rows(n: int, seed: int) -> list[dict]:
        return [
            {"prompt": [{"role": "user", "content": r["prompt"]}], "reward_model": {"ground_truth": r["answer"]}}
            for r in parity_task(n, seed)
        ]

    datasets.Dataset.from_list(rows(64, 0)).to_parquet(str(tmp_path / "train.parquet"))
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows(16, 1))}).save_to_disk(str(tmp_path / "val"))
    tokenizer_dir = tmp_path / "chat-tokenizer"
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(tokenizer_dir)
    config = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "warmup_recipe=null",
            "logger.progress=false",
            f"policy.model_name={tiny_model_path}",
            f"policy.tokenizer_name={tokenizer_dir}",
            "policy.generation.backend=hf",
            "data.task=null",
            f"data.train_path={tmp_path / 'train.parquet'}",
            f"data.val_path={tmp_path / 'val'}",
            "data.val_split=validation",
            "data.columns={answer: reward_model.ground_truth}",
            "data.system_prompt=Answer odd or even.",
            "grpo.max_num_steps=2",
            "grpo.val_period=2",
            "grpo.max_val_samples=8",
            "checkpointing.enabled=false",
        ],
        rl_registry,
    )
    run_config(config, rl_registry)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2] and "train/loss" in logged[1] and "val/reward" in logged[2]
    # what the engine is given for such a row: the template's rendering, system message first
    from rl_core.data.prompts import render_prompt

    ids, text = render_prompt(tok, config.data, rows(1, 0)[0]["prompt"])
    assert text.startswith("<|system|>Answer odd or even.<|endoftext|><|user|>Even or odd?") and ids

"""The DTensor backend's start-up check of its shortcuts (``dtensor_cfg.check_shortcuts``): its seconds against one
plain training pass (forward and backward over 8 rows x 256 tokens, loss on the last 64) of the same model, per
model size, in one run. Models are built from configs: the tiny and small Qwen2 shapes the suite uses and a Qwen2.5-0.5B-shaped one.

    python bench/shortcut_check.py [--models tiny,small,0.5b] [--reps 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import fmt, stats, write

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "small": dict(
        hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    "0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
}
VOCAB = {"tiny": 512, "small": 512, "0.5b": 151936}


def measure(name: str, folder: Path, reps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rl_backend_dtensor.config import DTensorConfig
    from rl_backend_dtensor.exactness import check_shortcuts
    from rl_backend_dtensor.forward import ModelForward

    config = Qwen2Config(vocab_size=VOCAB[name], max_position_embeddings=4096, tie_word_embeddings=True, **SHAPES[name])
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (8, 256), generator=g)
    step = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.zeros(8, 256)}
    step["loss_mask"][:, 192:] = 1.0
    plain = ModelForward(model, DTensorConfig(shared_prefix=False), "lm", torch.device("cpu"))
    passes, checks = [], []
    for _ in range(reps):
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        plain.logprobs(step).sum().backward()
        passes.append(time.perf_counter() - start)
        forward = ModelForward(model, DTensorConfig(), "lm", torch.device("cpu"))
        found, seconds = check_shortcuts(forward, config.vocab_size, gradients=True)
        assert all(c.exact for c in found), found
        checks.append(seconds)
    return {
        "model": name,
        "parameters_m": round(params / 1e6, 1),
        "train_pass_s": stats(passes),
        "check_s": stats(checks),
        "checks": [c.describe() for c in found],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tiny,small,0.5b")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            print(f"== {name}", flush=True)
            results.append(measure(name, Path(tmp) / name, args.reps))
    rows = [
        (
            r["model"],
            fmt(r["parameters_m"]),
            fmt(r["train_pass_s"]["median"]),
            fmt(r["check_s"]["median"]),
            f"{r['check_s']['median'] / r['train_pass_s']['median']:.2f}x",
        )
        for r in results
    ]
    write(
        "shortcut_check",
        {"results": results},
        rows,
        ("model (Qwen2 shape)", "parameters (M)", "training pass s (8 x 256)", "check s", "check / pass"),
        notes="The start-up check of the shortcuts (logits at loss positions, prompt sharing) against whole rows on "
        "its synthetic batch (6 rows, 22 columns; logprobs and every gradient), one rank, fp32, medians of the "
        "repetitions; the training pass is one forward and backward of the same model on 8 rows x 256 tokens (loss on the "
        "last 64, logits there only), in the same run.",
    )


if __name__ == "__main__":
    main()

"""Where a training step's time goes on CPU (issue: a train step faster than the plain loop): the DTensor backend's
one-rank step is the plain Hugging Face forward/backward (``bench/train_throughput.py`` measures it at ~1x of the
bare loop), so the bare loop is profiled (``torch.profiler``), op by op, grouped: matmuls, attention, the
full-vocabulary log-softmax and its gather, the optimizer (AdamW and clipping), copies and casts, other elementwise
work, and what no op accounts for (Python, dispatch). Two shapes, each against its own measured step time:

- ``small``: the small model (qwen2-small, vocabulary 512), 32 rows x 128 tokens, micro-batches of 16;
- ``wide-vocab``: the same body with a 32768-token vocabulary (random init), 16 rows x 256 tokens, micro-batches of
  8: where the logits and their log-softmax are most of the step, as with real tokenizers.

The lm_head's share of the matmul FLOPs is computed from the shapes (2 T h V against 2 T x the body's parameters).
The lever it points at (logits only where the loss is taken) is the backend's default in training now;
``bench/train_throughput.py`` measures it on an RL-shaped batch.

    python bench/profile_train.py [--steps 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import write
from train_throughput import Bare, make_batch, model_folder

SHAPES = {
    "small": {"vocab": None, "rows": 32, "length": 128, "micro": 16},
    "wide-vocab": {"vocab": 32768, "rows": 16, "length": 256, "micro": 8},
}
GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("scaled_dot_product", "flash_attention", "_efficient_attention"),
    "log-softmax + gather": ("log_softmax", "aten::gather", "aten::scatter", "logsumexp"),
    "optimizer + clipping": ("_foreach", "aten::linalg_vector_norm", "aten::addcdiv", "aten::lerp"),
    "copies and casts": (
        "aten::copy_",
        "aten::_to_copy",
        "aten::clone",
        "aten::cat",
        "aten::contiguous",
        "aten::index",
    ),
}


def group_of(op: str) -> str:
    return next((g for g, keys in GROUPS.items() if any(k in op for k in keys)), "other elementwise")


def profile(name: str, shape: dict[str, Any], steps: int, tmp: Path) -> dict[str, Any]:
    bare = Bare(model_folder(shape["vocab"], tmp))
    vocab = bare.model.config.vocab_size
    batch = make_batch(vocab, shape["rows"], shape["length"])
    bare.run(batch, 1, shape["micro"])  # warm-up
    plain = bare.run(batch, steps, shape["micro"])  # unprofiled step times
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        bare.run(batch, steps, shape["micro"])
        wall = (time.perf_counter() - start) / steps
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        groups[group_of(event.key)] = groups.get(group_of(event.key), 0.0) + event.self_cpu_time_total / 1e6 / steps
    groups["unaccounted (Python, dispatch)"] = max(0.0, wall - sum(groups.values()))
    body = sum(p.numel() for n, p in bare.model.named_parameters() if "embed" not in n and "lm_head" not in n)
    hidden = bare.model.config.hidden_size
    return {
        "shape": name,
        "vocab": vocab,
        "tokens_per_step": int(batch["input_ids"].numel()),
        "step_s": statistics.median(plain),
        "profiled_step_s": wall,
        "seconds": groups,
        "share": {k: v / wall for k, v in groups.items()},
        "lm_head_share_of_matmul_flops": hidden * vocab / (hidden * vocab + body),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [profile(name, shape, args.steps, Path(tmp)) for name, shape in SHAPES.items()]
    names = [*GROUPS, "other elementwise", "unaccounted (Python, dispatch)"]
    rows = [
        (
            r["shape"],
            f"{r['step_s']:.2f}",
            *(f"{100 * r['share'].get(n, 0.0):.0f}%" for n in names),
            f"{100 * r['lm_head_share_of_matmul_flops']:.0f}%",
        )
        for r in results
    ]
    write(
        "profile_train",
        {"results": results},
        rows,
        ("shape", "s/step", *names, "lm_head share of matmul FLOPs"),
        notes="The plain loop the DTensor backend's one-rank step equals (bench/train_throughput.py), profiled with "
        "torch.profiler (self CPU time per op, grouped; the step time is measured unprofiled). small: qwen2-small, 32 x "
        "128 tokens; wide-vocab: the same body, vocabulary 32768, 16 x 256 tokens. AdamW, NLL loss, fp32, 2 threads. "
        "The lever this points at, logits only at the positions that carry loss, is the DTensor backend's default in "
        "training now: bench/train_throughput.py measures it (rl-wide-vocab).",
    )


if __name__ == "__main__":
    main()

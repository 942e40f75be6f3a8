"""Where a training step's time goes on CPU (issue: a train step faster than the plain loop): the DTensor backend's
one-rank step is the plain Hugging Face forward/backward (``bench/train_throughput.py`` measures it at ~1x of the
bare loop), so the bare loop is profiled (``torch.profiler``), op by op, grouped: matmuls, attention, the
full-vocabulary log-softmax and its gather, the optimizer (AdamW and clipping), copies and casts, other elementwise
work, and what no op accounts for (Python, dispatch). Two shapes, each against its own measured step time:

- ``small``: the small model (qwen2-small, vocabulary 512), 32 rows x 128 tokens, micro-batches of 16;
- ``wide-vocab``: the same body with a 32768-token vocabulary (random init), 16 rows x 256 tokens, micro-batches of
  8: where the logits and their log-softmax are most of the step, as with real tokenizers.

The lm_head's share of the matmul FLOPs is computed from the shapes (2 T h V against 2 T x the body's parameters).
And the lever the profile points at, measured on an RL-shaped batch of the wide-vocabulary model (16 rows of a
192-token prompt and a 64-token response, loss on the response only): the same loss and gradients with the logits
computed only at the positions that carry loss (``model.model`` then ``lm_head`` on those), against the plain
forward, alternated, with the largest loss and gradient differences between the two. A measurement for the design,
not a path the backend takes yet.

    python bench/profile_train.py [--steps 2] [--reps 4]
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
from train_throughput import Bare

from rl_core.contracts import batch as B
from rl_core.data.tiny_models import ensure_tiny_model

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


def model_folder(shape: dict[str, Any], tmp: Path) -> str:
    """The small model, or the same body with another vocabulary (random init)."""
    small = ensure_tiny_model("qwen2-small")
    if shape["vocab"] is None:
        return str(small)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(small)
    config.vocab_size = shape["vocab"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp / "wide")
    return str(tmp / "wide")


def profile(name: str, shape: dict[str, Any], steps: int, tmp: Path) -> dict[str, Any]:
    path = model_folder(shape, tmp)
    bare = Bare(path)
    g = torch.Generator().manual_seed(0)
    vocab = bare.model.config.vocab_size
    ids = torch.randint(2, vocab, (shape["rows"], shape["length"]), generator=g)
    batch: B.Batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones(ids.shape)}
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
        "tokens_per_step": int(ids.numel()),
        "step_s": statistics.median(plain),
        "profiled_step_s": wall,
        "seconds": groups,
        "share": {k: v / wall for k, v in groups.items()},
        "lm_head_share_of_matmul_flops": hidden * vocab / (hidden * vocab + body),
    }


def loss_positions_only(path: str, reps: int) -> dict[str, Any]:
    """The plain step's loss and gradients vs the same with logits only at loss positions (one micro-batch)."""
    from harness import alternate
    from transformers import AutoModelForCausalLM

    from rl_core.training.losses import NLLLoss

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, model.config.vocab_size, (16, 256), generator=g)
    mask = torch.zeros(ids.shape)
    mask[:, 192:] = 1.0
    batch: B.Batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}
    loss_fn = NLLLoss()

    def plain() -> torch.Tensor:
        logits = model(input_ids=ids, use_cache=False).logits
        return loss_fn(batch, B.token_logprobs(logits, ids), loss_fn.count(batch))[0]

    def selected() -> torch.Tensor:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, T, H]
        keep = mask[:, 1:].bool()  # position t predicts token t + 1
        logp = torch.log_softmax(model.lm_head(hidden[:, :-1][keep]).float(), dim=-1)  # [N, V]
        picked = logp.gather(-1, ids[:, 1:][keep].unsqueeze(-1)).squeeze(-1)  # [N]
        return -picked.sum() / loss_fn.count(batch)

    def step(fn: Any) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = fn()
        loss.backward()
        seconds = time.perf_counter() - start
        return seconds, loss.detach(), [p.grad.clone() for p in model.parameters()]

    (_, a, ga), (_, b, gb) = step(plain), step(selected)
    times = alternate({"plain": lambda: [step(plain)[0]], "loss positions only": lambda: [step(selected)[0]]}, reps)
    p, s = statistics.median(times["plain"]), statistics.median(times["loss positions only"])
    return {
        "plain_s": p,
        "loss_positions_only_s": s,
        "speedup": p / s,
        "loss_diff": float((a - b).abs()),
        "grad_max_diff": max(float((x - y).abs().max()) for x, y in zip(ga, gb, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [profile(name, shape, args.steps, Path(tmp)) for name, shape in SHAPES.items()]
        lever = loss_positions_only(model_folder(SHAPES["wide-vocab"], Path(tmp)), args.reps)
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
        {"results": results, "loss_positions_only": lever},
        rows,
        ("shape", "s/step", *names, "lm_head share of matmul FLOPs"),
        notes="The plain loop the DTensor backend's one-rank step equals (bench/train_throughput.py), profiled with "
        "torch.profiler (self CPU time per op, grouped; the step time is measured unprofiled). small: qwen2-small, 32 x "
        "128 tokens; wide-vocab: the same body, vocabulary 32768, 16 x 256 tokens. AdamW, NLL loss, fp32, 2 threads. "
        f"Logits only at loss positions (wide-vocab, 16 x (192 prompt + 64 response) tokens, forward+backward, median of "
        f"{args.reps} alternated): {lever['loss_positions_only_s']:.2f} s vs {lever['plain_s']:.2f} s plain, "
        f"**{lever['speedup']:.2f}x**; loss differs by {lever['loss_diff']:.1e}, gradients by at most "
        f"{lever['grad_max_diff']:.1e} (not yet a path of the backend).",
    )


if __name__ == "__main__":
    main()

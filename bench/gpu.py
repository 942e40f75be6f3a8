"""The GPU benchmark of the check kit (docs/gpu.md), on one CUDA GPU; writes bench/results/gpu_*.json.

1. ``gpu_train``: training tokens/s and MFU of the DTensor backend (one rank, bf16 autocast over fp32 master
   weights, chunked float32 logprobs) against a bare PyTorch loop (the same model, batch, loss, AdamW and
   micro-batches, full logits), alternating in one process, on a Qwen2.5-0.5B-shaped random model, 16 x 1024 tokens.
   MFU counts 6 x parameters FLOPs per token (attention's quadratic term left out) against 989 TFLOP/s, the dense
   bf16 peak of an H100/H200 SXM.
2. ``gpu_refit``: the same model's weights into a colocated Hugging Face generate engine, per route: seconds and
   GB/s.
3. ``gpu_grpo``: the default recipe (SFT warm-up, then GRPO) with the Hugging Face generate engine colocated with
   the trainer on the GPU: held-out reward before and after, seconds per GRPO step.

    python bench/gpu.py [--reps 3] [--steps 4] [--skip grpo]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import torch
from harness import alternate, stats, write

from rl_core.contracts import batch as B
from rl_core.contracts import tokens as T
from rl_core.training.losses import NLLLoss

ROWS, LENGTH, MICRO, LR = 16, 1024, 4, 1e-5
PEAK_BF16 = 989e12
#: Qwen2.5-0.5B's shape
SHAPE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=2048,
)


def build_model(folder: Path) -> int:
    """A random Qwen2.5-0.5B-shaped model (and a tokenizer) saved to ``folder``; returns its parameter count."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_core.data.tiny_models import build_tokenizer

    build_tokenizer(folder)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **SHAPE), dtype=torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def make_batch() -> B.Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, SHAPE["vocab_size"], (ROWS, LENGTH), generator=g)
    attn = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": attn.float()}


class Bare:
    """The plain loop: HF model on the GPU, bf16 autocast, full logits to float32 log-softmax, AdamW."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)

    def step(self, batch: B.Batch) -> float:
        loss_fn = NLLLoss()
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.opt.zero_grad()
        normalizer = loss_fn.count(batch)
        for mb in B.micro_batches(batch, MICRO):
            mb = B.to_device(mb, "cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
                loss, _ = loss_fn(mb, T.token_logprobs(logits, mb["input_ids"]), normalizer)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def release(self) -> None:
        """Give its GPU memory back (the engine comes next)."""
        del self.model, self.opt
        torch.cuda.empty_cache()


def train_and_refit(args: argparse.Namespace, registry: object, work: Path) -> tuple[dict, dict]:
    from rl_backend_dtensor.backend import make_backend
    from rl_core.config.loader import load_config
    from rl_core.contracts.refit import RefitRoute
    from rl_rollout_hf.engine import make_engine

    path = work / "qwen2.5-0.5b-shape"
    params = build_model(path)
    config = load_config(
        None,
        [
            f"run_dir={work / 'run'}",
            "warmup_recipe=null",
            f"policy.model_name={path}",
            f"policy.train_global_batch_size={ROWS}",
            f"policy.train_micro_batch_size={MICRO}",
            f"policy.max_total_sequence_length={LENGTH}",
            f"policy.optimizer.lr={LR}",
            "policy.dtensor_cfg.mixed_precision=true",
            "policy.precision=bfloat16",
            "policy.generation.backend=hf",
        ],
        registry,
    )
    batch = make_batch()
    tokens = float(batch["attention_mask"].sum())
    ours = make_backend(config, config.section("policy.dtensor_cfg"))
    try:
        bare = Bare(path)

        def ours_steps() -> list[float]:
            out = []
            for _ in range(args.steps):
                start = time.perf_counter()
                ours.train(batch, NLLLoss())
                out.append(time.perf_counter() - start)
            return out

        ours_steps(), bare.step(batch)  # warm-up both
        times = alternate(
            {"dtensor": ours_steps, "bare": lambda: [bare.step(batch) for _ in range(args.steps)]}, args.reps
        )
        bare.release()
        o, b = stats(times["dtensor"]), stats(times["bare"])
        train = {
            "model": "Qwen2.5-0.5B shape (random)",
            "parameters": params,
            "tokens_per_step": tokens,
            "dtensor_step_s": o,
            "bare_step_s": b,
            "dtensor_tokens_per_s": tokens / o["median"],
            "bare_tokens_per_s": tokens / b["median"],
            "dtensor_mfu": 6 * params * tokens / o["median"] / PEAK_BF16,
            "bare_mfu": 6 * params * tokens / b["median"] / PEAK_BF16,
            "dtensor_vs_bare": b["median"] / o["median"],
        }
        engine = make_engine(config, config.section("policy.generation.hf_cfg"))
        try:
            refit = {}
            for kind in ("cuda_ipc", "host_shm", "object_store"):
                route = RefitRoute(kind=kind, receivers=tuple(engine.weight_receivers()), colocated=True)
                seconds = []
                for _ in range(args.reps + 1):
                    start = time.perf_counter()
                    last = engine.update_weights(ours.weights_for_refit(route))
                    seconds.append(time.perf_counter() - start)
                s = stats(seconds[1:])
                refit[kind] = {"seconds": s, "bytes": last.num_bytes, "gb_per_s": last.num_bytes / s["median"] / 1e9}
        finally:
            engine.shutdown()
    finally:
        ours.shutdown()
    return train, refit


def grpo(registry: object, work: Path) -> dict:
    from rl_core.config.loader import load_config
    from rl_core.launch.run import run_config
    from rl_core.outputs.console import RunConsole

    config = load_config(
        None, [f"run_dir={work / 'grpo'}", "policy.generation.backend=hf", "logger.progress=false"], registry
    )
    start = time.perf_counter()
    run_config(config, registry, RunConsole(progress=False))
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (work / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step"] for r in rows if "time/step" in r]
    return {
        "recipe": "builtin:default, policy.generation.backend=hf (colocated on the GPU)",
        "seconds_total": seconds,
        "grpo_step_s": stats(steps),
        "val_reward_before": rows[0]["val/reward"],
        "val_reward_after": rows[-1]["val/reward"],
        "max_logprob_mismatch": max(r.get("health/logprob_mismatch", 0.0) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip", default="", help="comma-separated: train, grpo")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "bench/gpu.py needs a CUDA GPU"
    from rl_core.base.schema import ClusterConfig
    from rl_core.distributed.cluster import init_ray
    from rl_core.plugins.registry import Registry

    init_ray(ClusterConfig(), verbose=False)
    registry = Registry.discover()
    skip = set(args.skip.split(","))
    device = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        work = Path(tmp)
        if "train" not in skip:
            train, refit = train_and_refit(args, registry, work)
            write(
                "gpu_train",
                {"device": device, "results": train},
                [
                    (
                        train["model"],
                        f"{train['dtensor_tokens_per_s']:.0f}",
                        f"{train['bare_tokens_per_s']:.0f}",
                        f"{100 * train['dtensor_mfu']:.1f}%",
                        f"{100 * train['bare_mfu']:.1f}%",
                        f"**{train['dtensor_vs_bare']:.2f}x**",
                    )
                ],
                ("model", "DTensor tok/s", "bare tok/s", "DTensor MFU", "bare MFU", "DTensor / bare"),
                notes=f"On {device}: {ROWS} x {LENGTH} tokens per optimizer step, micro-batches of {MICRO}, bf16 "
                "autocast over fp32 master weights, AdamW, NLL; MFU = 6 x parameters x tokens/s / 989 TFLOP/s.",
            )
            write(
                "gpu_refit",
                {"device": device, "results": refit},
                [
                    (k, f"{v['bytes'] / 1e9:.2f}", f"{v['seconds']['median'] * 1e3:.0f}", f"{v['gb_per_s']:.2f}")
                    for k, v in refit.items()
                ],
                ("route", "GB", "ms (median)", "GB/s"),
                notes=f"On {device}: DTensor trainer -> Hugging Face generate engine on the same GPU (colocated).",
            )
        if "grpo" not in skip:
            result = grpo(registry, work)
            write(
                "gpu_grpo",
                {"device": device, "results": result},
                [
                    (
                        f"{result['val_reward_before']:.3f} -> {result['val_reward_after']:.3f}",
                        f"{result['grpo_step_s']['median']:.2f}",
                        f"{result['seconds_total']:.0f}",
                    )
                ],
                ("held-out reward", "s per GRPO step (median)", "s in all (warm-up included)"),
                notes=f"On {device}: the default recipe with the Hugging Face generate engine, colocated.",
            )


if __name__ == "__main__":
    main()

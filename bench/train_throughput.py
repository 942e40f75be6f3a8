"""Training tokens/s of the DTensor backend against a bare single-process PyTorch loop on the same model, batch, loss
(NLL), optimizer (AdamW) and micro-batching, alternating in one process: one rank in a Ray actor (nothing to
shard: the model runs unwrapped) and two FSDP2 ranks over gloo splitting the cores.

    python bench/train_throughput.py [--model qwen2-small] [--ranks 1,2] [--reps 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from harness import alternate, fmt, stats, write

from rl_core.contracts import batch as B
from rl_core.data.tiny_models import ensure_tiny_model

ROWS, LENGTH, MICRO, LR = 32, 128, 16, 1e-5


def make_batch(vocab: int) -> B.Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (ROWS, LENGTH), generator=g)
    attn = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": attn.float()}


class Bare:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)

    def run(self, batch: B.Batch, steps: int, micro: int = MICRO) -> list[float]:
        from rl_core.training.losses import NLLLoss

        loss_fn, out = NLLLoss(), []
        for _ in range(steps):
            start = time.perf_counter()
            self.opt.zero_grad()
            normalizer = loss_fn.count(batch)
            for mb in B.micro_batches(batch, micro):
                logits = self.model(
                    input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False
                ).logits
                loss, _ = loss_fn(mb, B.token_logprobs(logits, mb["input_ids"]), normalizer)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            out.append(time.perf_counter() - start)
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2-small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ranks", default="1,2")
    args = parser.parse_args()
    results, rows = [], []
    for ranks in (int(r) for r in args.ranks.split(",")):
        entry = measure(args, ranks)
        results.append(entry)
        o, b = entry["dtensor_step_s"], entry["bare_step_s"]
        rows.append(
            (
                args.model,
                str(ranks),
                f"{entry['tokens_per_step'] / o['median']:.0f}",
                f"{entry['tokens_per_step'] / b['median']:.0f}",
                f"**{entry['dtensor_vs_bare']:.2f}x**",
                f"{fmt(o['min'])}-{fmt(o['max'])} / {fmt(b['min'])}-{fmt(b['max'])}",
            )
        )
    write(
        "train_throughput",
        {"results": results},
        rows,
        ("model", "ranks", "DTensor tok/s", "bare PyTorch tok/s", "DTensor / bare", "s/step range (ours / bare)"),
        notes=f"{ROWS} rows x {LENGTH} tokens per optimizer step, micro-batches of {MICRO}, AdamW, NLL loss; the "
        "DTensor backend's ranks are Ray actors sharing the machine's 2 cores (one rank: unwrapped, 2 threads; two "
        "ranks: FSDP2 over gloo, 1 thread each) against the same loop in the benchmark process (2 threads).",
    )


def measure(args: argparse.Namespace, ranks: int) -> dict:
    from rl_backend_dtensor.backend import make_backend
    from rl_core.config.loader import load_config
    from rl_core.plugins.registry import Registry
    from rl_core.training.losses import NLLLoss

    model = str(ensure_tiny_model(args.model))
    registry = Registry.discover()
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(
            None,
            [
                f"run_dir={run_dir}",
                f"policy.model_name={model}",
                f"policy.train_global_batch_size={ROWS}",
                f"policy.train_micro_batch_size={MICRO}",
                f"policy.optimizer.lr={LR}",
                f"policy.num_workers={ranks}",
                "policy.max_total_sequence_length=256",
            ],
            registry,
        )
        from rl_core.distributed.cluster import init_ray

        init_ray(config.cluster, verbose=False)
        ours = make_backend(config, config.section("policy.dtensor_cfg"))
        bare = Bare(model)
        batch = make_batch(int(batch_vocab(model)))
        tokens = float(batch["attention_mask"].sum())
        ours.train(batch, NLLLoss())  # warm-up both
        bare.run(batch, 1)

        def our_steps() -> list[float]:
            out = []
            for _ in range(args.steps):
                start = time.perf_counter()
                ours.train(batch, NLLLoss())
                out.append(time.perf_counter() - start)
            return out

        times = alternate({"dtensor": our_steps, "bare": lambda: bare.run(batch, args.steps)}, args.reps)
        ours.shutdown()
    o, b = stats(times["dtensor"]), stats(times["bare"])
    return {
        "model": args.model,
        "ranks": ranks,
        "tokens_per_step": tokens,
        "dtensor_step_s": o,
        "bare_step_s": b,
        "dtensor_vs_bare": b["median"] / o["median"],
    }


def batch_vocab(model: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).vocab_size


if __name__ == "__main__":
    main()

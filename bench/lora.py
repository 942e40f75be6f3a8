"""LoRA against full fine-tuning, ours, in one run; and our LoRA step against TRL's GRPOTrainer with a peft_config.

The same GRPO work as bench/grpo_vs_trl.py (8 prompts x 8 generations, 64 new tokens, fp32, KL 0) on the small model
(~25M), with rank-16 adapters on every linear layer. Both of our sides use the HF engine (it takes adapter-only
refits; vLLM takes merged weights here). Reported per side: the refit's bytes and milliseconds (median of the step
refits), the trainer's memory for parameters + gradients + optimizer state (AdamW: two fp32 moments), counted from
the tensors the trainer holds, and the median step time; TRL's step time with the same LoRA config.

    python bench/lora.py [--model small] [--reps 2] [--steps 6] [--rank 16]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path
from typing import Any

from grpo_vs_trl import TRL, Ours
from harness import alternate, fmt, stats, write

from rl_core.data.tiny_models import ensure_tiny_model

MODELS = {"tiny": "qwen2-tiny", "small": "qwen2-small"}


def lora_overrides(rank: int) -> list[str]:
    return ["policy.lora.enabled=true", f"policy.lora.rank={rank}", f"policy.lora.alpha={2 * rank}"]


def trainer_bytes(model: Path, rank: int | None) -> dict[str, int]:
    """Parameters (all, fp32), and gradients + AdamW's two moments of the trained ones (fp32), of the model the
    trainer builds (with adapters when ``rank``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.base.schema import LoraConfig
    from rl_core.contracts import lora

    net: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if rank is not None:
        net = lora.wrap(net, LoraConfig(enabled=True, rank=rank, alpha=2 * rank), trainable=True)
    params = sum(p.numel() for p in net.parameters()) * 4
    trained = sum(p.numel() for p in net.parameters() if p.requires_grad) * 4
    return {"parameters": params, "gradients": trained, "optimizer_state": 2 * trained, "total": params + 3 * trained}


class OursRefit(Ours):
    """Our GRPO step, and each step's refit: bytes and seconds as the engine reports them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refits: list[tuple[int, float]] = []

    def run(self, steps: int) -> list[float]:
        from rl_core.training.rollouts import refit

        times = super().run(steps)
        for _ in range(3):
            stats_ = refit(self.ctx)
            self.refits.append((stats_.num_bytes, stats_.seconds))
        return times


class TRLLora(TRL):
    """TRL's GRPOTrainer with the same LoRA config (peft_config)."""

    def __init__(self, model: Path, rank: int) -> None:
        super().__init__(model, beta=0.0, bf16=False)
        self.rank = rank

    def trainer_kwargs(self) -> dict[str, Any]:
        from peft import LoraConfig

        return {"peft_config": LoraConfig(r=self.rank, lora_alpha=2 * self.rank, target_modules="all-linear")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="small")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    model = ensure_tiny_model(MODELS[args.model])
    hf = ["policy.generation.backend=hf"]
    with contextlib.ExitStack() as stack:
        full = OursRefit(model, 0.0, stack, hf)
        adapters = OursRefit(model, 0.0, stack, [*hf, *lora_overrides(args.rank)])
        trl = TRLLora(model, args.rank)
        times = alternate(
            {
                "ours LoRA": lambda: adapters.run(args.steps),
                "ours full": lambda: full.run(args.steps),
                "TRL LoRA": lambda: trl.run(args.steps),
            },
            args.reps,
        )
    memory = {"ours LoRA": trainer_bytes(model, args.rank), "ours full": trainer_bytes(model, None)}
    refits = {"ours LoRA": adapters.refits, "ours full": full.refits}
    results: dict[str, Any] = {"model": args.model, "rank": args.rank, "sides": {}}
    rows = []
    for side, samples in times.items():
        entry: dict[str, Any] = {"step_s": stats(samples)}
        if side in refits:
            entry["refit_bytes"] = statistics.median(b for b, _ in refits[side])
            entry["refit_ms"] = 1000 * statistics.median(s for _, s in refits[side])
            entry["trainer_bytes"] = memory[side]
        results["sides"][side] = entry
    lo, fu, tr = (results["sides"][k] for k in ("ours LoRA", "ours full", "TRL LoRA"))
    results["refit_bytes_ratio"] = lo["refit_bytes"] / fu["refit_bytes"]
    results["refit_speedup"] = fu["refit_ms"] / lo["refit_ms"]
    results["trainer_memory_ratio"] = lo["trainer_bytes"]["total"] / fu["trainer_bytes"]["total"]
    results["lora_vs_trl_lora_speedup"] = tr["step_s"]["median"] / lo["step_s"]["median"]
    for side in ("ours LoRA", "ours full", "TRL LoRA"):
        e = results["sides"][side]
        s = e["step_s"]
        rows.append(
            (
                side,
                f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})",
                f"{e['refit_bytes'] / 1e6:.2f} MB" if "refit_bytes" in e else "-",
                f"{e['refit_ms']:.1f}" if "refit_ms" in e else "-",
                f"{e['trainer_bytes']['total'] / 1e6:.1f} MB" if "trainer_bytes" in e else "-",
            )
        )
    write(
        "lora",
        results,
        rows,
        ("side", "s/step (min-max)", "refit bytes", "refit ms (median)", "trainer params+grads+AdamW"),
        notes=f"{args.model} model, rank {args.rank} on all linear layers, 8 prompts x 8 generations, 64 new tokens, fp32,"
        f" {args.steps} steps x {args.reps} repetitions (first of each left out); our refits: 3 after each repetition,"
        f" into the HF engine. LoRA refit moves {results['refit_bytes_ratio']:.1%} of a full refit's bytes; full refit "
        f"time / LoRA refit time: {results['refit_speedup']:.2f}x (the engine merges the adapters onto every adapted "
        f"weight, a pass over each, where a same-host full refit is one copy); trainer memory {results['trainer_memory_ratio']:.1%} of full "
        f"fine-tuning's; our LoRA step vs TRL GRPOTrainer with the same peft_config: "
        f"**{results['lora_vs_trl_lora_speedup']:.2f}x**.",
    )


if __name__ == "__main__":
    main()

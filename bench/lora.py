"""LoRA against full fine-tuning, ours, in one run; and our LoRA step against TRL's GRPOTrainer with a peft_config.

The same GRPO work as bench/grpo_vs_trl.py (8 prompts x 8 generations, 64 new tokens, fp32, KL 0) on the small model
(~25M), with rank-16 adapters on every linear layer. Both of our sides use the HF engine (it takes adapter-only
refits and merges them onto the base weights it keeps). Reported per side: the refit's bytes and milliseconds over two
routes (median of refits after each repetition, timed at the driver from packing to the engine's return):
``host_shm``, one copy through shared memory (same host), and ``broadcast``, the collective a run whose engines sit
on other hosts uses; the trainer's memory for parameters + gradients + optimizer state (AdamW: two fp32 moments),
counted from the tensors the trainer holds; the median step time; TRL's step time with the same LoRA config. And why
the engine merges: the same generate with the adapters unmerged (a ``peft`` model, one process, one thread) against
the plain model.

``--model`` is one of bench/grpo_vs_trl.py's shapes (``tiny``, ``small``, ``smollm2``: the real pretrained chat model,
with its micro-batch settings); a model other than ``small`` writes its own section, ``lora_MODEL``.

    python bench/lora.py [--model small] [--reps 2] [--steps 6] [--rank 16]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

from grpo_vs_trl import PHASES, SHAPES, TRL, Ours
from harness import alternate, fmt, stats, write

from rl_core.data.models import resolve_model_path


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


ROUTES = ("host_shm", "broadcast")


class OursRefit(Ours):
    """Our GRPO step, and refits after each repetition over each route: bytes, and seconds at the driver."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refits: dict[str, list[tuple[int, float]]] = {route: [] for route in ROUTES}

    def run(self, steps: int) -> list[float]:
        from rl_core.contracts.refit import RefitRoute

        times = super().run(steps)
        engine, backend = self.ctx.engine, self.ctx.backend
        assert engine is not None
        for route in ROUTES:
            ask = RefitRoute(
                kind=route,  # type: ignore[arg-type]
                receivers=tuple(engine.weight_receivers()),
                adapters_only=self.ctx.config.policy.lora.enabled,
            )
            for _ in range(3):
                start = time.perf_counter()
                stats_ = engine.update_weights(backend.weights_for_refit(ask))
                self.refits[route].append((stats_.num_bytes, time.perf_counter() - start))
        return times


def unmerged_decode(model: Path, rank: int, reps: int = 4) -> dict[str, float]:
    """Seconds of one HF generate (64 rows x 64 new tokens, one thread), plain model vs the same with unmerged
    rank-``rank`` adapters (``peft``), alternately: what decoding would cost an engine that applied adapters instead
    of merging them."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.base.schema import LoraConfig
    from rl_core.contracts import lora

    torch.set_num_threads(1)
    plain: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    adapted: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    adapted = lora.wrap(adapted, LoraConfig(enabled=True, rank=rank, alpha=2 * rank), trainable=False).eval()
    ids = torch.randint(5, 500, (64, 20), generator=torch.Generator().manual_seed(0))

    def seconds(m: Any) -> list[float]:
        start = time.perf_counter()
        with torch.no_grad():
            m.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=64,
                min_new_tokens=64,
                do_sample=True,
                pad_token_id=1,
            )
        return [time.perf_counter() - start]

    times = alternate({"plain": lambda: seconds(plain), "unmerged": lambda: seconds(adapted)}, reps)
    p, u = statistics.median(times["plain"]), statistics.median(times["unmerged"])
    return {"plain_s": p, "unmerged_s": u, "slowdown": u / p}


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
    parser.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True, help="TRL's LoRA side too")
    args = parser.parse_args()
    shape = SHAPES[args.model]
    model = Path(resolve_model_path(shape["model"]))
    hf = ["policy.generation.backend=hf", *shape.get("ours", [])]
    with contextlib.ExitStack() as stack:
        full = OursRefit(model, 0.0, stack, hf)
        adapters = OursRefit(model, 0.0, stack, [*hf, *lora_overrides(args.rank)])
        sides = {"ours LoRA": lambda: adapters.run(args.steps), "ours full": lambda: full.run(args.steps)}
        if args.trl:
            trl = TRLLora(model, args.rank)
            sides["TRL LoRA"] = lambda: trl.run(args.steps)
        times = alternate(sides, args.reps)
    memory = {"ours LoRA": trainer_bytes(model, args.rank), "ours full": trainer_bytes(model, None)}
    refits = {"ours LoRA": adapters.refits, "ours full": full.refits}
    ours = {"ours LoRA": adapters.rows, "ours full": full.rows}
    results: dict[str, Any] = {"model": args.model, "rank": args.rank, "sides": {}}
    for side, samples in times.items():
        entry: dict[str, Any] = {"step_s": stats(samples)}
        if side in refits:
            entry["refit_bytes"] = statistics.median(b for b, _ in refits[side][ROUTES[0]])
            entry["refit_ms"] = {r: 1000 * statistics.median(s for _, s in refits[side][r]) for r in ROUTES}
            entry["trainer_bytes"] = memory[side]
            entry["phases_s"] = {p: statistics.median(r.get(f"time/{p}", 0.0) for r in ours[side]) for p in PHASES}
            entry["trainer_peak_gib"] = max(r["train/peak_memory_gib"] for r in ours[side])
        results["sides"][side] = entry
    lo, fu = results["sides"]["ours LoRA"], results["sides"]["ours full"]
    results["refit_bytes_ratio"] = lo["refit_bytes"] / fu["refit_bytes"]
    results["refit_speedup"] = {r: fu["refit_ms"][r] / lo["refit_ms"][r] for r in ROUTES}
    results["trainer_memory_ratio"] = lo["trainer_bytes"]["total"] / fu["trainer_bytes"]["total"]
    results["lora_vs_full_speedup"] = fu["step_s"]["median"] / lo["step_s"]["median"]
    if args.trl:
        results["lora_vs_trl_lora_speedup"] = results["sides"]["TRL LoRA"]["step_s"]["median"] / lo["step_s"]["median"]
    results["unmerged_decode"] = unmerged_decode(model, args.rank, reps=2 * args.reps)
    write(
        "lora" if args.model == "small" else f"lora_{args.model}",
        results,
        [row(side, entry) for side, entry in results["sides"].items()],
        (
            "side",
            "s/step (min-max)",
            "phases (s)",
            "refit bytes",
            *(f"refit ms, {r}" for r in ROUTES),
            "trainer params+grads+AdamW",
            "trainer peak RSS",
        ),
        notes=notes(args, results),
    )


def row(side: str, e: dict[str, Any]) -> tuple[str, ...]:
    s = e["step_s"]
    return (
        side,
        f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})",
        ", ".join(f"{p} {v:.2f}" for p, v in e["phases_s"].items() if v) if "phases_s" in e else "-",
        f"{e['refit_bytes'] / 1e6:.2f} MB" if "refit_bytes" in e else "-",
        *(f"{e['refit_ms'][r]:.1f}" if "refit_ms" in e else "-" for r in ROUTES),
        f"{e['trainer_bytes']['total'] / 1e6:.1f} MB" if "trainer_bytes" in e else "-",
        f"{e['trainer_peak_gib']:.2f} GiB" if "trainer_peak_gib" in e else "-",
    )


def notes(args: argparse.Namespace, results: dict[str, Any]) -> str:
    speedup, dec = results["refit_speedup"], results["unmerged_decode"]
    return (
        f"{args.model} model, rank {args.rank} on all linear layers, 8 prompts x 8 generations, 64 new tokens, fp32,"
        f" {args.steps} steps x {args.reps} repetitions (first of each left out); refits: 3 per route after each"
        f" repetition, into the HF engine, timed at the driver. LoRA refit moves {results['refit_bytes_ratio']:.1%}"
        f" of a full refit's bytes; full refit time / LoRA refit time: {speedup['host_shm']:.2f}x over host_shm"
        f" (same host: one copy, where the engine's merge is a pass over every adapted weight), "
        f"{speedup['broadcast']:.2f}x over broadcast (the route to engines on other hosts). Applying the adapters"
        f" unmerged instead would cost every generate {dec['slowdown']:.2f}x the plain model's time"
        f" ({dec['unmerged_s']:.2f} s vs {dec['plain_s']:.2f} s for 64 x 64 tokens on one thread). Trainer memory"
        f" {results['trainer_memory_ratio']:.1%} of full fine-tuning's (params+grads+AdamW); full step time / LoRA"
        f" step time: **{results['lora_vs_full_speedup']:.2f}x**."
        + (
            f" Our LoRA step vs TRL GRPOTrainer with the same peft_config: **{results['lora_vs_trl_lora_speedup']:.2f}x**."
            if "lora_vs_trl_lora_speedup" in results
            else ""
        )
    )


if __name__ == "__main__":
    main()

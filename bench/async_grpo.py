"""Asynchronous GRPO: sync vs one_step vs bounded (max_staleness 2), and TRL's GRPOTrainer, in one run.

1. Throughput on the small model (~25M, random init, the parity prompts, 8 prompts x 8 generations x 64 new tokens,
   fp32, no validation): seconds per step as the trainer sees it (waiting for rollouts included), completions/s,
   and where the time went; TRL's GRPOTrainer on the same work. The first step of each run is left out.
2. Reward against wall-clock: the default recipe (tiny model, SFT warm-up, 60 GRPO steps) in each mode; training
   and held-out reward against seconds of GRPO, drawn to docs/images/async_grpo.png.

On 2 CPU cores both phases are compute-bound: overlap can only hide the smaller phase behind the larger one, and
the cores are split between trainer and engine while they overlap (docs/benchmarks.md says what that gives).

    python bench/async_grpo.py [--steps 6] [--skip trl,curves]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from grpo_vs_trl import GENERATIONS, NEW_TOKENS, PROMPTS, TRL, grpo_overrides
from harness import ROOT, stats, write

from rl_core.data.tiny_models import ensure_tiny_model

MODES = {
    "sync": [],
    "one_step": ["grpo.async_mode=one_step"],
    "bounded k=2": ["grpo.async_mode=bounded", "grpo.max_staleness=2"],
}
PHASES = ("wait_rollouts", "generate", "score", "logprobs", "train", "refit")


def run(overrides: list[str], run_dir: Path, registry: Any) -> list[dict[str, float]]:
    from rl_core.config.loader import load_config
    from rl_core.launch.run import run_config
    from rl_core.outputs.console import RunConsole

    config = load_config(None, [f"run_dir={run_dir}", "logger.progress=false", *overrides], registry)
    run_config(config, registry, RunConsole(progress=False), summary=False)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def throughput(steps: int, registry: Any, work: Path) -> dict[str, Any]:
    model = ensure_tiny_model("qwen2-small")
    common = [
        *grpo_overrides(model),
        f"grpo.max_num_steps={steps}",
        "grpo.val_at_start=false",
        f"grpo.val_period={steps + 1}",
        "grpo.max_val_samples=1",
    ]
    out = {}
    for mode, extra in MODES.items():
        rows = [r for r in run([*common, *extra], work / f"tp-{mode}", registry) if r["step"] > 1]
        step = stats([r["time/step"] for r in rows])
        out[mode] = {
            "step_s": step,
            "completions_per_s": PROMPTS * GENERATIONS / step["median"],
            "phases_s": {p: statistics.median(r.get(f"time/{p}", 0.0) for r in rows) for p in PHASES},
        }
    return out


def curves(registry: Any, work: Path) -> dict[str, Any]:
    out = {}
    for mode, extra in MODES.items():
        rows = run(list(extra), work / f"curve-{mode}", registry)
        clock, points = 0.0, []
        for r in rows:
            clock += r.get("time/step", 0.0)
            points.append({"seconds": clock, "reward": r.get("reward"), "val_reward": r.get("val/reward")})
        out[mode] = {"points": points, "grpo_seconds": clock, "val_reward_end": rows[-1].get("val/reward")}
    return out


def plot(curve: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, data in curve.items():
        pts = [p for p in data["points"] if p["reward"] is not None]
        (line,) = ax.plot([p["seconds"] for p in pts], [p["reward"] for p in pts], alpha=0.5, label=f"{mode}: training")
        val = [p for p in data["points"] if p["val_reward"] is not None]
        ax.plot(
            [p["seconds"] for p in val],
            [p["val_reward"] for p in val],
            "o-",
            color=line.get_color(),
            label=f"{mode}: held-out",
        )
    ax.set_xlabel("seconds of GRPO (warm-up excluded)")
    ax.set_ylabel("reward")
    ax.set_title("default recipe: reward against wall-clock, 2 CPU cores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip", default="", help="comma-separated: trl, curves")
    args = parser.parse_args()
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    skip = set(args.skip.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result: dict[str, Any] = {"throughput": throughput(args.steps, registry, work)}
        if "trl" not in skip:
            trl = stats(TRL(ensure_tiny_model("qwen2-small"), 0.0, bf16=False).run(args.steps))
            result["trl_step_s"] = trl
        if "curves" not in skip:
            result["curves"] = curves(registry, work)
            plot(result["curves"], ROOT / "docs" / "images" / "async_grpo.png")
    tp = result["throughput"]
    base = tp["sync"]["step_s"]["median"]
    rows = [
        (
            mode,
            f"{v['step_s']['median']:.2f}",
            f"{v['completions_per_s']:.1f}",
            f"**{base / v['step_s']['median']:.2f}x**",
            ", ".join(f"{p} {s:.2f}" for p, s in v["phases_s"].items() if s > 0.005),
        )
        for mode, v in tp.items()
    ]
    if "trl_step_s" in result:
        t = result["trl_step_s"]["median"]
        rows.append(("TRL GRPOTrainer", f"{t:.2f}", f"{PROMPTS * GENERATIONS / t:.1f}", f"{base / t:.2f}x", "-"))
    notes = (
        f"Small model (~25M), {PROMPTS} prompts x {GENERATIONS} generations x {NEW_TOKENS} new tokens, fp32, vLLM "
        "engine; seconds per step as the trainer sees it (median of the steps after the first). Off-policy modes "
        "split the 2 cores between trainer and engine while they overlap."
    )
    if "one_step" in tp and tp["sync"]["phases_s"].get("train"):
        slower = tp["one_step"]["phases_s"]["train"] / tp["sync"]["phases_s"]["train"]
        notes += (
            f" Where the time goes: training on its share of the cores takes {slower:.2f}x as long as on all of "
            f"them, more than the {tp['sync']['phases_s']['generate']:.2f} s of generation that overlap hides, "
            "because both phases are compute-bound on the same cores; on GPUs the engine has devices of its own."
        )
    if "curves" in result:
        ends = ", ".join(
            f"{m} {v['val_reward_end']:.3f} after {v['grpo_seconds']:.0f} s" for m, v in result["curves"].items()
        )
        notes += f" Default recipe, held-out reward at the end: {ends} (docs/images/async_grpo.png)."
    write(
        "async_grpo",
        result,
        rows,
        ("mode", "s/step", "completions/s", "vs sync", "median seconds per phase"),
        notes=notes,
    )


if __name__ == "__main__":
    main()

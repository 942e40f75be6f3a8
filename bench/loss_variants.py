"""The policy-loss family, each variant learning the default task and the calculator task: held-out reward per
validation step, in one run, against plain GRPO from the same warm-up model.

Each task's warm-up (its recipe's SFT) runs once, with plain GRPO; every other variant starts from that warm-up
model with the recipe's own settings and seed, so the rows differ only by the loss. Variants (the settings in
VARIANTS): GSPO and GSPO-token (sequence ratio, the paper's clip range 3e-4/4e-4, sequence-mean loss), CISPO, Dr.
GRPO (no std division, the generation budget as a constant normaliser), REINFORCE++ (batch-whitened raw rewards, KL
in the reward) and REINFORCE++-baseline (group mean first), and masked importance sampling against the engine's
logprobs (token, sequence, and the two-sided IcePop mask).

    python bench/loss_variants.py [--tasks default,calculator] [--variants grpo,gspo,...] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, write

TASKS: dict[str, dict[str, Any]] = {
    "default": {"recipe": None, "new_tokens": 4, "extra": []},
    # four optimizer steps per batch: the later three train on rollouts of an older policy, so the ratios (and
    # with them each variant's clipping or weighting) differ from 1; with one step per batch they are 1
    "default-4-updates": {
        "recipe": None,
        "new_tokens": 4,
        "extra": ["policy.train_global_batch_size=16", "policy.train_micro_batch_size=16"],
    },
    "calculator": {
        "recipe": ROOT / "examples" / "configs" / "grpo_calculator.yaml",
        "new_tokens": 24,
        "extra": [],
    },
}
#: each variant's settings; ``{new_tokens}`` is the task's generation budget
VARIANTS: dict[str, list[str]] = {
    "grpo": [],
    "gspo": [
        "loss_fn.importance_ratio=sequence",
        "loss_fn.token_level_loss=false",
        "loss_fn.ratio_clip_min=3e-4",
        "loss_fn.ratio_clip_max=4e-4",
    ],
    "gspo-token": [
        "loss_fn.importance_ratio=sequence_token",
        "loss_fn.token_level_loss=false",
        "loss_fn.ratio_clip_min=3e-4",
        "loss_fn.ratio_clip_max=4e-4",
    ],
    "cispo": ["loss_fn.policy_objective=cispo", "loss_fn.ratio_clip_min=1.0", "loss_fn.ratio_clip_max=0.28"],
    "dr-grpo": ["grpo.normalize_rewards=false", "loss_fn.constant_normalizer={new_tokens}"],
    "reinforce++": [
        "grpo.group_baseline=false",
        "grpo.normalize_rewards=false",
        "grpo.batch_normalize_advantages=true",
        "grpo.reward_kl_penalty=0.01",
    ],
    "reinforce++-baseline": [
        "grpo.normalize_rewards=false",
        "grpo.batch_normalize_advantages=true",
        "grpo.reward_kl_penalty=0.01",
    ],
    "masked-is-token": ["loss_fn.mismatch_mask=token", "loss_fn.mismatch_mask_high=2.0"],
    "masked-is-sequence": ["loss_fn.mismatch_mask=sequence", "loss_fn.mismatch_mask_high=2.0"],
    "icepop": ["loss_fn.mismatch_mask=token", "loss_fn.mismatch_mask_low=0.5", "loss_fn.mismatch_mask_high=2.0"],
}


def run(task: str, variant: str, work: Path, registry: Any, steps: int | None, model: str | None) -> dict[str, Any]:
    """One run of ``variant`` on ``task`` (from ``model``, else through the recipe's warm-up): its held-out reward
    per validation step, seconds, and the masked fraction where a mask is on."""
    from rl_core.config.loader import load_config
    from rl_core.launch.run import run_config
    from rl_core.outputs.console import RunConsole

    spec = TASKS[task]
    settings = [s.format(new_tokens=spec["new_tokens"]) for s in VARIANTS[variant]]
    run_dir = work / f"{task}-{variant}"
    start = ["warmup_recipe=null", f"policy.model_name={model}"] if model else []
    limit = [f"grpo.max_num_steps={steps}"] if steps else []
    overrides = [f"run_dir={run_dir}", "logger.progress=false", "checkpointing.enabled=false", *start, *limit]
    config = load_config(spec["recipe"], [*overrides, *spec["extra"], *settings], registry)
    begun = time.monotonic()
    run_config(config, registry, RunConsole(progress=False), summary=False)
    seconds = time.monotonic() - begun
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    heldout = {r["step"]: r["val/reward"] for r in rows if "val/reward" in r}
    masked = [r["train/mismatch_masked_fraction"] for r in rows if "train/mismatch_masked_fraction" in r]
    reached = next((s for s, v in sorted(heldout.items()) if v >= 0.95 and s > 0), None)
    print(f"  {task} {variant}: held-out {heldout}, {seconds:.0f} s", flush=True)
    return {
        "task": task,
        "variant": variant,
        "settings": settings,
        "heldout": heldout,
        "seconds": seconds,
        "first_step_at_0.95": reached,
        "masked_fraction_max": max(masked) if masked else None,
        "warmup_model": model if model else str(run_dir / "warmup" / "final"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    args = parser.parse_args()
    from rl_core.plugins.registry import Registry

    registry = Registry.discover()
    variants = ["grpo", *(v for v in args.variants.split(",") if v != "grpo")]
    results = []
    with tempfile.TemporaryDirectory(prefix="loss-variants-") as tmp:
        for task in args.tasks.split(","):
            first = run(task, "grpo", Path(tmp), registry, args.steps, None)
            results.append(first)
            for variant in variants[1:]:
                results.append(run(task, variant, Path(tmp), registry, args.steps, first["warmup_model"]))
    steps = sorted({s for r in results for s in r["heldout"]})
    header = ("task", "variant", *(f"step {s}" for s in steps), "first step >= 0.95", "seconds", "masked (max)")
    table = [
        (
            r["task"],
            r["variant"],
            *(f"{r['heldout'][s]:.3f}" if s in r["heldout"] else "-" for s in steps),
            str(r["first_step_at_0.95"] or "never"),
            f"{r['seconds']:.0f}",
            "-" if r["masked_fraction_max"] is None else f"{r['masked_fraction_max']:.2g}",
        )
        for r in results
    ]
    notes = (
        "Held-out reward (greedy, the recipe's validation prompts) at each validation step; every variant of a task "
        "starts from the same warm-up model (the recipe's SFT, run once) with the recipe's seed and settings, and "
        "differs only by the settings named in bench/loss_variants.py. Seconds: the run, start-up included (each "
        "task's first row, plain GRPO, also runs the warm-up). default-4-updates: the default task with "
        "train_global_batch_size 16, four optimizer steps per batch, so that ratios differ from 1 (with one step "
        "per batch they are 1 and GSPO, CISPO and the masks give GRPO's gradient up to the normaliser: the default "
        "rows agree by construction). One seed per row: a difference of one validation step is within noise. "
        "Masked (max): the largest fraction of loss tokens a mismatch mask dropped in a step; on CPU in fp32 the "
        "engine's logprobs equal the trainer's to ~1e-7, so the masks drop nothing here and the rows show only that "
        "they cost nothing; on GPUs in bf16 they act."
    )
    write("loss_variants", {"results": results}, table, header, notes)


if __name__ == "__main__":
    main()

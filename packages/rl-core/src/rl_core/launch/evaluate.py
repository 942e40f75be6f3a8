"""``rl-core eval``: a model (a finished run folder's ``final/``, or any model folder) scored on held-out prompts by
the run's reward sources (or its environment), ``k`` samples a prompt: mean reward, pass@k and maj@k with the
sampling settings that made them, every sample in ``samples.jsonl`` and the figures in ``report.json``. With its
defaults (one greedy sample, the run's seed, the rows its validation used) it runs the in-run validation's code
(``rl_core.training.rollouts.heldout_metrics``) and gives a finished run's last ``val/reward`` back exactly.

The training backend starts too (a run context has one); nothing is trained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import Config
from rl_core.config.loader import load_config
from rl_core.data.prompts import load_split
from rl_core.launch.run import open_run
from rl_core.outputs.checkpoint import atomic_write_text
from rl_core.outputs.console import RunConsole
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import AlgorithmSpec
from rl_core.training.context import Phases
from rl_core.training.rollouts import generate_and_score, heldout_metrics, response_limit, sampling
from rl_core.training.signal import signal_metrics


@attrs.frozen(kw_only=True)
class EvalSettings:
    """``k`` samples a prompt; ``temperature`` None: greedy for one sample, else ``policy.generation.temperature``;
    ``max_rows`` None: the rows the run's validation used (its algorithm's ``max_val_samples``), else all; a sample
    is correct when its reward is >= ``threshold``."""

    k: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    temperature: float | None = None
    max_rows: int | None = None
    split: str = "val"
    threshold: float = 1.0
    out: Path | None = None


def eval_config(target: Path, overrides: list[str], run_dir: Path, registry: Registry) -> Config:
    """A finished run folder: its config, with its ``final/`` model (merged, if it trained adapters) and no warm-up;
    any other folder: the built-in default recipe with that model. ``overrides`` last; ``run_dir``: the run
    context's folder."""
    fixed = [f"run_dir={run_dir}", "warmup_recipe=null"]
    if (target / "config.yaml").is_file():
        model = target / "final"
        if not (model / "config.json").is_file():
            raise InputError(
                f"{target} is a run folder without a final model ({model}): finish the run first (rl-core run), or "
                "give a model folder"
            )
        recipe: Path | None = target / "config.yaml"
        fixed += [f"policy.model_name={model}", "policy.lora.enabled=false"]
    elif (target / "config.json").is_file():
        recipe = None
        fixed.append(f"policy.model_name={target}")
    else:
        raise InputError(f"{target}: neither a run folder (config.yaml) nor a model folder (config.json)")
    config = load_config(recipe, [*fixed, *overrides], registry)
    if not registry.get(AlgorithmSpec, config.algorithm).uses_rollout:
        raise InputError(
            f"{target} is a run of {config.algorithm}, which samples nothing (no rollout engine, no reward sources in "
            f"its config); evaluate its model as a model folder with the task's data and rewards: rl-core eval "
            f"{target / 'final'} [data... reward... overrides]"
        )
    return config


def default_rows(config: Config, registry: Registry) -> int | None:
    """How many held-out rows the run's validation used: its algorithm section's ``max_val_samples``."""
    key = registry.get(AlgorithmSpec, config.algorithm).config_key
    return getattr(config.sections.get(key or ""), "max_val_samples", None)


def eval_folder(target: Path, out: Path | None) -> Path:
    """Where an evaluation writes: ``out``; else RUN/eval for a run folder, ./eval for a model folder."""
    return (out or (target / "eval" if (target / "config.yaml").is_file() else Path("eval"))).resolve()


def run_eval(
    target: Path, overrides: list[str], settings: EvalSettings, registry: Registry, console: RunConsole
) -> dict[str, Any]:
    """Evaluate ``target``; the report (also ``OUT/report.json``, samples in ``OUT/samples.jsonl``: nothing else
    is left in OUT but ``rl-core eval``'s ``logs/``, and on a failure the run context's folder ``OUT/.eval-run``)."""
    target = target.resolve()
    out = eval_folder(target, settings.out)
    # the run context's own files (config, metrics, workers' logs) go to a scratch folder, kept only on failure
    scratch = out / ".eval-run"
    config = eval_config(target, overrides, scratch, registry)
    limit = settings.max_rows if settings.max_rows is not None else default_rows(config, registry)
    rows = load_split(config.data, settings.split, registry.task)[:limit]
    if not rows:
        raise InputError(f"no {settings.split} rows to evaluate on (data.num_{settings.split}, or the data files)")
    greedy = settings.temperature is None and settings.k == 1
    with open_run(config, registry, console, trains=False) as ctx:
        params = sampling(ctx, settings.k, config.seed, greedy=greedy)
        if settings.temperature is not None:
            params = attrs.evolve(params, temperature=settings.temperature)
        scored = generate_and_score(ctx, rows, params, Phases())
    report = {
        "model": config.policy.model_name,
        "split": settings.split,
        "rows": len(rows),
        "sampling": {"k": settings.k, "temperature": params.temperature, "top_p": params.top_p, "seed": config.seed},
        "threshold": settings.threshold,
        **heldout_metrics(scored, settings.k, settings.threshold),
        **{name: float(v) for name, v in scored.metrics.items()},
        "truncated_fraction": sum(r.finish_reason == "length" for r in scored.rollouts) / len(scored.rollouts),
        **signal_metrics(scored.rollouts, scored.rewards, response_limit(ctx)),
    }
    samples = [{"row": i // settings.k, **t} for i, t in enumerate(scored.transcripts)]
    atomic_write_text(out / "samples.jsonl", "".join(json.dumps(s) + "\n" for s in samples))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return report

"""Running a config, top-down: ``run_config`` (what ``rl-core run`` calls) returns a finished run's metrics, or
opens the run and drives the chosen algorithm to the end; ``open_run`` locks the folder, prepares the run
(``prepare_run``: the checks, the warm-up, the resolved ``config.yaml``, in seconds, before any worker starts) and
builds its components (``rl_core.launch.components``)."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from rl_core.base.errors import InputError
from rl_core.base.schema import Config, dump_yaml
from rl_core.config.loader import load_config
from rl_core.config.recipes import resolve_recipe
from rl_core.data.models import check_model_folder, resolve_model_path
from rl_core.data.prompts import load_split
from rl_core.distributed.placement import detected_device
from rl_core.launch import warmup_cache
from rl_core.launch.checks import (
    check_lengths,
    check_loggers,
    check_not_past_the_end,
    check_run_folder,
    model_bytes,
    reference,
)
from rl_core.launch.components import PreparedRun, build_components
from rl_core.launch.folder import COMPLETE, finished_metrics, run_identity, run_lock
from rl_core.launch.memory import estimate_memory
from rl_core.outputs.checkpoint import atomic_folder, atomic_write_text
from rl_core.outputs.console import RunConsole
from rl_core.plugins.registry import Registry
from rl_core.plugins.selection import select
from rl_core.plugins.specs import AlgorithmSpec
from rl_core.training.context import RunContext


def run_config(
    config: Config, registry: Registry, console: RunConsole | None = None, *, summary: bool = True
) -> dict[str, float]:
    """Run ``config`` to the end (resuming from the run folder's latest checkpoint) and return final metrics. A run
    folder that holds a finished run of this config (the same config up to where it runs and how it is logged:
    ``run_identity``) is not started again: its final metrics are returned."""
    console = console or RunConsole(progress=config.logger.progress)
    run_dir, identity = Path(config.run_dir).resolve(), run_identity(config)
    done = finished_metrics(run_dir, identity, console)
    if done is not None:
        console.info(
            f"{run_dir} holds this run, finished ({COMPLETE}); nothing to do. To train again, pass another "
            f"run_dir=... or delete the folder"
        )
        if done:
            console.info(f"  final: {_brief(done)}")
        return done
    check_not_past_the_end(config, run_dir)
    with open_run(config, registry, console) as ctx:
        final = ctx.run_dir / "final" if ctx.config.checkpointing.export_final_hf else None
        registry.hook.rl_run_start(config=ctx.config, run_dir=ctx.run_dir)
        error: BaseException | None = None
        try:
            ctx.metrics = registry.get(AlgorithmSpec, ctx.config.algorithm).run(ctx)
            if final is not None:
                with atomic_folder(final) as tmp:
                    ctx.backend.export_hf(tmp)
        except BaseException as exc:
            error = exc
            raise
        finally:
            registry.hook.rl_run_end(run_dir=ctx.run_dir, metrics=ctx.metrics, error=error)
    if summary:
        checkpoints = ctx.checkpoints.root if ctx.config.checkpointing.enabled else None
        ctx.console.summary(ctx.run_dir, final=final, checkpoints=checkpoints)
    atomic_write_text(run_dir / COMPLETE, json.dumps({"config": identity, "metrics": ctx.metrics}, indent=1))
    return ctx.metrics


@contextlib.contextmanager
def open_run(
    config: Config, registry: Registry, console: RunConsole | None = None, *, trains: bool = True
) -> Iterator[RunContext]:
    """A prepared run with its components built, released when the block ends (benchmarks and tests drive steps
    themselves with it; ``run_config`` runs the algorithm in it; ``trains=False``, evaluation: an algorithm's
    critic is not started, and the trainer's memory not estimated). The run folder is locked meanwhile."""
    console = console or RunConsole(progress=config.logger.progress)
    with run_lock(Path(config.run_dir).resolve()):
        prepared = prepare_run(config, registry, console, trains=trains)
        with contextlib.ExitStack() as stack:
            yield build_components(prepared, registry, console, stack, critic=trains)


def prepare_run(config: Config, registry: Registry, console: RunConsole, *, trains: bool = True) -> PreparedRun:
    """Check and prepare ``config`` before any worker starts; runs the warm-up recipe first if there is one. With
    ``trains``, the console says what memory the trainer will need."""
    began = time.perf_counter()
    startup: dict[str, float] = {}
    run_dir = Path(config.run_dir).resolve()
    check_run_folder(run_dir)
    device = detected_device(config)
    # what a warm-up would otherwise find out only minutes later: the selection, loggers, the model and its context
    chosen = select(config, registry, device)
    check_loggers(config, registry)
    policy = config.policy
    model = resolve_model_path(policy.model_name)
    check_model_folder(model, trust_remote_code=policy.trust_remote_code)
    check_lengths(config, model, rollouts=chosen.engine is not None)
    if policy.tokenizer_name and not Path(policy.tokenizer_name).is_dir():
        raise InputError(f"policy.tokenizer_name: no tokenizer folder at {policy.tokenizer_name!r}")
    if config.warmup_recipe:
        warm = time.perf_counter()
        config = _run_warmup(config, registry, run_dir, console)
        startup["warmup"] = time.perf_counter() - warm
        policy = config.policy
        model = resolve_model_path(policy.model_name)
        check_model_folder(model, trust_remote_code=policy.trust_remote_code)
    # a checkpoint holds the weights and AdamW's two moments in fp32: about 3x the fp32 model, counted twice to
    # leave room for the next one being written
    check_run_folder(run_dir, need_bytes=6 * model_bytes(model) if config.checkpointing.enabled else 0)
    policy = attrs.evolve(policy, model_name=model)
    config = attrs.evolve(config, policy=attrs.evolve(policy, reference_model_name=reference(policy)))
    selections = select(config, registry, device)
    for split in ("train", "val"):
        load_split(config.data, split, registry.task)  # missing files, unreadable JSONL, a missing prompt field: now
    atomic_write_text(run_dir / "config.yaml", dump_yaml(config))
    console.info(f"run folder {run_dir}")
    for line in selections.lines().values():
        if not line.startswith("algorithm"):
            console.info(line)
    if trains:
        try:
            section = config.sections.get(chosen.algorithm.config_key or "")
            needs_reference = (  # the run asks for its logprobs: a KL term, or a named reference (a teacher)
                policy.reference_model_name is not None
                or config.loss_fn.reference_policy_kl_penalty > 0
                or getattr(section, "reward_kl_penalty", 0) > 0
            )
            critic = chosen.algorithm.critic is not None
            console.info(estimate_memory(config, model, reference=needs_reference, critic=critic).line())
        except Exception as exc:  # an estimate never stops a run: a model the meta device cannot build, say
            console.info(f"trainer memory: not estimated ({type(exc).__name__}: {exc})")
    random.seed(config.seed)
    import torch

    torch.manual_seed(config.seed)
    startup["prepare"] = time.perf_counter() - began - startup.get("warmup", 0.0)
    return PreparedRun(config=config, run_dir=run_dir, device=device, selections=selections, startup=startup)


def _run_warmup(config: Config, registry: Registry, run_dir: Path, console: RunConsole) -> Config:
    """Run the warm-up recipe in ``RUN_DIR/warmup`` (once: its ``final/`` is written atomically, so one that exists
    is whole), or copy it there from the cache of warm-ups built before (``rl_core.launch.warmup_cache``); return
    ``config`` starting from its final policy."""

    assert config.warmup_recipe is not None
    warmup_dir = run_dir / "warmup"
    final = warmup_dir / "final"
    if not (final / "config.json").is_file():
        warm = load_config(
            resolve_recipe(config.warmup_recipe),
            [f"run_dir={warmup_dir}", f"policy.model_name={config.policy.model_name}", f"seed={config.seed}"],
            registry,
        )
        warm = attrs.evolve(
            warm,
            cluster=config.cluster,  # where the run runs (the recipe's own section would start a local Ray)
            checkpointing=attrs.evolve(warm.checkpointing, export_final_hf=True),
            logger=attrs.evolve(warm.logger, progress=config.logger.progress),
        )
        key = warmup_cache.warmup_key(warm, registry) if config.warmup_cache else None
        if key is not None and warmup_cache.cached(key):
            shutil.rmtree(warmup_dir, ignore_errors=True)  # a warm-up killed before its end: the cache has it whole
            source = warmup_cache.restore(key, warmup_dir)
            console.info(
                f"warm-up: {config.warmup_recipe}, built before on this machine from the same recipe, model and code "
                f"(copied from {source}; warmup_cache=false trains it again)"
            )
        else:
            console.section(f"warm-up: {config.warmup_recipe}")
            metrics = run_config(warm, registry, console, summary=False)
            console.section("warm-up done: " + _brief(metrics))
            console.reset()
            if key is not None:
                warmup_cache.store(key, warmup_dir)
    return attrs.evolve(config, warmup_recipe=None, policy=attrs.evolve(config.policy, model_name=str(final)))


def _brief(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith(("val/", "train/loss")))

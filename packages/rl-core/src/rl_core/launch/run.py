"""Running a config, in two parts: ``prepare_run`` does everything that can be checked or done before any worker
starts (the run folder, the warm-up, the model folder, the data, the selection, the resolved ``config.yaml``), in
seconds; ``build_components`` builds the reward sources, loggers, Ray, the training backend and the rollout engine,
each released through one ``contextlib.ExitStack`` however the run ends (a factory that fails leaks nothing).
``run_config`` (what ``rl-core run`` calls) runs the algorithm between them and prints the summary.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from rl_core.base.errors import ConfigError, InputError, PluginError, RLCoreError
from rl_core.base.schema import Config, LoggerConfig, PolicyConfig, dump_yaml, to_dict
from rl_core.config.loader import load_config
from rl_core.config.recipes import resolve_recipe
from rl_core.contracts.protocols import MetricsLogger, TrainingBackend
from rl_core.data.models import check_model_folder, resolve_model_path
from rl_core.data.prompts import load_split
from rl_core.distributed.cluster import init_ray
from rl_core.distributed.placement import Device, detected_device
from rl_core.outputs.checkpoint import CheckpointManager, atomic_folder, atomic_write_text, verify
from rl_core.outputs.console import RunConsole
from rl_core.outputs.metrics import JsonlLogger
from rl_core.plugins.registry import Registry
from rl_core.plugins.selection import Selection, select
from rl_core.plugins.specs import (
    AlgorithmSpec,
    ComponentSpec,
    EnvironmentSpec,
    LoggerSpec,
    RewardSourceSpec,
    RolloutEngineSpec,
    TrainingBackendSpec,
)
from rl_core.rewards.combine import NamedRewardSource
from rl_core.training.context import RunContext
from rl_core.training.episodes import EnvironmentRunner
from rl_core.training.loops import refuse_past_the_end

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class PreparedRun:
    """A run checked and ready to build: the config with its model path resolved (after any warm-up)."""

    config: Config
    run_dir: Path
    device: Device
    selections: Selection


def check_run_folder(run_dir: Path, need_bytes: int = 0) -> None:
    """The run folder (and its ``checkpoints/``) can be written and has room, or a clear error now."""
    for folder in (run_dir, run_dir / "checkpoints"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".rl-core-write-test", "w") as probe:
                probe.write("ok")
            (folder / ".rl-core-write-test").unlink()
        except OSError as exc:
            raise InputError(
                f"run_dir: cannot write in {folder} ({exc.strerror or exc}); make it writable or choose another run_dir"
            ) from None
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise InputError(
            f"run_dir: {run_dir} has {free / 2**20:.0f} MiB free, and a checkpoint of this model needs about "
            f"{need_bytes / 2**20:.0f} MiB; free some space or choose another run_dir"
        )


def _model_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) or sum(
        p.stat().st_size for p in Path(path).glob("*.bin")
    )


def prepare_run(config: Config, registry: Registry, console: RunConsole) -> PreparedRun:
    """Check and prepare ``config`` before any worker starts; runs the warm-up recipe first if there is one."""
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
        config = _run_warmup(config, registry, run_dir, console)
        policy = config.policy
        model = resolve_model_path(policy.model_name)
        check_model_folder(model, trust_remote_code=policy.trust_remote_code)
    # a checkpoint holds the weights and AdamW's two moments in fp32: about 3x the fp32 model, counted twice to
    # leave room for the next one being written
    check_run_folder(run_dir, need_bytes=6 * _model_bytes(model) if config.checkpointing.enabled else 0)
    policy = attrs.evolve(policy, model_name=model)
    config = attrs.evolve(config, policy=attrs.evolve(policy, reference_model_name=reference(policy)))
    selections = select(config, registry, device)
    for split in ("train", "val"):
        load_split(config.data, split)  # missing files, unreadable JSONL, a missing prompt field: now
    atomic_write_text(run_dir / "config.yaml", dump_yaml(config))
    console.info(f"run folder {run_dir}")
    for line in selections.lines().values():
        if not line.startswith("algorithm"):
            console.info(line)
    random.seed(config.seed)
    import torch

    torch.manual_seed(config.seed)
    return PreparedRun(config=config, run_dir=run_dir, device=device, selections=selections)


def reference(policy: PolicyConfig) -> str | None:
    """``policy.reference_model_name`` resolved to a folder, checked to be a causal LM with the policy's vocabulary
    (its logprobs are compared token by token with the policy's)."""
    if policy.reference_model_name is None:
        return None
    key = "policy.reference_model_name"
    path = resolve_model_path(policy.reference_model_name, key)
    check_model_folder(path, key=key, trust_remote_code=policy.trust_remote_code)
    from transformers import AutoConfig

    sizes = [
        AutoConfig.from_pretrained(p, trust_remote_code=policy.trust_remote_code).vocab_size
        for p in (policy.model_name, path)
    ]
    if sizes[0] != sizes[1]:
        raise InputError(
            f"{key}: {path} has a vocabulary of {sizes[1]} tokens, the policy ({policy.model_name}) {sizes[0]}; the "
            "reference must share the policy's tokenizer"
        )
    return path


def check_lengths(config: Config, model: str, *, rollouts: bool) -> None:
    """``policy.max_total_sequence_length`` within the model's context, and room in it for a prompt after
    ``policy.generation.max_new_tokens``."""
    from transformers import AutoConfig

    policy = config.policy
    context = getattr(
        AutoConfig.from_pretrained(model, trust_remote_code=policy.trust_remote_code), "max_position_embeddings", None
    )
    if context is not None and policy.max_total_sequence_length > context:
        raise ConfigError(
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length}) is more than the model's context "
            f"({context}, max_position_embeddings in {model}/config.json); lower it"
        )
    new_tokens = policy.generation.max_new_tokens
    if rollouts and new_tokens >= policy.max_total_sequence_length:
        raise ConfigError(
            f"policy.generation.max_new_tokens ({new_tokens}) leaves no room for a prompt within "
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length}); lower it, or raise the other"
        )


def enabled_loggers(config: Config, registry: Registry) -> list[LoggerSpec]:
    """The registered loggers whose ``enabled_by`` flag is on (loggers without one are always on)."""
    return [
        spec
        for spec in registry.specs(LoggerSpec).values()
        if spec.enabled_by is None or _flag(to_dict(config), spec.enabled_by)
    ]


def _flag(data: Mapping[str, Any], dotted: str) -> bool:
    """The boolean at a dotted key of the config's plain data (False where it is not set)."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return bool(node)


def check_loggers(config: Config, registry: Registry) -> None:
    """Each enabled logger's modules import, or a clear error naming the flag and the package, now."""

    for spec in enabled_loggers(config, registry):
        missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise InputError(
                f"{spec.enabled_by or 'logger ' + spec.name} is on, but {', '.join(missing)} is not installed: "
                f"pip install '{spec.package or missing[0]}', or turn the logger off"
            )


def make_loggers(config: Config, registry: Registry, run_dir: Path, stack: contextlib.ExitStack) -> list[MetricsLogger]:
    """JSONL always, and every enabled logger."""
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir)]
    stack.callback(loggers[0].close)
    for spec in enabled_loggers(config, registry):
        logger = started("metrics logger", spec, lambda: spec.factory(config, run_dir))  # noqa: B023 - called now
        stack.callback(logger.close)
        loggers.append(logger)
    return loggers


def build_components(
    prepared: PreparedRun,
    registry: Registry,
    console: RunConsole,
    stack: contextlib.ExitStack,
    *,
    critic: bool = True,
) -> RunContext:
    """Build everything the algorithm needs (its critic only with ``critic``: evaluation trains nothing); whatever
    is built is released by ``stack``."""

    config, chosen = prepared.config, prepared.selections
    rewards = start_rewards(config, registry, stack) if chosen.engine is not None else []
    loggers = make_loggers(config, registry, prepared.run_dir, stack)
    init_ray(config.cluster, verbose=console.verbose)
    environment = None
    if chosen.engine is not None and config.environment.name:
        environment = start_environment(config, registry, stack)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.policy.tokenizer_name or config.policy.model_name)
    backend_spec = registry.get(TrainingBackendSpec, chosen.backend.chosen.name)
    backend = start_backend("training backend", config, backend_spec, console, stack)
    make_critic = chosen.algorithm.critic  # PPO's value model, on the same backend
    value_model = None
    if critic and make_critic is not None:
        value_model = start_backend("critic", make_critic(config), backend_spec, console, stack)
    engine = None
    if chosen.engine is not None:
        engine_spec = registry.get(RolloutEngineSpec, chosen.engine.chosen.name)
        console.info(
            f"starting the rollout engine ({engine_spec.name}, {config.policy.generation.num_replicas} replica(s))..."
        )
        engine = started(
            "rollout engine",
            engine_spec,
            lambda: engine_spec.factory(config, config.sections.get(engine_spec.config_key or "")),
        )
        stack.callback(engine.shutdown)
    return RunContext(
        config=config,
        hook=registry.hook,
        run_dir=prepared.run_dir,
        console=console,
        tokenizer=tokenizer,
        device=prepared.device,
        backend=backend,
        engine=engine,
        engine_name=_describe(chosen.engine.chosen) if chosen.engine is not None else "",
        rewards=rewards,
        checkpoints=CheckpointManager(prepared.run_dir, config.checkpointing),
        loggers=loggers,
        environment=environment,
        critic=value_model,
    )


def start_backend(
    role: str, config: Config, spec: TrainingBackendSpec, console: RunConsole, stack: contextlib.ExitStack
) -> TrainingBackend:
    """Training backend ``spec`` started with ``config`` (the run's, or a critic's from ``AlgorithmSpec.critic``),
    shut down by ``stack``."""
    console.info(f"starting the {role} ({spec.name}, {config.policy.num_workers} rank(s))...")
    backend = started(role, spec, lambda: spec.factory(config, config.sections.get(spec.config_key or "")))
    stack.callback(backend.shutdown)
    return backend


def start_rewards(config: Config, registry: Registry, stack: contextlib.ExitStack) -> list[NamedRewardSource]:
    """The reward sources ``reward.sources`` lists, each with its name and weight; closed by ``stack``."""
    rewards: list[NamedRewardSource] = []
    for entry in config.reward.sources:
        spec = registry.get(RewardSourceSpec, entry.name)
        source = started("reward source", spec, lambda: spec.factory(entry.options))  # noqa: B023 - called now
        stack.callback(source.close)
        rewards.append(NamedRewardSource(name=entry.name, weight=entry.weight, source=source))
    check_micro_batching(config, rewards)
    return rewards


def start_environment(config: Config, registry: Registry, stack: contextlib.ExitStack) -> EnvironmentRunner:
    """The multi-turn environment ``environment.name`` names, with its step workers; closed by ``stack``."""
    spec = registry.get(EnvironmentSpec, config.environment.name or "")
    options = config.environment.options
    env = started("environment", spec, lambda: spec.factory(options))
    environment = EnvironmentRunner(env, spec.name, config.environment, spec.stop_strings, spec.factory)
    stack.callback(environment.close)
    return environment


def started(kind: str, spec: ComponentSpec, factory: Callable[[], T]) -> T:
    """``factory()``, its failure named with the component, its kind and its distribution (errors that already say
    what is wrong and what to do, ``RLCoreError``, pass as they are)."""
    try:
        return factory()
    except RLCoreError:
        raise
    except Exception as exc:
        raise PluginError(
            f"{kind} {spec.name!r} ({spec.package or 'package unknown'}) failed to start: {type(exc).__name__}: {exc}"
        ) from exc


def _describe(spec: ComponentSpec) -> str:
    return f"{spec.name!r} ({spec.package})" if spec.package else repr(spec.name)


def check_micro_batching(config: Config, rewards: list[NamedRewardSource]) -> None:
    """NeMo-Aligner's constraint: a reward model that splits each request into ``inference_micro_batch_size``
    chunks over ``replicas`` data-parallel copies needs ``inference_micro_batch_size x replicas <=
    rollout_micro_batch_size`` (the rollouts of one request), or some replicas idle."""
    section: Any = config.sections.get(config.algorithm)
    rollout_mbs = getattr(section, "rollout_micro_batch_size", None)
    if rollout_mbs is None:
        return
    for named in rewards:
        report = getattr(named.source, "micro_batching", None)
        shape = report() if report is not None else None
        if shape is None:
            continue
        inference_mbs, replicas = shape
        if inference_mbs * replicas > rollout_mbs:
            raise ConfigError(
                f"{config.algorithm}.rollout_micro_batch_size ({rollout_mbs}) is smaller than reward source "
                f"{named.name!r}'s inference_micro_batch_size x replicas ({inference_mbs} x {replicas} = "
                f"{inference_mbs * replicas}): each request is split over the reward model's replicas, so some would "
                "idle. Raise rollout_micro_batch_size, or lower the reward model's inference_micro_batch_size or "
                "replicas"
            )


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``RUN_DIR/.lock`` for the run: a second run into the same folder is refused at once (two runs would
    interleave their checkpoints and metrics). The lock is the operating system's (``flock``), so a killed run
    leaves none behind."""
    import fcntl

    check_run_folder(run_dir)
    with open(run_dir / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise InputError(
                f"run_dir: {run_dir} is in use by a run still going ({holder}); wait for it, or choose another run_dir"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


@contextlib.contextmanager
def open_run(
    config: Config, registry: Registry, console: RunConsole | None = None, *, critic: bool = True
) -> Iterator[RunContext]:
    """A prepared run with its components built, released when the block ends (benchmarks and tests drive steps
    themselves with it; ``run_config`` runs the algorithm in it; ``critic=False`` leaves an algorithm's critic
    unstarted). The run folder is locked meanwhile."""
    console = console or RunConsole(progress=config.logger.progress)
    with run_lock(Path(config.run_dir).resolve()):
        prepared = prepare_run(config, registry, console)
        with contextlib.ExitStack() as stack:
            yield build_components(prepared, registry, console, stack, critic=critic)


#: written in the run folder when a run ends well: the config it ran and its final metrics.
COMPLETE = "complete.json"


def run_config(
    config: Config, registry: Registry, console: RunConsole | None = None, *, summary: bool = True
) -> dict[str, float]:
    """Run ``config`` to the end (resuming from the run folder's latest checkpoint) and return final metrics. A run
    folder that holds a finished run of this config (the same config up to where it runs and how it is logged:
    ``run_identity``) is not started again: its final metrics are returned."""
    console = console or RunConsole(progress=config.logger.progress)
    run_dir, identity = Path(config.run_dir).resolve(), run_identity(config)
    done = _finished(run_dir, identity, console)
    if done is not None:
        console.info(
            f"{run_dir} holds this run, finished ({COMPLETE}); nothing to do. To train again, pass another "
            f"run_dir=... or delete the folder"
        )
        if done:
            console.info(f"  final: {_brief(done)}")
        return done
    _refuse_past_the_end(config, run_dir)
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


def run_identity(config: Config) -> str:
    """What makes two configs the same run: the resolved config without where it runs (``run_dir``, however it is
    spelled) and how it is shown and logged (``logger``), which change no step."""
    return dump_yaml(attrs.evolve(config, run_dir=".", logger=LoggerConfig()))


def _refuse_past_the_end(config: Config, run_dir: Path) -> None:
    """Before anything starts (not once the workers have, tens of seconds later): a run folder whose newest whole
    checkpoint is past the steps this config asks for is refused (``refuse_past_the_end``). Only checkpoints past
    the end are verified here; the resume verifies the one it loads."""
    total = getattr(config.sections.get(config.algorithm), "max_num_steps", None)
    if total is None:
        return
    for checkpoint in reversed(CheckpointManager(run_dir, config.checkpointing).complete()):
        if checkpoint.step <= total:
            return
        if verify(checkpoint.path) is None:
            refuse_past_the_end(run_dir, checkpoint.step, total)


def _finished(run_dir: Path, identity: str, console: RunConsole) -> dict[str, float] | None:
    """The final metrics of a finished run of ``identity`` in ``run_dir``, else None. A ``complete.json`` that is
    not such a record is named in one line and ignored (the run goes on from its checkpoints); a folder in its place
    is an error, since the record could not be written at the end."""
    path = run_dir / COMPLETE
    if path.is_dir():
        raise InputError(f"{path} is a folder, where rl-core writes the record of a finished run; move it away")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        console.warn(f"{path} is unreadable ({exc}); ignored, the run goes on from its checkpoints")
        return None
    metrics = record.get("metrics") if isinstance(record, dict) else None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("config"), str)
        and isinstance(metrics, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values())
    ):
        console.warn(
            f"{path} is not a finished run's record (a config and numeric final metrics); ignored, the run goes on "
            "from its checkpoints"
        )
        return None
    return {k: float(v) for k, v in metrics.items()} if record["config"] == identity else None


def _run_warmup(config: Config, registry: Registry, run_dir: Path, console: RunConsole) -> Config:
    """Run the warm-up recipe in ``RUN_DIR/warmup`` (once: its ``final/`` is written atomically, so one that exists
    is whole) and return ``config`` starting from its final policy."""

    assert config.warmup_recipe is not None
    final = run_dir / "warmup" / "final"
    if not (final / "config.json").is_file():
        console.section(f"warm-up: {config.warmup_recipe}")
        warm = load_config(
            resolve_recipe(config.warmup_recipe),
            [f"run_dir={run_dir / 'warmup'}", f"policy.model_name={config.policy.model_name}", f"seed={config.seed}"],
            registry,
        )
        warm = attrs.evolve(
            warm,
            checkpointing=attrs.evolve(warm.checkpointing, export_final_hf=True),
            logger=attrs.evolve(warm.logger, progress=config.logger.progress),
        )
        metrics = run_config(warm, registry, console, summary=False)
        console.section("warm-up done: " + _brief(metrics))
        console.reset()
    return attrs.evolve(config, warmup_recipe=None, policy=attrs.evolve(config.policy, model_name=str(final)))


def _brief(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith(("val/", "train/loss")))

"""Building a run's components from the selection: reward sources, loggers, the environment, Ray, and the training
backend, critic and rollout engine (started together, so their workers load at once), each released through the
run's ``contextlib.ExitStack``; a factory that fails is named with its plugin and leaks nothing."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import attrs

from rl_core.base.errors import PluginError, RLCoreError
from rl_core.base.schema import Config
from rl_core.contracts.protocols import Environment, EpisodeDriver, MetricsLogger, TrainingBackend
from rl_core.distributed.cluster import init_ray
from rl_core.distributed.placement import Device, colocated
from rl_core.launch.checks import check_micro_batching, enabled_loggers
from rl_core.outputs.checkpoint import CheckpointManager
from rl_core.outputs.console import RunConsole
from rl_core.outputs.metrics import JsonlLogger
from rl_core.plugins.registry import Registry
from rl_core.plugins.selection import Selection
from rl_core.plugins.specs import (
    ComponentSpec,
    EnvironmentSpec,
    RewardSourceSpec,
    RolloutEngineSpec,
    TrainingBackendSpec,
)
from rl_core.rewards.combine import NamedRewardSource
from rl_core.training.context import RunContext
from rl_core.training.episodes import EnvironmentRunner

T = TypeVar("T")


class Stoppable(Protocol):
    def shutdown(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


@attrs.frozen(kw_only=True)
class PreparedRun:
    """A run checked and ready to build: the config with its model path resolved (after any warm-up)."""

    config: Config
    run_dir: Path
    device: Device
    selections: Selection
    #: seconds per start-up phase so far (``prepare``, ``warmup``); building the components adds its own.
    startup: dict[str, float] = attrs.Factory(dict)


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
    began = time.perf_counter()
    rewards = start_rewards(config, registry, stack) if chosen.engine is not None else []
    loggers = make_loggers(config, registry, prepared.run_dir, stack)
    init_ray(config.cluster, verbose=console.verbose)
    startup = {**prepared.startup, "ray": time.perf_counter() - began}
    environment = None
    if chosen.engine is not None and config.environment.name:
        environment = start_environment(config, registry, stack)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.policy.tokenizer_name or config.policy.model_name)
    backend_spec = registry.get(TrainingBackendSpec, chosen.backend.chosen.name)
    starts: dict[str, Callable[[], Any]] = {
        "backend": start_backend("training backend", config, backend_spec, console, stack)
    }
    make_critic = chosen.algorithm.critic  # PPO's value model, on the same backend
    if critic and make_critic is not None:
        starts["critic"] = start_backend("critic", make_critic(config), backend_spec, console, stack)
    if chosen.engine is not None:
        starts["engine"] = start_engine(
            config, registry.get(RolloutEngineSpec, chosen.engine.chosen.name), console, stack
        )
    # colocated on GPUs, the engine sizes its memory after the trainer has taken its own: one after the other
    began = time.perf_counter()
    models = start_all(starts, together=not colocated(config, prepared.device), seconds=startup)
    startup["workers"] = time.perf_counter() - began
    return RunContext(
        config=config,
        hook=registry.hook,
        find_task=registry.task,
        run_dir=prepared.run_dir,
        console=console,
        tokenizer=tokenizer,
        device=prepared.device,
        backend=models["backend"],
        engine=models.get("engine"),
        engine_name=_describe(chosen.engine.chosen) if chosen.engine is not None else "",
        rewards=rewards,
        checkpoints=CheckpointManager(prepared.run_dir, config.checkpointing),
        loggers=loggers,
        environment=environment,
        critic=models.get("critic"),
        startup=startup,
    )


def start_engine(
    config: Config, spec: RolloutEngineSpec, console: RunConsole, stack: contextlib.ExitStack
) -> Callable[[], Any]:
    """What starts the rollout engine, owned by ``stack``."""
    console.info(f"starting the rollout engine ({spec.name}, {config.policy.generation.num_replicas} replica(s))...")
    section = config.sections.get(spec.config_key or "")
    return owned(stack, lambda: started("rollout engine", spec, lambda: spec.factory(config, section)))


def start_all(
    starts: Mapping[str, Callable[[], Any]], *, together: bool, seconds: dict[str, float] | None = None
) -> dict[str, Any]:
    """Each of ``starts`` called, in threads at once when ``together`` (a worker group's start is mostly waiting on
    its processes: their imports and model loads then overlap), else in order; each one's time into ``seconds``.
    Every start runs to its end before the first failure (in order) is raised, so that whatever did start is
    released with the rest."""
    times = seconds if seconds is not None else {}

    def timed(name: str, start: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        try:
            return start()
        finally:
            times[name] = time.perf_counter() - began

    if not together or len(starts) < 2:
        return {name: timed(name, start) for name, start in starts.items()}
    with concurrent.futures.ThreadPoolExecutor(len(starts), thread_name_prefix="rl-core-start") as pool:
        futures = {name: pool.submit(timed, name, start) for name, start in starts.items()}
        concurrent.futures.wait(futures.values())
    return {name: future.result() for name, future in futures.items()}


def owned(stack: contextlib.ExitStack, start: Callable[[], S]) -> Callable[[], S]:
    """``start`` whose result (a backend or engine) is shut down by ``stack`` as soon as it exists."""

    def run() -> S:
        component = start()
        stack.callback(component.shutdown)
        return component

    return run


def start_backend(
    role: str, config: Config, spec: TrainingBackendSpec, console: RunConsole, stack: contextlib.ExitStack
) -> Callable[[], TrainingBackend]:
    """What starts training backend ``spec`` with ``config`` (the run's, or a critic's from
    ``AlgorithmSpec.critic``), shut down by ``stack``; the console says it is starting now."""
    console.info(f"starting the {role} ({spec.name}, {config.policy.num_workers} rank(s))...")
    return owned(
        stack, lambda: started(role, spec, lambda: spec.factory(config, config.sections.get(spec.config_key or "")))
    )


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


def start_environment(
    config: Config, registry: Registry, stack: contextlib.ExitStack
) -> EnvironmentRunner | EpisodeDriver:
    """The multi-turn environment ``environment.name`` names, with its step workers (or the episode driver its
    factory makes, an agent host say); closed by ``stack``."""
    spec = registry.get(EnvironmentSpec, config.environment.name or "")
    options = config.environment.options
    env = started("environment", spec, lambda: spec.factory(options))
    if not isinstance(env, Environment):  # an episode driver: it runs its episodes itself
        stack.callback(env.close)
        return env
    factory = cast("Callable[[Any], Environment]", spec.factory)  # it made an Environment
    environment = EnvironmentRunner(env, spec.name, config.environment, spec.stop_strings, factory)
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

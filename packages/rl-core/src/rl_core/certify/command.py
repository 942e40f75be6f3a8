"""What ``rl-core certify NAME`` runs: the component built from the registry (a backend or engine over a tiny model,
in fp32, on this machine's device; a reward source or environment with ``--option key=value``), then certified."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import yaml

from rl_core.base.errors import ConfigError, InputError, PluginError
from rl_core.certify.algorithm import certify_algorithm
from rl_core.certify.backend import certify_backend
from rl_core.certify.card import Card
from rl_core.certify.engine import certify_engine
from rl_core.certify.reward import certify_environment, certify_reward_source
from rl_core.certify.task import certify_task
from rl_core.config.loader import load_config, structure_section
from rl_core.data.prompts import TASKS, load_jsonl
from rl_core.data.tiny_models import ensure_tiny_model
from rl_core.distributed.cluster import init_ray
from rl_core.distributed.placement import detected_device
from rl_core.launch.components import started
from rl_core.plugins.specs import (
    AlgorithmSpec,
    ComponentSpec,
    EnvironmentSpec,
    RewardSourceSpec,
    RolloutEngineSpec,
    TaskSpec,
    TrainingBackendSpec,
)

if TYPE_CHECKING:
    from rl_core.base.schema import Config
    from rl_core.contracts.protocols import TrainingBackend
    from rl_core.plugins.registry import Registry

#: ``--kind`` -> the kind of record
KIND_FLAGS: dict[str, type[ComponentSpec]] = {
    "backend": TrainingBackendSpec,
    "engine": RolloutEngineSpec,
    "reward": RewardSourceSpec,
    "environment": EnvironmentSpec,
    "algorithm": AlgorithmSpec,
    "task": TaskSpec,
}


def certify(
    name: str,
    registry: Registry,
    *,
    kind: str | None = None,
    quick: bool = False,
    options: Sequence[str] = (),
    overrides: Sequence[str] = (),
    data: Path | None = None,
    work: Path,
) -> Card:
    """Build the component ``name`` from the registry and certify it: ``options`` are settings of its own section
    (or a reward source's or environment's options), ``overrides`` config overrides for the runs certify builds
    (backends, engines, algorithms). Ctrl-C returns the card so far."""
    # a task is named as data.task names it: NAME or NAME:VARIANT
    kinds = [
        k
        for flag, k in KIND_FLAGS.items()
        if (name.partition(":")[0] if k is TaskSpec else name) in registry.specs(k) and kind in (None, flag)
    ]
    if not kinds:
        raise PluginError(registry.why_missing(TrainingBackendSpec, name).replace("training backend", "component"))
    if len(kinds) > 1:
        raise PluginError(f"{name!r} is a {' and a '.join(k.words for k in kinds)}: say which with --kind")
    which = kinds[0]
    card = Card(which.words, name)
    try:
        if which is RewardSourceSpec:
            spec = registry.get(RewardSourceSpec, name)
            opts = _options(spec.config_class, f"reward source {name}", options)
            source = started("reward source", spec, lambda: spec.factory(opts))
            return certify_reward_source(source, card=card)
        if which is TaskSpec:
            return _certify_task(name, registry, options, card)
        if which is EnvironmentSpec:
            return _certify_environment(registry.get(EnvironmentSpec, name), options, data, card)
        if which is AlgorithmSpec:
            algorithm = registry.get(AlgorithmSpec, name)
            runs = [*_section_overrides(algorithm, options), *overrides]
            return certify_algorithm(algorithm, registry, work, overrides=runs, card=card)
        built = registry.get(which, name)
        runs = [*_section_overrides(built, options), *overrides]
        return _certify_ray_component(built, registry, runs, quick=quick, work=work, card=card)
    except KeyboardInterrupt:
        card.interrupted()
        return card
    except (InputError, ConfigError):
        raise  # the command line itself is wrong (an option, a file): say so, not a card
    except Exception as exc:  # what the checks could not reach: the card says where it stopped, not a traceback
        card.run("the component starts and its checks run", "no error", partial(_raise, exc))
        return card


def _raise(exc: BaseException) -> Any:
    raise exc


def _certify_environment(spec: EnvironmentSpec, options: Sequence[str], data: Path | None, card: Card) -> Card:
    """On the first rows of ``data`` (JSONL), else of the built-in task of the same name, and a few plain turns."""

    opts = _options(spec.config_class, spec.name, options)
    env = started("environment", spec, lambda: spec.factory(opts))
    if data is not None:
        rows = load_jsonl(data)[:8]
    elif spec.name in TASKS:
        rows = TASKS[spec.name](8, 0)
    else:
        raise InputError(f"give rows for environment {spec.name!r} to start episodes from: --data ROWS.jsonl")
    actions = ["<calc>12+30</calc>", "<answer>42</answer>", "50", "7", "", "hello", "<calc>1*2-3</calc>", "99"]
    return certify_environment(env, rows, actions, card=card)


def _certify_task(name: str, registry: Registry, options: Sequence[str], card: Card) -> Card:
    """On the task's rows (``--option key=value``: its ``data.task_options``), with the reward sources it names."""
    task = registry.task(name.partition(":")[0])
    given = _given(options)
    sources = {}
    for source_name in task.reward_sources:
        spec = registry.get(RewardSourceSpec, source_name)
        sources[source_name] = started("reward source", spec, partial(spec.factory, None))
    return certify_task(task, name, given, sources, card=card)


def _given(options: Sequence[str]) -> dict[str, Any]:
    """``--option key=value`` items as a dict, each value read as YAML."""
    given = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--option {item!r}: give key=value")
        given[key] = yaml.safe_load(value)
    return given


def _options(config_class: type | None, name: str, options: Sequence[str]) -> Any:
    given = _given(options)
    return structure_section(config_class, given, name) if config_class else None


def _section_overrides(spec: ComponentSpec, options: Sequence[str]) -> list[str]:
    """``--option key=value`` for a backend or engine: a setting of its own config section (validated there, so an
    unknown key is an error naming the section's keys)."""
    if options and not spec.config_key:
        raise InputError(f"{spec.words} {spec.name!r} has no config section: it takes no --option")
    out = []
    for item in options:
        key, sep, value = item.partition("=")
        if not (sep and key):
            raise InputError(f"--option {item!r}: give key=value")
        out.append(f"{spec.config_key}.{key}={value}")
    return out


@attrs.frozen(kw_only=True)
class _TinyRun:
    """Configs for a component over the tiny model: its section enabled, fp32, a small batch, under ``work``."""

    spec: ComponentSpec
    registry: Registry
    model: Path
    work: Path
    #: the component's own section settings (``--option``), applied to every config
    options: Sequence[str] = ()

    def config(self, overrides: Sequence[str], run: str) -> Config:

        selector = "policy.backend" if isinstance(self.spec, TrainingBackendSpec) else "policy.generation.backend"
        enable = [f"{self.spec.config_key}.enabled=true"] if self.spec.config_key else []
        fixed = [
            f"run_dir={self.work / run}",
            "warmup_recipe=null",
            f"policy.model_name={self.model}",
            f"{selector}={self.spec.name}",
            *enable,
            "policy.precision=float32",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=8",
            "policy.max_total_sequence_length=128",
            "policy.optimizer.lr=1e-3",
        ]
        return load_config(None, [*fixed, *self.options, *overrides], self.registry)

    def section(self, config: Config) -> Any:
        return config.sections.get(self.spec.config_key or "")


def _certify_ray_component(
    spec: Any, registry: Registry, options: Sequence[str], *, quick: bool, work: Path, card: Card
) -> Card:
    model = ensure_tiny_model("qwen2-tiny")
    tiny = _TinyRun(spec=spec, registry=registry, model=model, work=work, options=options)
    probe = tiny.config([], "probe")  # a wrong --option or override: its error now, before the heavy imports
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the reference forwards' "Loading weights" bars, above the report card
    tokenizer = AutoTokenizer.from_pretrained(model)
    init_ray(probe.cluster, verbose=False)
    if isinstance(spec, RolloutEngineSpec):
        cfg = tiny.config([], "engine")
        engine = started("rollout engine", spec, lambda: spec.factory(cfg, tiny.section(cfg)))
        try:
            adapters = cfg.policy.lora if cfg.policy.lora.enabled and getattr(engine, "takes_adapters", False) else None
            return certify_engine(
                engine, model, tokenizer, declared=spec.refit_routes, quick=quick, adapters=adapters, card=card
            )
        finally:
            engine.shutdown()
    make = _backend_maker(tiny, spec)
    variants = None
    section = tiny.section(probe)
    if not quick and section is not None and hasattr(section, "sequence_packing"):
        variants = {
            "one row per micro-batch": ["policy.train_micro_batch_size=1"],
            "two data-parallel ranks": ["policy.num_workers=2"],
            "sequence packing": [f"{spec.config_key}.sequence_packing=true"],
        }
    sgd = spec.sgd_overrides
    return certify_backend(
        make,
        model,
        tokenizer,
        work / "checkpoints",
        variants=variants,
        sgd=sgd,
        max_ranks=spec.max_ranks,
        quick=quick,
        card=card,
        starts_at_once=2 if detected_device(probe) == "cpu" else 1,  # GPUs: one backend holds them at a time
    )


def _backend_maker(tiny: _TinyRun, spec: TrainingBackendSpec) -> Callable[[Sequence[str]], TrainingBackend]:
    """Builds a fresh backend per call, each in its own run folder."""
    runs = iter(range(100))

    def make(overrides: Sequence[str]) -> TrainingBackend:
        cfg = tiny.config(overrides, f"backend-{next(runs)}")
        backend: TrainingBackend = started("training backend", spec, lambda: spec.factory(cfg, tiny.section(cfg)))
        return backend

    return make

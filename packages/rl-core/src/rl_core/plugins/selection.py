"""Selecting components: what a config selects (algorithm, training backend, rollout engine, reward sources,
environment, weight route), decided before anything is built. ``rl-core run`` prints it and ``rl-core plugins
--explain`` shows it.

The words: ``select(config, registry, device) -> Selection`` decides everything; ``choose`` decides one kind (a
``Choice``): the component named by its selector key, else the highest priority among those whose config section
has ``enabled: true``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from rl_core.base.errors import ConfigError, InputError, PluginError
from rl_core.base.schema import Config
from rl_core.distributed.placement import Device, colocated
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import AlgorithmSpec, ComponentSpec, RolloutEngineSpec, TrainingBackendSpec


@attrs.frozen(kw_only=True)
class Choice:
    """The component a config selects for one kind, and why."""

    chosen: ComponentSpec
    reason: str
    runners_up: tuple[ComponentSpec, ...] = ()

    def describe(self) -> str:
        """One line, e.g. ``training backend: megatron (priority 200; also enabled: dtensor 100)``."""
        extra = ""
        if self.runners_up:
            others = ", ".join(f"{s.name} {s.priority}" for s in self.runners_up)
            extra = f"; also enabled: {others}"
        return f"{self.chosen.words}: {self.chosen.name} ({self.reason}{extra})"


@attrs.frozen(kw_only=True)
class Selection:
    """Everything a config selects."""

    algorithm: AlgorithmSpec
    backend: Choice
    engine: Choice | None
    rewards: tuple[str, ...]
    environment: str | None
    #: how weights reach the engine (a route, or how the route is chosen at each refit).
    route: str | None

    def lines(self) -> dict[str, str]:
        """One line per choice, keyed by kind."""
        out = {"algorithm": f"algorithm: {self.algorithm.name}", "training_backend": self.backend.describe()}
        if self.engine is not None:
            out["rollout_engine"] = self.engine.describe()
            out["weight_transport"] = f"weight transport: {self.route}"
            out["reward_sources"] = "reward sources: " + (", ".join(self.rewards) or "none")
            if self.environment:
                out["environment"] = f"environment: {self.environment} (multi-turn episodes)"
        return out


def select(config: Config, registry: Registry, device: Device) -> Selection:
    """What ``config`` selects, without building anything."""
    algorithm = registry.get(AlgorithmSpec, config.algorithm)
    if config.policy.head != algorithm.head:
        raise ConfigError(
            f"algorithm {algorithm.name!r} trains a model with the {algorithm.head!r} head, but policy.head="
            f"{config.policy.head}; set policy.head={algorithm.head}"
        )
    if config.policy.head == "score" and config.policy.lora.enabled:
        raise ConfigError("policy.lora is not supported with policy.head=score yet; set policy.lora.enabled=false")
    if algorithm.check is not None:
        algorithm.check(config, device)
    backend = choose(
        registry,
        TrainingBackendSpec,
        explicit=config.policy.backend,
        enabled=enabled(config, registry, TrainingBackendSpec),
        selector_key="policy.backend",
    )
    check_declared(config, backend.chosen, None)
    if algorithm.critic is not None:
        if not (isinstance(backend.chosen, TrainingBackendSpec) and backend.chosen.score_head):
            raise ConfigError(
                f"algorithm {algorithm.name!r} trains a critic (a value model with a score head) beside the policy, "
                f"but training backend {backend.chosen.name!r} trains no score head; choose one that does "
                "(policy.backend=dtensor)"
            )
        check_declared(algorithm.critic(config), backend.chosen, None)
    engine = None
    if algorithm.uses_rollout:
        engine = choose(
            registry,
            RolloutEngineSpec,
            explicit=config.policy.generation.backend,
            enabled=enabled(config, registry, RolloutEngineSpec),
            selector_key="policy.generation.backend",
        )
        check_declared(config, None, engine.chosen)
        if not config.reward.sources and not config.environment.name:
            raise InputError(
                f"algorithm {config.algorithm!r} needs rewards: add reward.sources, e.g. [{{name: exact_match}}], or an "
                "environment (environment.name)"
            )
    return Selection(
        algorithm=algorithm,
        backend=backend,
        engine=engine,
        rewards=tuple(s.name for s in config.reward.sources),
        environment=config.environment.name if engine is not None else None,
        route=route_description(config, device) if engine is not None else None,
    )


def check_declared(config: Config, backend: ComponentSpec | None, engine: ComponentSpec | None) -> None:
    """The config asks nothing the chosen components declare they do not support: more ranks than a backend's
    ``max_ranks``, LoRA of a backend without ``lora``, a reference model of one without ``reference_model``, a
    score head of one without ``score_head``, a weight transport an engine's ``refit_routes`` leave out."""
    ranks = config.policy.num_workers
    if isinstance(backend, TrainingBackendSpec) and backend.max_ranks is not None and ranks > backend.max_ranks:
        raise ConfigError(
            f"policy.num_workers={ranks}, but training backend {backend.name!r} runs on at most {backend.max_ranks} "
            "rank(s); lower it, or choose another backend (policy.backend)"
        )
    if isinstance(backend, TrainingBackendSpec) and config.policy.lora.enabled and not backend.lora:
        raise ConfigError(
            f"policy.lora.enabled is true, but training backend {backend.name!r} does not train LoRA adapters; "
            "choose one that does (policy.backend=dtensor), or train all weights (policy.lora.enabled=false)"
        )
    if isinstance(backend, TrainingBackendSpec) and config.policy.reference_model_name and not backend.reference_model:
        raise ConfigError(
            f"policy.reference_model_name is set, but training backend {backend.name!r} loads no reference model "
            "other than the policy's own; choose one that does (policy.backend=dtensor), or unset it"
        )
    if isinstance(backend, TrainingBackendSpec) and config.policy.head == "score" and not backend.score_head:
        raise ConfigError(
            f"policy.head=score, but training backend {backend.name!r} trains no score head; choose one that does "
            "(policy.backend=dtensor)"
        )
    named = config.policy.generation.weight_transport
    if isinstance(engine, RolloutEngineSpec) and named is not None and named not in engine.refit_routes:
        raise ConfigError(
            f"policy.generation.weight_transport={named}, but rollout engine {engine.name!r} receives weights only "
            f"over {', '.join(engine.refit_routes)}; name one of those, or leave it unset"
        )


def choose(
    registry: Registry,
    kind: type[ComponentSpec],
    *,
    explicit: str | None,
    enabled: Mapping[str, bool],
    selector_key: str,
) -> Choice:
    """Pick a component of ``kind``: ``explicit`` (a name from ``selector_key``) wins; else the highest priority
    among the enabled ones (``enabled`` maps names to whether their config section enables them)."""
    specs = registry.specs(kind)
    on = sorted((specs[n] for n, flag in enabled.items() if flag and n in specs), key=lambda s: -s.priority)
    if explicit:
        chosen = registry.get(kind, explicit)
        others = tuple(s for s in on if s.name != explicit)
        return Choice(chosen=chosen, reason=f"named by {selector_key}; priority {chosen.priority}", runners_up=others)
    if not specs:
        raise PluginError(f"no {kind.words} is installed{registry.install_hint(kind)}")
    if not on:
        keys = ", ".join(f"{s.config_key}.enabled=true" for s in specs.values() if s.config_key) or "none installed"
        raise PluginError(f"no {kind.words} is enabled: set one of {keys}, or name one with {selector_key}=NAME")
    return Choice(chosen=on[0], reason=f"priority {on[0].priority}", runners_up=tuple(on[1:]))


def enabled(config: Config, registry: Registry, kind: type[ComponentSpec]) -> dict[str, bool]:
    """Which components of ``kind`` the config enables through their sections' ``enabled`` flag."""
    out: dict[str, bool] = {}
    for name, spec in registry.specs(kind).items():
        section = config.sections.get(spec.config_key) if spec.config_key else None
        out[name] = bool(getattr(section, "enabled", section is None))
    return out


def route_description(config: Config, device: Device) -> str:
    """The refit route this config gets on ``device``: a named one, or the automatic choice
    (``rl_core.contracts.refit.choose_route``)."""
    named = config.policy.generation.weight_transport
    if named is not None:
        return f"{named} (named by policy.generation.weight_transport)"
    if device == "cuda":
        return "cuda_ipc (GPU, colocated)" if colocated(config, device) else "broadcast (GPU, engine on its own GPUs)"
    return "host_shm when the engine shares the trainer's host, else object_store"

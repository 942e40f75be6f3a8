"""What a config selects (algorithm, training backend, rollout engine, reward sources, weight route), decided
before anything is built: ``rl-core run`` prints it and ``rl-core plugins --explain`` shows it."""

from __future__ import annotations

import attrs

from rl_core.config import enabled_map
from rl_core.errors import InputError
from rl_core.placement import Device, colocated
from rl_core.registry import Registry, Selection
from rl_core.schema import Config
from rl_core.specs import AlgorithmSpec


@attrs.frozen(kw_only=True)
class Selections:
    algorithm: AlgorithmSpec
    backend: Selection
    engine: Selection | None
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


def route_description(config: Config, device: Device) -> str:
    """The refit route this config gets on ``device``: a named one, or the automatic choice
    (``rl_core.refit.choose_route``)."""
    named = config.policy.generation.weight_transport
    if named is not None:
        return f"{named} (named by policy.generation.weight_transport)"
    if device == "cuda":
        return "cuda_ipc (GPU, colocated)" if colocated(config, device) else "broadcast (GPU, engine on its own GPUs)"
    return "host_shm when the engine shares the trainer's host, else object_store"


def select_components(config: Config, registry: Registry, device: Device) -> Selections:
    """What ``config`` selects, without building anything."""
    algorithm = registry.get("algorithm", config.algorithm)
    if algorithm.check is not None:
        algorithm.check(config, device)
    backend = registry.select(
        "training_backend",
        explicit=config.policy.backend,
        enabled=enabled_map(config, registry, "training_backend"),
        selector_key="policy.backend",
    )
    engine = None
    if algorithm.uses_rollout:
        engine = registry.select(
            "rollout_engine",
            explicit=config.policy.generation.backend,
            enabled=enabled_map(config, registry, "rollout_engine"),
            selector_key="policy.generation.backend",
        )
        if not config.reward.sources and not config.environment.name:
            raise InputError(
                f"algorithm {config.algorithm!r} needs rewards: add reward.sources, e.g. [{{name: exact_match}}], or an "
                "environment (environment.name)"
            )
    return Selections(
        algorithm=algorithm,
        backend=backend,
        engine=engine,
        rewards=tuple(s.name for s in config.reward.sources),
        environment=config.environment.name if engine is not None else None,
        route=route_description(config, device) if engine is not None else None,
    )

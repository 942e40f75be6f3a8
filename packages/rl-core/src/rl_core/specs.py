"""Typed records that plugins return from the registration hooks (see ``rl_core.hookspecs``).

Each record names a component, says which config section enables it (``config_key``, a dotted path such as
``policy.dtensor_cfg``) and which attrs class validates that section (``config_class``), and carries a
``factory`` that builds the component. Factories import their heavy dependencies (torch, vllm, megatron) lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


def _non_empty(_inst: object, attr: attrs.Attribute, value: str) -> None:
    if not value:
        raise ValueError(f"{attr.name} must not be empty")


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """What every registered component has in common."""

    name: str = attrs.field(validator=_non_empty)
    factory: Callable[..., Any]
    priority: int = 0
    config_key: str | None = None
    config_class: type | None = None
    description: str = ""
    #: pip requirement that provides this component, used in error messages.
    package: str = ""


@attrs.frozen(kw_only=True)
class TrainingBackendSpec(ComponentSpec):
    """A training backend. ``factory(config, section) -> TrainingBackend``.

    ``section`` is the validated instance of ``config_class`` found at ``config_key``.
    """


@attrs.frozen(kw_only=True)
class RolloutEngineSpec(ComponentSpec):
    """A rollout (generation) engine. ``factory(config, section) -> RolloutEngine``."""


@attrs.frozen(kw_only=True)
class RewardSourceSpec(ComponentSpec):
    """A reward source. ``factory(options) -> RewardSource``, ``options`` an instance of ``config_class``.

    Reward sources are listed by name under ``reward.sources``; ``config_class`` validates the keys of one
    entry (besides ``name`` and ``weight``).
    """


@attrs.frozen(kw_only=True)
class AlgorithmSpec(ComponentSpec):
    """An algorithm loop. ``factory(context) -> dict`` runs it (``context`` a ``rl_core.run.RunContext``) and
    returns the final metrics.

    ``config_key`` is the algorithm's own section (``grpo``, ``sft``, ...). ``uses_rollout`` says whether the
    loop needs a rollout engine and reward sources.
    """

    uses_rollout: bool = True


@attrs.frozen(kw_only=True)
class LoggerSpec(ComponentSpec):
    """A metrics logger. ``factory(config, run_dir) -> MetricsLogger``; enabled by ``logger.<name>_enabled``."""


@attrs.frozen(kw_only=True)
class WeightTransportSpec(ComponentSpec):
    """How weights move from a training backend to a rollout engine.

    ``supports(backend_name, engine_name, device, colocated) -> bool`` says whether this transport serves that
    pair on that device (``"cpu"`` or ``"cuda"``), with the engine on the trainer's devices or not; the registry
    picks the highest priority one that does, unless ``policy.generation.weight_transport`` names one.
    ``factory() -> WeightTransport``.
    """

    supports: Callable[[str, str, str, bool], bool] = lambda _backend, _engine, _device, _colocated: True


@attrs.frozen(kw_only=True)
class CliCommandSpec:
    """A subcommand of ``rl-core``. ``configure(parser)`` adds arguments; ``run(args) -> int`` runs it."""

    name: str = attrs.field(validator=_non_empty)
    help: str
    configure: Callable[[Any], None]
    run: Callable[[Any], int]

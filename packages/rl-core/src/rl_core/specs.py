"""Typed records that plugins return from the registration hooks (see ``rl_core.hookspecs``).

Each record names a component, says which config section enables it (``config_key``, a dotted path such as
``policy.dtensor_cfg``) and which attrs class validates that section (``config_class``), and carries a
``factory`` that builds the component. Factories import their heavy dependencies (torch, vllm, megatron) lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import argparse

    from rl_core.context import RunContext
    from rl_core.protocols import Environment, MetricsLogger, RewardSource, RolloutEngine, TrainingBackend
    from rl_core.schema import Config


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

    factory: Callable[[Config, Any], TrainingBackend]
    #: config overrides that make one optimizer step plain SGD with learning rate 1 and no clipping, so that the
    #: step's update is the gradient (``rl-core certify`` compares gradients across batch splits with them). The
    #: default fits backends that use the core's ``policy.optimizer``.
    sgd_overrides: tuple[str, ...] = (
        "policy.optimizer.name=sgd",
        "policy.optimizer.lr=1.0",
        "policy.max_grad_norm=null",
    )


@attrs.frozen(kw_only=True)
class RolloutEngineSpec(ComponentSpec):
    """A rollout (generation) engine. ``factory(config, section) -> RolloutEngine``."""

    factory: Callable[[Config, Any], RolloutEngine]


@attrs.frozen(kw_only=True)
class RewardSourceSpec(ComponentSpec):
    """A reward source. ``factory(options) -> RewardSource``, ``options`` an instance of ``config_class`` (None
    when the source takes no options).

    Reward sources are listed by name under ``reward.sources``; ``config_class`` validates the keys of one
    entry (besides ``name`` and ``weight``).
    """

    factory: Callable[[Any], RewardSource]


@attrs.frozen(kw_only=True)
class EnvironmentSpec(ComponentSpec):
    """A multi-turn environment. ``factory(options) -> Environment``, ``options`` an instance of
    ``config_class`` (the ``environment`` section's keys besides the core's), or None. ``stop_strings`` end a
    model turn (the environment acts on the turn's text)."""

    factory: Callable[[Any], Environment]
    stop_strings: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class AlgorithmSpec(ComponentSpec):
    """An algorithm loop. ``factory(context) -> dict`` runs it (``context`` a ``rl_core.context.RunContext``)
    and returns the final metrics.

    ``config_key`` is the algorithm's own section (``grpo``, ``sft``, ...). ``uses_rollout`` says whether the
    loop needs a rollout engine and reward sources. ``check(config, device)`` (``"cpu"`` or ``"cuda"``), if given,
    raises ``ConfigError`` for a config the loop cannot run on that device; it runs when components are selected,
    before any worker starts.
    """

    factory: Callable[[RunContext], dict[str, float]]
    uses_rollout: bool = True
    check: Callable[[Config, str], None] | None = None


@attrs.frozen(kw_only=True)
class LoggerSpec(ComponentSpec):
    """A metrics logger. ``factory(config, run_dir) -> MetricsLogger``; enabled by ``logger.<name>_enabled``.
    ``requires``: the modules it imports, checked (naming ``package``) before any worker starts."""

    factory: Callable[[Config, Path], MetricsLogger]
    requires: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class CliCommandSpec:
    """A subcommand of ``rl-core``. ``configure(parser)`` adds arguments; ``run(args) -> int`` runs it."""

    name: str = attrs.field(validator=_non_empty)
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

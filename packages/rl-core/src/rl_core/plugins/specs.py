"""Typed records that plugins return from the registration hooks (see ``rl_core.plugins.hookspecs``).

Each record names a component, says which config section enables it (``config_key``, a dotted path such as
``policy.dtensor_cfg``) and which attrs class validates that section (``config_class``), and carries a
``factory`` that builds the component. Factories import their heavy dependencies (torch, vllm, megatron) lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

if TYPE_CHECKING:
    import argparse

    from rl_core.base.schema import Config
    from rl_core.contracts.protocols import (
        Environment,
        EpisodeDriver,
        MetricsLogger,
        RewardSource,
        RolloutEngine,
        TrainingBackend,
    )
    from rl_core.training.context import RunContext


def _non_empty(_inst: object, attr: attrs.Attribute, value: str) -> None:
    if not value:
        raise ValueError(f"{attr.name} must not be empty")


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` as a factory that imports its module only when called, so that a plugin's
    entry-point module stays light (no torch, vllm or megatron when the registry is built)."""
    module, sep, name = target.partition(":")
    if not (module and sep and name):
        raise ValueError(f"lazy({target!r}): give 'package.module:function'")

    def factory(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    factory.__qualname__ = f"lazy({target!r})"
    return factory


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """What every registered component has in common. Each kind below sets the class variables: ``kind`` (its name
    in the registry), ``hook`` (the registration hook that returns it), ``words`` (how messages call it) and
    ``owns_section`` (whether ``config_key`` names a config section that ``config_class`` validates)."""

    kind: ClassVar[str]
    hook: ClassVar[str]
    words: ClassVar[str]
    owns_section: ClassVar[bool] = False

    name: str = attrs.field(validator=_non_empty)
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

    kind = "training_backend"
    hook = "rl_training_backends"
    words = "training backend"
    owns_section = True

    factory: Callable[[Config, Any], TrainingBackend]
    #: the most ranks (``policy.num_workers``) the backend runs on; None: any number. A config asking for more is
    #: refused before workers start, and ``rl-core certify`` skips its two-rank check (saying why).
    max_ranks: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    #: whether it trains LoRA adapters (``policy.lora``); a LoRA config for one that does not is refused before
    #: workers start.
    lora: bool = False
    #: whether it loads a reference policy other than the policy's starting weights (``policy.
    #: reference_model_name``: a teacher); a config naming one for a backend that does not is refused before
    #: workers start.
    reference_model: bool = False
    #: whether it trains a score head (``policy.head=score``: reward models); a config asking for one of a backend
    #: that does not is refused before workers start.
    score_head: bool = False
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

    kind = "rollout_engine"
    hook = "rl_rollout_engines"
    words = "rollout engine"
    owns_section = True

    factory: Callable[[Config, Any], RolloutEngine]
    #: the refit routes the engine receives (``rl_core.contracts.refit.ROUTES``): a run naming another is refused
    #: before workers start, and ``rl-core certify`` refits over exactly these (saying which it skipped).
    refit_routes: tuple[str, ...] = ("object_store", "host_shm", "broadcast", "cuda_ipc")


@attrs.frozen(kw_only=True)
class RewardSourceSpec(ComponentSpec):
    """A reward source. ``factory(options) -> RewardSource``, ``options`` an instance of ``config_class`` (None
    when the source takes no options).

    Reward sources are listed by name under ``reward.sources``; ``config_class`` validates the keys of one
    entry (besides ``name`` and ``weight``).
    """

    kind = "reward_source"
    hook = "rl_reward_sources"
    words = "reward source"

    factory: Callable[[Any], RewardSource]


@attrs.frozen(kw_only=True)
class EnvironmentSpec(ComponentSpec):
    """A multi-turn environment. ``factory(options) -> Environment`` (or an ``EpisodeDriver``, which runs the
    episodes itself), ``options`` an instance of ``config_class`` (the ``environment`` section's keys besides the
    core's), or None. ``stop_strings`` end a model turn (the environment acts on the turn's text)."""

    kind = "environment"
    hook = "rl_environments"
    words = "environment"

    factory: Callable[[Any], Environment | EpisodeDriver]
    stop_strings: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class TaskSpec(ComponentSpec):
    """Generated prompt data, chosen by ``data.task: NAME``, or ``NAME:VARIANT`` for a task with variants (one
    dataset of a procedural library). ``generate(variant, options, n, seed) -> rows`` makes ``n`` rows (dicts: the
    prompt under ``prompt``, a ``response`` for supervised warm-ups where there is one, and what the reward sources
    read) from ``seed``, the same rows for the same arguments; ``options`` is ``data.task_options``. It raises
    ``ConfigError`` for an unknown variant or a bad option, naming the key. The core draws the held-out rows from
    another seed and drops those training has."""

    kind = "task"
    hook = "rl_tasks"
    words = "task"

    generate: Callable[[str, Mapping[str, Any], int, int], list[dict[str, Any]]]
    #: whether the task is named with a variant (``NAME:VARIANT``); a task without variants refuses one.
    variants: bool = False
    #: the reward sources that score its rows (from the rows' ``response``-like answers); ``rl-core certify`` checks
    #: each on the task's rows.
    reward_sources: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class AlgorithmSpec(ComponentSpec):
    """An algorithm loop. ``run(context) -> dict`` runs it (``context`` a ``rl_core.training.context.RunContext``)
    and returns the final metrics.

    ``config_key`` is the algorithm's own section (``grpo``, ``sft``, ...). ``uses_rollout`` says whether the
    loop needs a rollout engine and reward sources. ``check(config, device)`` (``"cpu"`` or ``"cuda"``), if given,
    raises ``ConfigError`` for a config the loop cannot run on that device; it runs when components are selected,
    before any worker starts.
    """

    kind = "algorithm"
    hook = "rl_algorithms"
    words = "algorithm"
    owns_section = True

    run: Callable[[RunContext], dict[str, float]]
    uses_rollout: bool = True
    check: Callable[[Config, str], None] | None = None
    #: the model head it trains (``policy.head``: ``lm`` or ``score``); a config with another is refused.
    head: str = "lm"
    #: for a loop that trains a value model beside the policy (PPO's critic): the config its backend is started
    #: with (``policy`` holding the critic's model, ``head: score``); the run context's ``critic``.
    critic: Callable[[Config], Config] | None = None


@attrs.frozen(kw_only=True)
class LoggerSpec(ComponentSpec):
    """A metrics logger. ``factory(config, run_dir) -> MetricsLogger``. ``enabled_by``: the dotted boolean config
    key that turns it on (the core's loggers: ``logger.<name>_enabled``); None: always on. ``requires``: the modules
    it imports, checked (naming ``package``) before any worker starts."""

    kind = "logger"
    hook = "rl_loggers"
    words = "logger"

    factory: Callable[[Config, Path], MetricsLogger]
    enabled_by: str | None = None
    requires: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class CliCommandSpec:
    """A subcommand of ``rl-core``. ``configure(parser)`` adds arguments; ``run(args) -> int`` runs it."""

    kind: ClassVar[str] = "cli_command"
    hook: ClassVar[str] = "rl_cli_commands"
    words: ClassVar[str] = "CLI command"
    owns_section: ClassVar[bool] = False

    name: str = attrs.field(validator=_non_empty)
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


#: Every kind of record, declared once: the registry, the config loader and the docs derive from this tuple.
SPEC_CLASSES: tuple[type[ComponentSpec] | type[CliCommandSpec], ...] = (
    TrainingBackendSpec,
    RolloutEngineSpec,
    RewardSourceSpec,
    EnvironmentSpec,
    TaskSpec,
    AlgorithmSpec,
    LoggerSpec,
    CliCommandSpec,
)
KINDS: dict[str, type[ComponentSpec] | type[CliCommandSpec]] = {cls.kind: cls for cls in SPEC_CLASSES}

"""All hook specifications of rl_core, grouped by phase.

A plugin is a module (named by an entry point in the ``rl_core`` group) holding functions decorated with
``rl_core.hookimpl`` whose names match the specs below. Built-in parts of the core register through the same
hooks (``rl_core.plugins.builtin``).

Registration hooks are called once, when the registry is built; each implementation returns a list of typed
records (``rl_core.plugins.specs``) and the registry merges all lists, keyed by name. Two records of one kind with the
same name are an error that names both distributions.

Lifecycle hooks are called by the algorithm loops during a run; every implementation is called, and their
return values are ignored unless stated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from rl_core.base.schema import Config
    from rl_core.plugins.specs import (
        AlgorithmSpec,
        CliCommandSpec,
        EnvironmentSpec,
        LoggerSpec,
        RewardSourceSpec,
        RolloutEngineSpec,
        TaskSpec,
        TrainingBackendSpec,
    )

PROJECT = "rl_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------------------------
# Registration: called once when the registry is built. Each returns a list of records (possibly empty).
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def rl_training_backends() -> list[TrainingBackendSpec]:
    """Training backends this plugin provides.

    Selection: ``policy.backend: NAME`` picks one by name; otherwise, among the backends whose config section
    (``spec.config_key``) has ``enabled: true``, the highest ``priority`` wins and the run logs the runners-up.
    """


@hookspec
def rl_rollout_engines() -> list[RolloutEngineSpec]:
    """Rollout (generation) engines. Selected by ``policy.generation.backend`` or, if unset, by priority among
    those whose section is enabled."""


@hookspec
def rl_reward_sources() -> list[RewardSourceSpec]:
    """Reward sources (in-process scorers or clients of a reward server), listed by name in ``reward.sources``.
    The reward server hosts the same records."""


@hookspec
def rl_environments() -> list[EnvironmentSpec]:
    """Multi-turn environments, chosen by ``environment.name``. The core's ``calculator`` and ``guess_number``
    register here."""


@hookspec
def rl_tasks() -> list[TaskSpec]:
    """Generated prompt data, chosen by ``data.task`` (``NAME`` or ``NAME:VARIANT``). The core's ``parity``,
    ``addition``, ``calculator`` and the others register here."""


@hookspec
def rl_algorithms() -> list[AlgorithmSpec]:
    """Algorithm loops (``algorithm: NAME`` picks one). The core's GRPO, REINFORCE, SFT and DPO register here."""


@hookspec
def rl_loggers() -> list[LoggerSpec]:
    """Metrics loggers, enabled by ``logger.<name>_enabled: true``. JSONL is always on."""


@hookspec
def rl_cli_commands() -> list[CliCommandSpec]:
    """Subcommands added to ``rl-core`` (for example ``rl-core reward-server serve``)."""


# ---------------------------------------------------------------------------------------------------------------
# Lifecycle: called by the loops during a run.
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def rl_run_start(config: Config, run_dir: Path) -> None:
    """A run starts; ``config`` is the resolved ``rl_core.base.schema.Config``."""


@hookspec(firstresult=True)
def rl_step(step: int, algorithm: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run one step of the loop and return its metrics.

    The core's own implementation simply returns ``run()``. Plugins implement this with ``wrapper=True`` to time,
    profile or guard a step (for example to retry, or to add metrics to the returned dict).
    """


@hookspec
def rl_step_end(step: int, metrics: dict[str, float]) -> None:
    """A step ended with these metrics (already logged)."""


@hookspec
def rl_checkpoint_saved(step: int, path: Path) -> None:
    """A complete checkpoint was written (atomically) at ``path``."""


@hookspec
def rl_run_end(run_dir: Path, metrics: dict[str, float], error: BaseException | None) -> None:
    """A run ended, successfully (``error`` is None) or not."""

"""Entry point of the reasoning-gym adapter: light (reasoning-gym is imported when a task or the scorer is built)."""

from __future__ import annotations

from rl_core.api import RewardSourceSpec, TaskSpec, hookimpl, lazy
from rl_env_reasoning_gym.config import ScoreConfig


@hookimpl
def rl_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            name="reasoning_gym",
            variants=True,
            reward_sources=("reasoning_gym",),
            generate=lazy("rl_env_reasoning_gym.tasks:generate"),
            description="reasoning-gym's procedural datasets: reasoning_gym:NAME, settings in data.task_options",
            package="rl-env-reasoning-gym",
        )
    ]


@hookimpl
def rl_reward_sources() -> list[RewardSourceSpec]:
    return [
        RewardSourceSpec(
            name="reasoning_gym",
            factory=lazy("rl_env_reasoning_gym.score:make_source"),
            config_class=ScoreConfig,
            description="the dataset's own score_answer on the response's <answer> (rows of a reasoning_gym task)",
            package="rl-env-reasoning-gym",
        )
    ]

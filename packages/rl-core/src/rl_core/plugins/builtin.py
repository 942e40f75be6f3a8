"""The core's own plugin (entry point ``core``, loaded like any other): the seven algorithm loops, the rule-based
reward sources, the built-in environments and tasks, the optional metrics loggers and the plain ``rl_step``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rl_core.algorithms import distill, dpo, grpo, ppo, reinforce, reward_model, sft
from rl_core.base.errors import ConfigError
from rl_core.base.schema import Config
from rl_core.contracts.protocols import MetricsLogger, RewardSource
from rl_core.data.prompts import TASKS, Example
from rl_core.outputs.metrics import MlflowLogger, TensorBoardLogger, WandbLogger
from rl_core.plugins.hookspecs import hookimpl
from rl_core.plugins.specs import AlgorithmSpec, EnvironmentSpec, LoggerSpec, RewardSourceSpec, TaskSpec
from rl_core.rewards import environments as env
from rl_core.rewards import sources as rewards
from rl_core.rewards.sources import ExactMatchConfig, NumberMatchConfig, RegexConfig


@hookimpl
def rl_algorithms() -> list[AlgorithmSpec]:

    return [
        AlgorithmSpec(
            name="grpo",
            run=grpo.run,
            check=grpo.check,
            config_key="grpo",
            config_class=grpo.GRPOConfig,
            description="GRPO with DAPO options",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="reinforce",
            run=reinforce.run,
            check=reinforce.check,
            config_key="reinforce",
            config_class=reinforce.ReinforceConfig,
            description="REINFORCE, RLOO baseline, KL to the initial policy in the reward",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="ppo",
            run=ppo.run,
            check=ppo.check,
            critic=ppo.critic_config,
            config_key="ppo",
            config_class=ppo.PPOConfig,
            description="PPO with a learned critic (GAE, clipped value loss, whitening, critic warm-up)",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="distill",
            run=distill.run,
            check=distill.check,
            config_key="distill",
            config_class=distill.DistillConfig,
            description="on-policy distillation: per-token reverse KL to a teacher (policy.reference_model_name)",
            package="rl-core",
        ),
        *_supervised_algorithms(),
    ]


def _supervised_algorithms() -> list[AlgorithmSpec]:
    """The loops over fixed data (no rollouts)."""
    return [
        AlgorithmSpec(
            name="sft",
            run=sft.run,
            config_key="sft",
            config_class=sft.SFTConfig,
            uses_rollout=False,
            description="supervised fine-tuning",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="dpo",
            run=dpo.run,
            config_key="dpo",
            config_class=dpo.DPOConfig,
            uses_rollout=False,
            description="direct preference optimisation",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="reward_model",
            run=reward_model.run,
            config_key="reward_model",
            config_class=reward_model.RewardModelConfig,
            uses_rollout=False,
            head="score",
            description="reward-model training: Bradley-Terry on preference pairs (policy.head=score)",
            package="rl-core",
        ),
    ]


def _reward(name: str, cls_path: str, cfg_cls: type, description: str) -> RewardSourceSpec:
    def factory(options: Any) -> RewardSource:

        return getattr(rewards, cls_path)(cfg=options if options is not None else cfg_cls())

    return RewardSourceSpec(
        name=name, factory=factory, config_class=cfg_cls, description=description, package="rl-core"
    )


@hookimpl
def rl_reward_sources() -> list[RewardSourceSpec]:

    return [
        _reward("exact_match", "ExactMatch", ExactMatchConfig, "1 if the response equals metadata[answer_key]"),
        _reward("number_match", "NumberMatch", NumberMatchConfig, "1 if the first number equals the answer"),
        _reward("regex", "RegexFormat", RegexConfig, "1 if the response matches a pattern"),
    ]


@hookimpl
def rl_environments() -> list[EnvironmentSpec]:

    return [
        EnvironmentSpec(
            name="calculator",
            factory=lambda options: env.Calculator(cfg=options or env.CalculatorConfig()),
            config_class=env.CalculatorConfig,
            stop_strings=("</calc>", "</answer>"),
            description="two-digit sums with a calculator tool: <calc>a+b</calc>, then <answer>n</answer>",
            package="rl-core",
        ),
        EnvironmentSpec(
            name="guess_number",
            factory=lambda options: env.GuessNumber(cfg=options or env.GuessNumberConfig()),
            config_class=env.GuessNumberConfig,
            description="guess a secret number with higher/lower replies",
            package="rl-core",
        ),
    ]


#: the core's reward sources that score each core task's rows
_TASK_SOURCES = {
    "parity": ("exact_match",),
    "parity_format": ("exact_match",),
    "addition": ("exact_match", "number_match"),
}


def _builtin_task(name: str) -> TaskSpec:
    generate = TASKS[name]

    def rows(variant: str, options: Mapping[str, Any], n: int, seed: int) -> list[Example]:
        if options:
            raise ConfigError(f"data.task_options: the built-in task {name!r} takes none (given {sorted(options)})")
        return generate(n, seed)

    first_sentence = " ".join((generate.__doc__ or "").split()).split(". ")[0]
    return TaskSpec(
        name=name,
        generate=rows,
        reward_sources=_TASK_SOURCES.get(name, ()),
        description=first_sentence,
        package="rl-core",
    )


@hookimpl
def rl_tasks() -> list[TaskSpec]:
    return [_builtin_task(name) for name in TASKS]


def _tensorboard(config: Config, run_dir: Path) -> MetricsLogger:

    return TensorBoardLogger(run_dir)


def _wandb(config: Config, run_dir: Path) -> MetricsLogger:

    return WandbLogger(config, run_dir)


def _mlflow(config: Config, run_dir: Path) -> MetricsLogger:

    return MlflowLogger(config, run_dir)


@hookimpl
def rl_loggers() -> list[LoggerSpec]:
    return [
        LoggerSpec(
            name=name,
            factory=factory,
            enabled_by=f"logger.{name}_enabled",
            package=f"rl-core[{name}]",
            requires=(name,),
        )
        for name, factory in (("tensorboard", _tensorboard), ("wandb", _wandb), ("mlflow", _mlflow))
    ]


@hookimpl
def rl_step(step: int, algorithm: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    del step, algorithm
    return run()

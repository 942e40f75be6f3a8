"""The core's own parts, registered through the same hooks as external plugins: the four algorithm loops, the
rule-based reward sources, the optional metrics loggers and the weight transports (one per route)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import attrs

from rl_core.hookspecs import hookimpl
from rl_core.protocols import RefitRoute, RefitStats, RolloutEngine, TrainingBackend
from rl_core.specs import AlgorithmSpec, LoggerSpec, RewardSourceSpec, WeightTransportSpec


@hookimpl
def rl_algorithms() -> list[AlgorithmSpec]:
    from rl_core.algorithms import dpo, grpo, reinforce, sft

    return [
        AlgorithmSpec(
            name="grpo",
            factory=grpo.run,
            config_key="grpo",
            config_class=grpo.GRPOConfig,
            description="GRPO with DAPO options",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="reinforce",
            factory=reinforce.run,
            config_key="reinforce",
            config_class=reinforce.ReinforceConfig,
            description="REINFORCE, RLOO baseline, KL to the initial policy in the reward",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="sft",
            factory=sft.run,
            config_key="sft",
            config_class=sft.SFTConfig,
            uses_rollout=False,
            description="supervised fine-tuning",
            package="rl-core",
        ),
        AlgorithmSpec(
            name="dpo",
            factory=dpo.run,
            config_key="dpo",
            config_class=dpo.DPOConfig,
            uses_rollout=False,
            description="direct preference optimisation",
            package="rl-core",
        ),
    ]


def _reward(name: str, cls_path: str, cfg_cls: type, description: str) -> RewardSourceSpec:
    def factory(options: Any) -> Any:
        from rl_core import rewards

        return getattr(rewards, cls_path)(cfg=options if options is not None else cfg_cls())

    return RewardSourceSpec(
        name=name, factory=factory, config_class=cfg_cls, description=description, package="rl-core"
    )


@hookimpl
def rl_reward_sources() -> list[RewardSourceSpec]:
    from rl_core.rewards import ExactMatchConfig, NumberMatchConfig, RegexConfig

    return [
        _reward("exact_match", "ExactMatch", ExactMatchConfig, "1 if the response equals metadata[answer_key]"),
        _reward("number_match", "NumberMatch", NumberMatchConfig, "1 if the first number equals the answer"),
        _reward("regex", "RegexFormat", RegexConfig, "1 if the response matches a pattern"),
    ]


def _tensorboard(config: Any, run_dir: Any) -> Any:
    from rl_core.metrics import TensorBoardLogger

    return TensorBoardLogger(run_dir)


def _wandb(config: Any, run_dir: Any) -> Any:
    from rl_core.metrics import WandbLogger

    return WandbLogger(config, run_dir)


def _mlflow(config: Any, run_dir: Any) -> Any:
    from rl_core.metrics import MlflowLogger

    return MlflowLogger(config, run_dir)


@hookimpl
def rl_loggers() -> list[LoggerSpec]:
    return [
        LoggerSpec(name=name, factory=factory, config_key=f"logger.{name}_enabled", package=f"rl-core[{name}]")
        for name, factory in (("tensorboard", _tensorboard), ("wandb", _wandb), ("mlflow", _mlflow))
    ]


@attrs.frozen
class RouteTransport:
    """Asks the backend for its weights in one route's form and hands them to the engine."""

    kind: Literal["object_store", "cuda_ipc", "broadcast"]

    def refit(self, backend: TrainingBackend, engine: RolloutEngine) -> RefitStats:
        route = RefitRoute(kind=self.kind, receivers=tuple(engine.weight_receivers()))
        return engine.update_weights(backend.weights_for_refit(route))


def _serves(device: str | None, colocated: bool | None) -> Callable[[str, str, str, bool], bool]:
    """A transport's ``supports``: any backend and engine, on ``device`` and placement (None: any)."""
    return lambda _backend, _engine, d, c: device in (None, d) and colocated in (None, c)


@hookimpl
def rl_weight_transports() -> list[WeightTransportSpec]:
    routes: list[tuple[Literal["object_store", "cuda_ipc", "broadcast"], int, str | None, bool | None, str]] = [
        ("object_store", 0, None, None, "Ray shared-memory object store (any device; the CPU default)"),
        ("cuda_ipc", 20, "cuda", True, "CUDA IPC handles: the engine copies from the trainer's GPU memory (colocated)"),
        ("broadcast", 20, "cuda", False, "broadcast from trainer rank 0 to every engine process (NCCL; gloo on CPU)"),
    ]
    return [
        WeightTransportSpec(
            name=kind,
            factory=lambda kind=kind: RouteTransport(kind),
            priority=priority,
            supports=_serves(device, colocated),
            description=description,
            package="rl-core",
        )
        for kind, priority, device, colocated, description in routes
    ]


@hookimpl
def rl_step(step: int, algorithm: str, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    del step, algorithm
    return run()

"""Entry point of the Megatron backend: light (no megatron or torch at import time)."""

from __future__ import annotations

from typing import Any

import attrs

from rl_core.hookspecs import hookimpl
from rl_core.specs import CliCommandSpec, TrainingBackendSpec

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class MegatronOptimizerConfig:
    """Megatron's optimizer (with Megatron, the optimizer is configured here, not in ``policy.optimizer``)."""

    optimizer: str = "adam"
    lr: float = attrs.field(default=1e-5, validator=_pos)
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    use_distributed_optimizer: bool = False


@attrs.frozen(kw_only=True)
class MegatronSchedulerConfig:
    lr_decay_style: str = "constant"
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None


@attrs.frozen(kw_only=True)
class MegatronConfig:
    """``policy.megatron_cfg``: the megatron-core training backend."""

    enabled: bool = False
    tensor_model_parallel_size: int = attrs.field(default=1, validator=_pos)
    pipeline_model_parallel_size: int = attrs.field(default=1, validator=_pos)
    #: redo the one-time Hugging Face -> Megatron conversion even if a finished one exists.
    force_reconvert_from_hf: bool = False
    optimizer: MegatronOptimizerConfig = attrs.Factory(MegatronOptimizerConfig)
    scheduler: MegatronSchedulerConfig = attrs.Factory(MegatronSchedulerConfig)


def _factory(config: Any, section: MegatronConfig) -> Any:
    from rl_backend_megatron.backend import MegatronBackend

    return MegatronBackend(config, section)


def _configure_cli(parser: Any) -> None:
    sub = parser.add_subparsers(dest="megatron_command", required=True)
    convert = sub.add_parser("convert", help="convert a Hugging Face checkpoint once into the Megatron folder")
    convert.add_argument("hf_dir")
    convert.add_argument("--force", action="store_true", help="redo it even if a finished conversion exists")


def _run_cli(args: Any) -> int:
    from pathlib import Path

    from rl_backend_megatron.convert import convert_once

    convert_once(Path(args.hf_dir), force=args.force)
    return 0


@hookimpl
def rl_cli_commands() -> list[CliCommandSpec]:
    return [CliCommandSpec(name="megatron", help="megatron backend tools", configure=_configure_cli, run=_run_cli)]


@hookimpl
def rl_training_backends() -> list[TrainingBackendSpec]:
    return [
        TrainingBackendSpec(
            name="megatron",
            priority=200,
            config_key="policy.megatron_cfg",
            config_class=MegatronConfig,
            factory=_factory,
            description="megatron-core (TP/PP/DP) with one-time HF -> Megatron conversion",
            package="rl-backend-megatron",
        )
    ]

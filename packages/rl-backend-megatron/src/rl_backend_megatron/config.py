"""``policy.megatron_cfg``: the Megatron backend's config section (light: attrs only)."""

from __future__ import annotations

from typing import Literal

import attrs

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class MegatronOptimizerConfig:
    """Megatron's optimizer (with Megatron, the optimizer is configured here, not in ``policy.optimizer``)."""

    optimizer: str = "adam"
    lr: float = attrs.field(default=1e-5, validator=attrs.validators.gt(0.0))
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    use_distributed_optimizer: bool = False


@attrs.frozen(kw_only=True)
class MegatronSchedulerConfig:
    lr_decay_style: Literal["constant", "cosine", "linear"] = "constant"
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

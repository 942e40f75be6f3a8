"""``policy.megatron_cfg``: the Megatron backend's config section (light: attrs only)."""

from __future__ import annotations

from typing import ClassVar

import attrs

_pos = attrs.validators.gt(0)


@attrs.frozen(kw_only=True)
class MegatronConfig:
    """``policy.megatron_cfg``: the megatron-core training backend.

    The optimizer, its learning-rate schedule and gradient clipping are ``policy.optimizer``, ``policy.scheduler``
    and ``policy.max_grad_norm``, as with every backend (NeMo RL's ``megatron_cfg.optimizer`` / ``scheduler`` are
    refused with that hint, so that no setting is silently ignored)."""

    MOVED: ClassVar[dict[str, str]] = {
        "optimizer": "every backend reads policy.optimizer (name, lr, weight_decay, betas, eps) and "
        "policy.max_grad_norm; set them there",
        "scheduler": "every backend reads policy.scheduler (name, warmup_steps, total_steps, min_lr_ratio); set it there",
    }

    #: offer this backend for selection (it takes priority over DTensor when both are enabled).
    enabled: bool = False
    #: ranks each layer's weights are split over (tensor parallelism).
    tensor_model_parallel_size: int = attrs.field(default=1, validator=_pos)
    #: stages the layers are split over (pipeline parallelism).
    pipeline_model_parallel_size: int = attrs.field(default=1, validator=_pos)
    #: redo the one-time Hugging Face -> Megatron conversion even if a finished one exists.
    force_reconvert_from_hf: bool = False

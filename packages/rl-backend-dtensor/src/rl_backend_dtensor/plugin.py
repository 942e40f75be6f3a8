"""Entry point of the DTensor backend: light (no torch at import time)."""

from __future__ import annotations

from typing import Any

import attrs

from rl_core.hookspecs import hookimpl
from rl_core.specs import TrainingBackendSpec


@attrs.frozen(kw_only=True)
class DTensorConfig:
    """``policy.dtensor_cfg``: the FSDP2 (DTensor) training backend."""

    enabled: bool = True
    #: recompute activations in the backward pass (less memory, more compute).
    activation_checkpointing: bool = False
    #: pack each micro-batch's sequences into one row with per-document position ids (no padding).
    sequence_packing: bool = False
    #: bf16 compute (autocast; sharded, also bf16 parameter all-gathers) with fp32 master weights and gradient
    #: reduction.
    mixed_precision: bool = False
    #: micro-batches by token budget instead of a fixed row count.
    dynamic_batching: bool = False
    max_tokens_per_microbatch: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    #: FSDP2 CPU offload of parameters, gradients and optimizer state (useful on GPU).
    cpu_offload: bool = False
    #: torch threads per rank; unset, the machine's cores divided among the ranks.
    threads_per_worker: int | None = None


def _factory(config: Any, section: DTensorConfig) -> Any:
    from rl_backend_dtensor.backend import DTensorBackend

    return DTensorBackend(config, section)


@hookimpl
def rl_training_backends() -> list[TrainingBackendSpec]:
    return [
        TrainingBackendSpec(
            name="dtensor",
            priority=100,
            config_key="policy.dtensor_cfg",
            config_class=DTensorConfig,
            factory=_factory,
            description="PyTorch FSDP2 (DTensor) over Hugging Face models",
            package="rl-backend-dtensor",
        )
    ]

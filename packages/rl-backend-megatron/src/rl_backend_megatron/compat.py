"""megatron-core on CPU: redirect its hard-coded CUDA calls. Applied only when CUDA is absent, once per process.

megatron-core 0.16 calls ``torch.cuda.current_device()`` for buffers and RoPE, forks the CUDA RNG tracker for
dropout, builds causal masks with ``device="cuda"`` and synchronizes CUDA before writing a dist-checkpoint; on a CPU-only torch each fails with "Torch not compiled
with CUDA enabled". Each redirect below is the smallest that keeps the call meaningful on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_applied = False


def apply() -> None:
    global _applied
    import torch

    if _applied or torch.cuda.is_available():
        return
    _applied = True
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment, return-value]
    # dist-checkpointing's writer waits for device copies before writing: nothing to wait for on CPU
    torch.cuda.synchronize = lambda *args, **kwargs: None

    from megatron.core.tensor_parallel import random as mp_random

    @contextlib.contextmanager
    def fork(self: object, name: str = "model-parallel-rng") -> Iterator[None]:
        # one CPU generator: dropout and init draw from torch's default RNG
        yield

    mp_random.CudaRNGStatesTracker.fork = fork

    def manual_seed(seed: int, *args: object, **kwargs: object) -> None:
        torch.manual_seed(seed)

    mp_random.model_parallel_cuda_manual_seed = manual_seed

    from megatron.core.fusions import fused_softmax

    def causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    fused_softmax.get_default_causal_mask = causal_mask

    # the optimizer, grad clipping and the pipeline schedules create tensors with device="cuda" and call .cuda():
    # on a CPU-only torch nothing can live on CUDA, so those calls keep their tensors where they are
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    from megatron.core import utils as mcore_utils
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    shim = _CpuTorch(torch)
    for module in (optimizer, clip_grads, mcore_utils, schedules, p2p_communication, finalize_model_grads):
        module.torch = shim

    def clip_by_total_norm(
        parameters: object, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
    ) -> None:
        # the same scaling as megatron's, without its assertion that gradients live on CUDA
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        coeff = max_norm / (total_norm + 1.0e-6)
        if coeff < 1.0:
            for param in parameters:  # type: ignore[attr-defined]
                grad = getattr(param, attr, None)
                if grad is not None:
                    grad.detach().mul_(coeff)

    optimizer.clip_grad_by_total_norm_fp32 = clip_by_total_norm
    clip_grads.clip_grad_by_total_norm_fp32 = clip_by_total_norm


class _CpuTorch:
    """``torch`` as seen by a megatron module, with tensor factories' ``device="cuda"`` mapped to CPU."""

    _FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like"})

    def __init__(self, torch: object) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> object:
        value = getattr(self._torch, name)
        if name not in self._FACTORIES:
            return value

        def factory(*args: object, **kwargs: object) -> object:
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return value(*args, **kwargs)

        return factory

"""The weight formats shared by backends (producers) and engines (consumers), in Hugging Face names.

CPU: a dict ``name -> numpy array`` put into Ray's object store, which processes on a node map without copying;
bf16, which numpy lacks, travels as its int16 bits with a tag. GPU, engine and trainer on the same device: a dict
``name -> CUDA IPC handle`` (``torch.multiprocessing.reductions.reduce_tensor``); the engine rebuilds views of
the trainer's GPU tensors and copies them in, with no host round trip. ``from_shared`` reads both.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_BF16 = "bfloat16"
_IPC = "cuda_ipc"


def to_cuda_ipc(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """CUDA IPC handles of GPU tensors; the caller keeps the tensors alive until the consumer has copied them."""
    from torch.multiprocessing.reductions import reduce_tensor

    return {name: (_IPC, *reduce_tensor(t.detach().contiguous())) for name, t in state_dict.items()}


def to_shared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for name, t in state_dict.items():
        t = t.detach().cpu().contiguous()
        out[name] = (_BF16, t.view(torch.int16).numpy()) if t.dtype == torch.bfloat16 else t.numpy()
    return out


def from_shared(arrays: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs viewing the shared arrays (read-only memory: do not write into them)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, value in arrays.items():
            if isinstance(value, tuple) and value[0] == _IPC:
                rebuild, args = value[1], value[2]
                yield name, rebuild(*args)
            elif isinstance(value, tuple) and value[0] == _BF16:
                yield name, torch.from_numpy(value[1]).view(torch.bfloat16)
            else:
                yield name, torch.from_numpy(value)


def nbytes(arrays: Mapping[str, Any]) -> int:
    """Bytes behind the arrays (CUDA IPC handles count as the tensors' sizes once rebuilt: not known here, 0)."""
    return sum(
        v[1].nbytes if isinstance(v, tuple) and v[0] == _BF16 else 0 if isinstance(v, tuple) else v.nbytes
        for v in arrays.values()
    )

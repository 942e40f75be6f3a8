"""The object-store weight format shared by backends (producers) and engines (consumers).

Weights travel as a dict ``name -> numpy array`` (Hugging Face names), which Ray's object store shares between
processes on a node without copying. bf16, which numpy lacks, travels as its int16 bits with a tag.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_BF16 = "bfloat16"


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
            if isinstance(value, tuple) and value[0] == _BF16:
                yield name, torch.from_numpy(value[1]).view(torch.bfloat16)
            else:
                yield name, torch.from_numpy(value)


def nbytes(arrays: Mapping[str, Any]) -> int:
    return sum((v[1] if isinstance(v, tuple) else v).nbytes for v in arrays.values())

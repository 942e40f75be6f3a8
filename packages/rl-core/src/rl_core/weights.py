"""The weight routes shared by backends (senders) and engines (receivers), in Hugging Face names.

A weight transport names the route in a ``RefitRoute``; the backend's rank 0 turns its full weights into the
route's handle with ``RefitSender.publish`` and the engine reads it:

- ``object_store`` (CPU, the default): a dict ``name -> numpy array`` put into Ray's object store, which processes
  on a node map without copying; bf16, which numpy lacks, travels as its int16 bits with a tag.
- ``cuda_ipc`` (GPU, engine and trainer on the same device): a dict ``name -> CUDA IPC handle``
  (``torch.multiprocessing.reductions.reduce_tensor``); the engine rebuilds views of the trainer's GPU tensors and
  copies them in, with no host round trip. ``from_shared`` reads both.
- ``broadcast`` (engine on other devices or nodes): a ``BroadcastPlan`` (address, names, shapes, dtypes); rank 0
  broadcasts every tensor over a process group of its own (NCCL on GPU, gloo on CPU) that every engine process
  joins once with ``receive_broadcast``; the group is kept for later refits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rl_core.protocols import RefitRoute

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


def route_of(payload: Any) -> str:
    """``broadcast``, ``cuda_ipc`` or ``object_store``: which route made ``payload``."""
    if isinstance(payload, dict) and payload.get("kind") == "broadcast":
        return "broadcast"
    first = next(iter(payload.values()), None) if isinstance(payload, dict) else None
    return "cuda_ipc" if isinstance(first, tuple) and first[0] == _IPC else "object_store"


#: a broadcast refit: {"kind": "broadcast", "address", "port", "world_size", "backend", "tensors": [[name, shape,
#: dtype], ...]}; plain lists and strings, so it survives any RPC encoding (vLLM's msgpack included).
BroadcastPlan = dict[str, Any]

_GROUPS: dict[tuple[str, int], Any] = {}
_TIMEOUT = timedelta(minutes=10)


def _group(address: str, port: int, rank: int, world_size: int, backend: str, store: Any = None) -> Any:
    """This process's member of the refit group at ``address:port`` (made once, then reused)."""
    key = (address, port)
    if key not in _GROUPS:
        import torch.distributed as dist

        if store is None:
            store = dist.TCPStore(address, port, world_size, is_master=False, timeout=_TIMEOUT)
        if backend == "nccl":
            _GROUPS[key] = dist.ProcessGroupNCCL(store, rank, world_size, dist.ProcessGroupNCCL.Options())
        else:
            _GROUPS[key] = dist.ProcessGroupGloo(store, rank, world_size, _TIMEOUT)
    return _GROUPS[key]


class RefitSender:
    """The trainer side (rank 0) of every route. Keeps what the receivers still read: the GPU tensors behind
    CUDA IPC handles, the broadcast thread and its group, until the next refit."""

    def __init__(self) -> None:
        self._keepalive: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._store: Any = None

    def publish(self, full: Mapping[str, torch.Tensor], route: RefitRoute) -> Any:
        self.wait()
        if route.kind == "cuda_ipc":
            self._keepalive = full
            return to_cuda_ipc(full)
        if route.kind == "broadcast":
            return self._broadcast(full, route.receivers)
        import ray

        return ray.put(to_shared(full))

    def _broadcast(self, full: Mapping[str, torch.Tensor], receivers: int) -> BroadcastPlan:
        import ray
        import torch.distributed as dist

        first = next(iter(full.values()))
        backend = "nccl" if first.is_cuda else "gloo"
        if self._store is None:
            self._store = dist.TCPStore(
                ray.util.get_node_ip_address(),
                0,
                1 + receivers,
                is_master=True,
                timeout=_TIMEOUT,
                wait_for_workers=False,
            )
        address, port = ray.util.get_node_ip_address(), self._store.port
        tensors = [t.detach().contiguous() for t in full.values()]
        plan = {
            "kind": "broadcast",
            "address": address,
            "port": port,
            "world_size": 1 + receivers,
            "backend": backend,
            "tensors": [[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in zip(full, tensors)],
        }

        def send() -> None:
            try:
                group = _group(address, port, 0, 1 + receivers, backend, self._store)
                for t in tensors:
                    group.broadcast(t, 0).wait()
            except BaseException as exc:  # reported by the next wait()
                self._error = exc

        self._thread = threading.Thread(target=send, name="refit-broadcast", daemon=True)
        self._thread.start()
        return plan

    def wait(self) -> None:
        """Until the last broadcast has been sent; its failure, if any, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the last weight broadcast failed: {error}") from error
        self._keepalive = None


def receive_broadcast(plan: BroadcastPlan, rank: int, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """Join the plan's group as ``rank`` (1..receivers) and receive every tensor onto ``device``."""
    import torch

    group = _group(plan["address"], plan["port"], rank, plan["world_size"], plan["backend"])
    out = []
    for name, shape, dtype in plan["tensors"]:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(t, 0).wait()
        out.append((name, t))
    return out

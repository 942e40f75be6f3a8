"""The weight routes shared by backends (senders) and engines (receivers), in Hugging Face names.

A weight transport names the route in a ``RefitRoute``; the backend's rank 0 turns its full weights into the
route's handle with ``RefitSender.publish`` and the engine reads it:

- ``object_store`` (CPU, the default): a dict ``name -> numpy array`` put into Ray's object store, which processes
  on a node map without copying; bf16, which numpy lacks, travels as its int16 bits with a tag. When every
  receiver runs on the sender's host, the tensors are copied instead into one host shared-memory segment that the
  sender keeps across refits (a ``HostShmPlan``): a plain copy into memory already mapped, where ``ray.put`` pays
  for fresh object-store pages on every refit (~80 ms for 100 MB here).
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

if TYPE_CHECKING:
    import torch

    from rl_core.protocols import RefitRoute

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


#: an object-store refit between processes of one host: {"kind": "host_shm", "name": segment, "tensors": [[name,
#: shape, dtype, byte offset], ...]}; plain lists and strings, like ``BroadcastPlan``.
HostShmPlan = dict[str, Any]

_SEGMENTS: dict[str, Any] = {}


def _dtype_name(t: torch.Tensor) -> str:
    """``float32``, ``bfloat16``, ...: the dtype as a plain string that ``getattr(torch, name)`` reads back."""
    return str(t.dtype).removeprefix("torch.")


def _read_host_shm(plan: HostShmPlan) -> Iterator[tuple[str, torch.Tensor]]:
    """Views of the sender's segment, which stays mapped here (the sender rewrites it only at the next refit)."""
    import math

    import torch

    if plan["name"] not in _SEGMENTS:  # a new segment only when the sender outgrew its last one
        from multiprocessing import resource_tracker, shared_memory

        segment = shared_memory.SharedMemory(name=plan["name"])
        # the sender owns the segment: this process must not unlink it when it exits (Python < 3.13 would)
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
        _SEGMENTS[plan["name"]] = segment
    buf = _SEGMENTS[plan["name"]].buf
    for name, shape, dtype, offset in plan["tensors"]:
        dt, count = getattr(torch, dtype), math.prod(shape)
        t = torch.frombuffer(buf, dtype=dt, count=count, offset=offset) if count else torch.empty(0, dtype=dt)
        yield name, t.view(shape)


def from_shared(arrays: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs viewing the shared arrays or host segment (do not write into them)."""
    import warnings

    import torch

    if route_of(arrays) == "host_shm":
        yield from _read_host_shm(arrays)
        return
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
    """``broadcast``, ``host_shm``, ``cuda_ipc`` or ``object_store``: which route made ``payload``."""
    if isinstance(payload, dict) and payload.get("kind") in ("broadcast", "host_shm"):
        return str(payload["kind"])
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
        self._shm: Any = None

    def publish(self, full: Mapping[str, torch.Tensor], route: RefitRoute) -> Any:
        self.wait()
        if route.kind == "cuda_ipc":
            self._keepalive = full
            return to_cuda_ipc(full)
        if route.kind == "broadcast":
            return self._broadcast(full, len(route.receivers))
        import ray

        if route.receivers and set(route.receivers) == {ray.util.get_node_ip_address()}:
            plan = self._host_shm(full)
            if plan is not None:
                return plan
        return ray.put(to_shared(full))

    def _host_shm(self, full: Mapping[str, torch.Tensor]) -> HostShmPlan | None:
        """The weights copied into this sender's segment; None when a new segment would not fit in /dev/shm
        (containers often give it 64 MB), so that the caller uses the object store."""
        import shutil

        import torch

        tensors, offset = [], 0
        for name, t in full.items():
            tensors.append([name, list(t.shape), _dtype_name(t), offset])
            offset += -(-t.numel() * t.element_size() // 64) * 64  # 64-byte aligned
        if self._shm is None or self._shm.size < offset:
            from multiprocessing import shared_memory

            if shutil.disk_usage("/dev/shm").free < 2 * offset:
                return None
            if self._shm is not None:
                self._shm.close()
                self._shm.unlink()
            self._shm = shared_memory.SharedMemory(create=True, size=max(offset, 1))
        buffer = torch.frombuffer(self._shm.buf, dtype=torch.uint8)
        for (_name, _shape, _dtype, start), t in zip(tensors, full.values(), strict=True):
            flat = t.detach().reshape(-1).view(torch.uint8)
            buffer[start : start + flat.numel()].copy_(flat)
        return {"kind": "host_shm", "name": self._shm.name, "tensors": tensors}

    def _broadcast(self, full: Mapping[str, torch.Tensor], receivers: int) -> BroadcastPlan:
        import ray
        import torch.distributed as dist

        first = next(iter(full.values()))
        backend = "nccl" if first.is_cuda else "gloo"
        address = ray.util.get_node_ip_address()
        if self._store is None:
            self._store = dist.TCPStore(
                address, 0, 1 + receivers, is_master=True, timeout=_TIMEOUT, wait_for_workers=False
            )
        port = self._store.port
        tensors = [t.detach().contiguous() for t in full.values()]
        plan = {
            "kind": "broadcast",
            "address": address,
            "port": port,
            "world_size": 1 + receivers,
            "backend": backend,
            "tensors": [[n, list(t.shape), _dtype_name(t)] for n, t in zip(full, tensors, strict=True)],
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

"""Weight refit: how the trainer's full weights (Hugging Face names) reach every engine process.

The route of a refit is decided in one place, ``choose_route``, by the backend's rank 0 (the sender, which knows
its own host and device) from what the driver asks for (``RefitRoute``: a route named in
``policy.generation.weight_transport`` or none, the receivers' hosts, colocation). ``RefitSender.publish`` then
returns a payload record that carries its kind, and a receiver reads any payload with ``receive_weights``, which
dispatches with one ``match``:

- ``ObjectStoreWeights`` (``object_store``): a dict ``name -> numpy array`` in Ray's object store (``ref``; any
  host). bf16, which numpy lacks, travels as its int16 bits with a tag.
- ``HostShmWeights`` (``host_shm``): every receiver runs on the sender's host, so the tensors are copied into one
  host shared-memory segment that the sender keeps across refits: a plain copy into memory already mapped, where
  ``ray.put`` pays for fresh object-store pages on every refit (~80 ms for 100 MB on a 2-core CPU).
- ``CudaIpcWeights`` (``cuda_ipc``): CUDA IPC handles of the trainer's GPU tensors; a receiver on the same GPU
  rebuilds views and copies them, with no host round trip.
- ``BroadcastWeights`` (``broadcast``): rank 0 broadcasts every tensor over a process group of its own (NCCL on
  GPU, gloo on CPU); each engine process joins it once as receiver ``rank`` (1..receivers) and keeps it.
- ``FileWeights`` (``file``): a safetensors file on the receiver's host. Never chosen by the sender: an engine
  uses it to hand an object-store payload on to a process of its own outside Ray (vLLM's engine core).

With ``RefitRoute.verify`` the sender adds a checksum per tensor (``checksum``) and receivers report the same
checksums of what they received (``RefitStats.checksums``), so that the driver can tell a refit that moved the
wrong bytes, or none, from a good one.

Weight transports are not a plugin kind: the sending side runs in backend workers and the receiving side in engine
processes (sometimes outside Ray), so a third-party route would have to be importable, and agree, in three kinds of
process. The backend and engine plugins are the extension points; they support every route through this module.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Literal

import attrs

from rl_core.base.errors import InputError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

RouteKind = Literal["object_store", "host_shm", "cuda_ipc", "broadcast"]
ROUTES: tuple[RouteKind, ...] = ("object_store", "host_shm", "cuda_ipc", "broadcast")


@attrs.frozen(kw_only=True)
class RefitRoute:
    """What the driver asks of a refit: a route (``kind``; None: chosen by ``choose_route``), the host (IP) of every
    engine process that receives (``RolloutEngine.weight_receivers()``), whether the engine shares the trainer's
    GPUs, whether to add per-tensor checksums, and whether to send only LoRA adapters' tensors (to an engine that
    takes adapters; others get whole, merged weights)."""

    kind: RouteKind | None = None
    receivers: tuple[str, ...] = ()
    colocated: bool = False
    verify: bool = False
    adapters_only: bool = False


@attrs.frozen(kw_only=True)
class RefitStats:
    """What a refit moved and how long it took; ``checksums`` of the tensors received (when asked to verify)."""

    num_bytes: int
    num_tensors: int
    seconds: float
    route: str = ""
    checksums: Mapping[str, float] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class TensorMeta:
    """Name, shape, dtype name (``getattr(torch, dtype)`` reads it back) and byte offset in a segment."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int = 0


def _checksums_field() -> Any:
    return attrs.field(default=None, kw_only=True)


@attrs.frozen
class ObjectStoreWeights:
    kind: Literal["object_store"] = attrs.field(default="object_store", init=False)
    #: a Ray ObjectRef of ``{name: numpy array or ("bfloat16", int16 array)}``.
    ref: Any
    checksums: Mapping[str, float] | None = _checksums_field()


@attrs.frozen
class HostShmWeights:
    kind: Literal["host_shm"] = attrs.field(default="host_shm", init=False)
    segment: str
    tensors: tuple[TensorMeta, ...]
    checksums: Mapping[str, float] | None = _checksums_field()


@attrs.frozen
class CudaIpcWeights:
    kind: Literal["cuda_ipc"] = attrs.field(default="cuda_ipc", init=False)
    #: ``name -> (rebuild function, args)`` from ``torch.multiprocessing.reductions.reduce_tensor``.
    handles: Mapping[str, tuple[Any, tuple[Any, ...]]]
    checksums: Mapping[str, float] | None = _checksums_field()


@attrs.frozen
class BroadcastWeights:
    kind: Literal["broadcast"] = attrs.field(default="broadcast", init=False)
    address: str
    port: int
    #: 1 + the number of receivers.
    world_size: int
    backend: Literal["nccl", "gloo"]
    tensors: tuple[TensorMeta, ...]
    checksums: Mapping[str, float] | None = _checksums_field()


@attrs.frozen
class FileWeights:
    kind: Literal["file"] = attrs.field(default="file", init=False)
    #: a safetensors file on the receiver's host.
    path: str
    checksums: Mapping[str, float] | None = _checksums_field()


RefitPayload = ObjectStoreWeights | HostShmWeights | CudaIpcWeights | BroadcastWeights | FileWeights


def choose_route(route: RefitRoute, *, sender_host: str, on_gpu: bool, shm_fits: bool) -> RouteKind:
    """The route of one refit; the only place it is decided.

    A route named in config is taken as it is, except ``host_shm`` when a receiver is on another host or the
    segment does not fit in /dev/shm (containers often give it 64 MB): then ``object_store``, with a warning.
    Unnamed: on GPU ``cuda_ipc`` when colocated, else ``broadcast``; on CPU ``host_shm`` when every receiver is on
    the sender's host and the segment fits, else ``object_store``.
    """
    same_host = bool(route.receivers) and set(route.receivers) == {sender_host}
    match route.kind:
        case None if on_gpu:
            return "cuda_ipc" if route.colocated else "broadcast"
        case None:
            return "host_shm" if same_host and shm_fits else "object_store"
        case "host_shm" if not (same_host and shm_fits):
            why = "a receiver is on another host" if not same_host else "/dev/shm has too little room"
            log.warning("weight transport host_shm cannot be used (%s); using object_store", why)
            return "object_store"
        case kind:
            return kind


def checksum(t: torch.Tensor) -> float:
    """A position-sensitive checksum of a tensor's values: ``sum_i x_i * (1 + i mod 997)`` in float64. It differs
    when values are shifted, scaled, zeroed or stale; it is the same for the same values on any device (up to
    float64 rounding of the sum)."""
    import torch

    flat = t.detach().reshape(-1).to(torch.float64)
    weights = torch.arange(flat.numel(), dtype=torch.float64, device=flat.device).remainder_(997).add_(1.0)
    return float(torch.dot(flat, weights)) if flat.numel() else 0.0


def checksums_match(sent: Mapping[str, float], received: Mapping[str, float], rtol: float = 1e-9) -> list[str]:
    """Names whose checksums differ (or are missing on the receiving side)."""
    return [
        name
        for name, value in sent.items()
        if name not in received or not math.isclose(received[name], value, rel_tol=rtol, abs_tol=1e-9)
    ]


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _metas(full: Mapping[str, torch.Tensor], aligned: bool) -> tuple[list[TensorMeta], int]:
    """Each tensor's meta; with ``aligned``, consecutive 64-byte-aligned offsets, and the total size."""
    metas, offset = [], 0
    for name, t in full.items():
        metas.append(TensorMeta(name=name, shape=tuple(t.shape), dtype=_dtype_name(t), offset=offset if aligned else 0))
        if aligned:
            offset += -(-t.numel() * t.element_size() // 64) * 64
    return metas, offset


def _to_arrays(full: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for name, t in full.items():
        t = t.detach().cpu().contiguous()
        out[name] = ("bfloat16", t.view(torch.int16).numpy()) if t.dtype == torch.bfloat16 else t.numpy()
    return out


def _from_arrays(arrays: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, value in arrays.items():
            if isinstance(value, tuple):
                yield name, torch.from_numpy(value[1]).view(torch.bfloat16)
            else:
                yield name, torch.from_numpy(value)


_SEGMENTS: dict[str, Any] = {}


def _attach(segment: str) -> Any:
    """The sender's segment ``segment``, mapped here untracked: the sender owns it (it unlinks it when it closes), so
    this process's resource tracker must neither unlink it at exit nor hear of it at all. Python < 3.13 registers
    every attach; unregistering afterwards, as one would, breaks a tracker shared with the sender (the same process,
    or a child that inherited it): the sender's unlink then makes it print a ``KeyError`` traceback. 3.13's
    ``track=False`` is this."""
    from multiprocessing import resource_tracker, shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=segment, track=False)  # type: ignore[call-arg,unused-ignore]
    register = resource_tracker.register

    def register_others(name: Any, rtype: str) -> None:
        if not (rtype == "shared_memory" and name.lstrip("/") == segment.lstrip("/")):
            register(name, rtype)

    resource_tracker.register = register_others
    try:
        return shared_memory.SharedMemory(name=segment)
    finally:
        resource_tracker.register = register


def _read_host_shm(payload: HostShmWeights) -> Iterator[tuple[str, torch.Tensor]]:
    """Views of the sender's segment, which stays mapped here (the sender rewrites it only at the next refit)."""
    import torch

    if payload.segment not in _SEGMENTS:  # a new segment only when the sender outgrew its last one
        _SEGMENTS[payload.segment] = _attach(payload.segment)
    buf = _SEGMENTS[payload.segment].buf
    for meta in payload.tensors:
        dt, count = getattr(torch, meta.dtype), math.prod(meta.shape)
        t = torch.frombuffer(buf, dtype=dt, count=count, offset=meta.offset) if count else torch.empty(0, dtype=dt)
        yield meta.name, t.view(meta.shape)


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


def receive_weights(payload: RefitPayload, *, rank: int = 1, device: Any = "cpu") -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor behind ``payload``. ``rank`` is this process's receiver rank on the
    broadcast route (1..receivers: replica ``r``'s tensor-parallel rank ``t`` is ``1 + r * tp + t``); ``device``
    is where broadcast tensors land. Object-store and shared-memory tensors are read-only views: copy them in, do
    not write into them."""
    import torch

    match payload:
        case ObjectStoreWeights(ref=ref):
            import ray

            return list(_from_arrays(ray.get(ref)))
        case HostShmWeights():
            return list(_read_host_shm(payload))
        case CudaIpcWeights(handles=handles):
            return [(name, rebuild(*args)) for name, (rebuild, args) in handles.items()]
        case BroadcastWeights():
            group = _group(payload.address, payload.port, rank, payload.world_size, payload.backend)
            out = []
            for meta in payload.tensors:
                t = torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), device=device)
                group.broadcast(t, 0).wait()
                out.append((meta.name, t))
            return out
        case FileWeights(path=path):
            from safetensors.torch import load_file

            return list(load_file(path).items())
        case _:
            raise InputError(
                f"not a refit payload: {type(payload).__name__} (see rl_core.contracts.refit.RefitPayload)"
            )


def received_stats(
    named: list[tuple[str, torch.Tensor]], payload: RefitPayload, seconds: float
) -> tuple[int, int, float, str, dict[str, float]]:
    """What an engine process reports after loading ``named``: (bytes, tensors, seconds, route, checksums) as plain
    values (they cross RPC boundaries); checksums only when the sender sent its own."""
    sums = {name: checksum(t) for name, t in named} if payload.checksums is not None else {}
    return sum(t.numel() * t.element_size() for _, t in named), len(named), seconds, payload.kind, sums


def _shm_free() -> int:

    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:  # no /dev/shm on this system
        return 0


def replicas_stats(results: list[tuple[Any, ...]], seconds: float) -> RefitStats:
    """One ``RefitStats`` from every engine process's ``received_stats``: the first one's sizes and route, and
    its checksums, except that a tensor whose checksum differs between processes gets NaN (so it fails the check:
    some process holds other weights)."""
    num_bytes, tensors, _seconds, route, sums = results[0]
    merged = dict(sums)
    for other in results[1:]:
        for name, value in other[4].items():
            if name not in merged or not math.isclose(merged[name], value, rel_tol=1e-9, abs_tol=1e-9):
                merged[name] = float("nan")
        for name in set(merged) - set(other[4]):
            merged[name] = float("nan")
    return RefitStats(num_bytes=num_bytes, num_tensors=tensors, seconds=seconds, route=route, checksums=merged)


class RefitSender:
    """The trainer side (rank 0) of every route. Keeps what receivers still read (the GPU tensors behind CUDA IPC
    handles, the broadcast thread and its group, the shared-memory segment) until ``release`` or the next refit."""

    def __init__(self) -> None:
        self._keepalive: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._store: Any = None
        self._shm: Any = None

    def publish(self, full: Mapping[str, torch.Tensor], route: RefitRoute) -> RefitPayload:
        """The payload of ``full`` on the route ``choose_route`` decides."""
        import ray

        self.release()
        metas, size = _metas(full, aligned=True)
        fits = (self._shm is not None and self._shm.size >= size) or _shm_free() >= 2 * size
        on_gpu = bool(full) and next(iter(full.values())).is_cuda
        kind = choose_route(route, sender_host=ray.util.get_node_ip_address(), on_gpu=on_gpu, shm_fits=fits)
        sums = {name: checksum(t) for name, t in full.items()} if route.verify else None
        match kind:
            case "cuda_ipc":
                from torch.multiprocessing.reductions import reduce_tensor

                tensors = {name: t.detach().contiguous() for name, t in full.items()}
                self._keepalive = tensors
                return CudaIpcWeights({n: reduce_tensor(t) for n, t in tensors.items()}, checksums=sums)
            case "broadcast":
                return self._broadcast(full, len(route.receivers), sums)
            case "host_shm":
                return self._host_shm(full, metas, size, sums)
            case "object_store":
                return ObjectStoreWeights(ray.put(_to_arrays(full)), checksums=sums)

    def _host_shm(
        self, full: Mapping[str, torch.Tensor], metas: list[TensorMeta], size: int, sums: Mapping[str, float] | None
    ) -> HostShmWeights:
        import torch

        if self._shm is None or self._shm.size < size:
            if self._shm is not None:
                self._shm.close()
                self._shm.unlink()
            self._shm = shared_memory.SharedMemory(create=True, size=max(size, 1))
        buffer = torch.frombuffer(self._shm.buf, dtype=torch.uint8)
        for meta, t in zip(metas, full.values(), strict=True):
            flat = t.detach().reshape(-1).view(torch.uint8)
            buffer[meta.offset : meta.offset + flat.numel()].copy_(flat)
        return HostShmWeights(self._shm.name, tuple(metas), checksums=sums)

    def _broadcast(
        self, full: Mapping[str, torch.Tensor], receivers: int, sums: Mapping[str, float] | None
    ) -> BroadcastWeights:
        import ray
        import torch.distributed as dist

        if receivers < 1:
            raise InputError("a broadcast refit needs at least one receiver (RefitRoute.receivers)")
        tensors = [t.detach().contiguous() for t in full.values()]
        backend: Literal["nccl", "gloo"] = "nccl" if tensors and tensors[0].is_cuda else "gloo"
        address = ray.util.get_node_ip_address()
        if self._store is None:
            self._store = dist.TCPStore(
                address, 0, 1 + receivers, is_master=True, timeout=_TIMEOUT, wait_for_workers=False
            )
        port = int(self._store.port)
        metas, _ = _metas(full, aligned=False)

        def send() -> None:
            try:
                group = _group(address, port, 0, 1 + receivers, backend, self._store)
                for t in tensors:
                    group.broadcast(t, 0).wait()
            except BaseException as exc:  # reported by the next release()
                self._error = exc

        self._thread = threading.Thread(target=send, name="refit-broadcast", daemon=True)
        self._thread.start()
        return BroadcastWeights(address, port, 1 + receivers, backend, tuple(metas), checksums=sums)

    def release(self, timeout: float | None = None) -> None:
        """Wait until the last broadcast was sent and drop what the receivers no longer read (call it once the engine
        has loaded the weights, e.g. before offloading the trainer). A failed broadcast is raised here; one still
        under way after ``timeout`` seconds is abandoned (its receivers never joined) and raised as a TimeoutError."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._thread, self._store = None, None  # the next broadcast rendezvouses afresh
                raise TimeoutError(
                    f"the weight broadcast did not finish within {timeout:g} s: its receivers never joined the group "
                    "(an engine that does not receive over the broadcast route?)"
                )
            self._thread = None
        self._keepalive = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the last weight broadcast failed: {error}") from error

    def close(self) -> None:
        """Release everything, the shared-memory segment included (when no refit will follow)."""
        self.release()
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

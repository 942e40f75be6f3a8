"""The refit routes: the one place a route is chosen, object-store arrays (bf16 included), host shared memory,
CUDA IPC handles, a broadcast over a group of its own, and the checksums that verify what arrived."""

import multiprocessing
import pickle
import subprocess
import sys

import pytest
import torch

from rl_core.contracts.refit import (
    CudaIpcWeights,
    ObjectStoreWeights,
    RefitRoute,
    RefitSender,
    checksum,
    checksums_match,
    choose_route,
    receive_weights,
    received_stats,
    replicas_stats,
)

HOST = "10.0.0.1"


@pytest.mark.parametrize(
    ("route", "on_gpu", "shm_fits", "expected"),
    [
        (RefitRoute(receivers=(HOST,)), False, True, "host_shm"),
        (RefitRoute(receivers=(HOST, "10.0.0.2")), False, True, "object_store"),
        (RefitRoute(receivers=(HOST,)), False, False, "object_store"),
        (RefitRoute(receivers=(HOST,), colocated=True), True, True, "cuda_ipc"),
        (RefitRoute(receivers=(HOST,), colocated=False), True, True, "broadcast"),
        (RefitRoute(kind="object_store", receivers=(HOST,)), False, True, "object_store"),
        (RefitRoute(kind="broadcast", receivers=(HOST,)), False, True, "broadcast"),
        (RefitRoute(kind="host_shm", receivers=("10.0.0.2",)), False, True, "object_store"),
        (RefitRoute(kind="object_store", receivers=(HOST,), colocated=True), True, True, "object_store"),
    ],
)
def test_the_route_is_chosen_in_one_place(route, on_gpu, shm_fits, expected):
    assert choose_route(route, sender_host=HOST, on_gpu=on_gpu, shm_fits=shm_fits) == expected


def test_checksums_tell_shifted_scaled_zeroed_and_stale_weights_apart():
    w = torch.randn(64, 32)
    same = checksum(w.clone())
    assert same == checksum(w)
    for wrong in (torch.roll(w, 1), w * 1.7, torch.zeros_like(w), w + 1e-3):
        assert checksum(wrong) != same
    assert checksums_match({"w": same}, {"w": same}) == []
    assert checksums_match({"w": same, "b": 1.0}, {"w": same * 1.5}) == ["w", "b"]


def test_replicas_that_disagree_fail_the_check():
    good = (10, 1, 0.1, "host_shm", {"w": 2.0})
    assert replicas_stats([good, good], 0.2).checksums == {"w": 2.0}
    merged = replicas_stats([good, (10, 1, 0.1, "host_shm", {"w": 3.0})], 0.2).checksums
    assert checksums_match({"w": 2.0}, merged) == ["w"]


def test_object_store_payload_round_trips_fp32_and_bf16(ray_session):
    import ray

    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)}
    payload = RefitSender().publish(state, RefitRoute(kind="object_store", receivers=("elsewhere",), verify=True))
    assert isinstance(payload, ObjectStoreWeights) and isinstance(payload.ref, ray.ObjectRef)
    back = dict(receive_weights(payload))
    assert torch.equal(back["a"], state["a"]) and back["b"].dtype == torch.bfloat16
    assert torch.equal(back["b"], state["b"])
    stats = received_stats(list(back.items()), payload, 0.0)
    assert checksums_match(payload.checksums, stats[4]) == []


def _read(payload_bytes, queue):
    payload = pickle.loads(payload_bytes)
    queue.put({name: (t.dtype, t.tolist()) for name, t in receive_weights(payload)})


def test_same_host_refit_goes_through_one_reused_shared_memory_segment(ray_session):
    import ray

    ip = ray.util.get_node_ip_address()
    sender = RefitSender()
    ctx = multiprocessing.get_context("spawn")
    names = set()
    for version in range(2):
        state = {
            "w": torch.arange(6, dtype=torch.float32).reshape(2, 3) + version,
            "h": torch.tensor([1.5, -2.0]).to(torch.bfloat16),
            "i": torch.tensor([7, version]),
            "empty": torch.zeros(0),
        }
        payload = sender.publish(state, RefitRoute(receivers=(ip, ip)))
        assert payload.kind == "host_shm"
        names.add(payload.segment)
        queue = ctx.Queue()
        proc = ctx.Process(target=_read, args=(pickle.dumps(payload), queue))
        proc.start()
        got = queue.get(timeout=120)
        proc.join()
        assert got == {k: (v.dtype, v.tolist()) for k, v in state.items()}
    assert len(names) == 1, "the segment is kept across refits"


def test_a_segment_read_where_it_was_made_leaves_its_tracker_quiet():
    """Sender and receiver in one process (or a child sharing its resource tracker, as the test above spawns): the
    sender's unlink at close must not make the tracker print a KeyError traceback, which reads like a crash in
    every log it lands in."""
    script = """
import time, torch, ray
from rl_core.contracts.refit import RefitRoute, RefitSender, receive_weights
sender = RefitSender()
payload = sender.publish({"w": torch.ones(4)}, RefitRoute(receivers=(ray.util.get_node_ip_address(),)))
assert payload.kind == "host_shm", payload.kind
assert dict(receive_weights(payload))["w"].tolist() == [1.0] * 4
sender.close()
time.sleep(1.0)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "KeyError" not in done.stderr and "resource_tracker" not in done.stderr, done.stderr[-2000:]


def test_a_full_shared_memory_falls_back_to_the_object_store(ray_session, monkeypatch):
    import ray

    monkeypatch.setattr("shutil.disk_usage", lambda _p: type("U", (), {"free": 1000})())
    ip = ray.util.get_node_ip_address()
    payload = RefitSender().publish({"w": torch.ones(1000)}, RefitRoute(receivers=(ip,)))
    assert payload.kind == "object_store"
    assert torch.equal(dict(receive_weights(payload))["w"], torch.ones(1000))


def _receive(plans, rank, queue, device):
    """A receiver process that lives across refits, as an engine worker does."""
    for _ in range(2):
        payload = plans.get(timeout=120)
        received = receive_weights(payload, rank=rank, device=torch.device(device))
        queue.put((rank, {name: t.cpu().tolist() for name, t in received}))


@pytest.mark.parametrize(
    "sender_device, receiver_devices",
    [
        ("cpu", ["cpu", "cpu"]),
        pytest.param(
            "cuda:0",
            ["cuda:1"],
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL needs a GPU per rank: 2 GPUs",
                ),
            ],
        ),
    ],
)
def test_broadcast_reaches_every_receiver_and_its_group_is_reused(ray_session, sender_device, receiver_devices):
    sender = RefitSender()
    ctx = multiprocessing.get_context("spawn")
    plans, queue = [ctx.Queue() for _ in receiver_devices], ctx.Queue()
    procs = [
        ctx.Process(target=_receive, args=(plans[i], i + 1, queue, device)) for i, device in enumerate(receiver_devices)
    ]
    for p in procs:
        p.start()
    first = None
    for version in range(2):
        w = torch.arange(6, dtype=torch.float32, device=sender_device).reshape(2, 3) + version
        route = RefitRoute(kind="broadcast", receivers=("127.0.0.1",) * len(procs))
        payload = sender.publish({"w": w, "step": torch.tensor([version], device=sender_device)}, route)
        assert payload.kind == "broadcast" and payload.world_size == 1 + len(procs)
        assert payload.backend == ("nccl" if sender_device.startswith("cuda") else "gloo")
        first = first or (payload.address, payload.port)
        assert (payload.address, payload.port) == first, "later refits reuse the group"
        for q in plans:
            q.put(payload)
        got = dict(queue.get(timeout=120) for _ in procs)
        sender.release()
        assert got == {r: {"w": w.tolist(), "step": [version]} for r in range(1, len(procs) + 1)}
    for p in procs:
        p.join(timeout=60)


def _consume(payload, queue):
    queue.put({k: v.sum().item() for k, v in receive_weights(payload)})


@pytest.mark.gpu
def test_cuda_ipc_handles_rebuild_in_another_process_and_release_frees_them(ray_session):
    sender = RefitSender()
    base = torch.cuda.memory_allocated()
    # 64 MiB that only the sender holds once published (as a trainer's gathered full weights are)
    payload = sender.publish({"w": torch.ones(1 << 24, device="cuda")}, RefitRoute(receivers=("x",), colocated=True))
    assert isinstance(payload, CudaIpcWeights)
    assert torch.cuda.memory_allocated() - base >= 1 << 26, "the published tensor is alive until released"
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(payload, queue))
    proc.start()
    assert queue.get(timeout=120) == {"w": float(1 << 24)}
    proc.join()
    sender.release()
    del payload
    torch.cuda.ipc_collect()
    assert torch.cuda.memory_allocated() - base < 1 << 20, "release() frees what the engine no longer reads"

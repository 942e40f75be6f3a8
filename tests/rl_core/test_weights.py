"""The refit routes: object-store arrays (bf16 included), CUDA IPC handles, a broadcast over a group of its own."""

import multiprocessing

import pytest
import torch

from rl_core.protocols import RefitRoute
from rl_core.weights import RefitSender, from_shared, receive_broadcast, route_of, to_cuda_ipc, to_shared


def test_object_store_format_round_trips_fp32_and_bf16():
    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)}
    shared = to_shared(state)
    back = dict(from_shared(shared))
    assert (
        torch.equal(back["a"], state["a"]) and back["b"].dtype == torch.bfloat16 and torch.equal(back["b"], state["b"])
    )
    assert route_of(shared) == "object_store"


def _read(plan, queue):
    queue.put({name: (t.dtype, t.tolist()) for name, t in from_shared(plan)})


def test_same_host_refit_goes_through_one_reused_shared_memory_segment():
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
        plan = sender.publish(state, RefitRoute(kind="object_store", receivers=(ip, ip)))
        assert route_of(plan) == "host_shm"
        names.add(plan["name"])
        queue = ctx.Queue()
        proc = ctx.Process(target=_read, args=(plan, queue))
        proc.start()
        got = queue.get(timeout=120)
        proc.join()
        assert got == {k: (v.dtype, v.tolist()) for k, v in state.items()}
    assert len(names) == 1, "the segment is kept across refits"


def test_a_full_shared_memory_falls_back_to_the_object_store(ray_session, monkeypatch):
    import ray

    monkeypatch.setattr("shutil.disk_usage", lambda _p: type("U", (), {"free": 1000})())
    ip = ray.util.get_node_ip_address()
    ref = RefitSender().publish({"w": torch.ones(1000)}, RefitRoute(receivers=(ip,)))
    assert isinstance(ref, ray.ObjectRef)
    assert torch.equal(dict(from_shared(ray.get(ref)))["w"], torch.ones(1000))


def _receive(plans, rank, queue, device):
    """A receiver process that lives across refits, as an engine worker does."""
    for _ in range(2):
        plan = plans.get(timeout=120)
        received = receive_broadcast(plan, rank, torch.device(device))
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
def test_broadcast_reaches_every_receiver_and_its_group_is_reused(sender_device, receiver_devices):
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
        plan = sender.publish({"w": w, "step": torch.tensor([version], device=sender_device)}, route)
        assert route_of(plan) == "broadcast" and plan["world_size"] == 1 + len(procs)
        assert plan["backend"] == ("nccl" if sender_device.startswith("cuda") else "gloo")
        first = first or (plan["address"], plan["port"])
        assert (plan["address"], plan["port"]) == first, "later refits reuse the group"
        for q in plans:
            q.put(plan)
        got = dict(queue.get(timeout=120) for _ in procs)
        sender.wait()
        assert got == {r: {"w": w.tolist(), "step": [version]} for r in range(1, len(procs) + 1)}
    for p in procs:
        p.join(timeout=60)


def _consume(handles, queue):
    queue.put({k: v.sum().item() for k, v in from_shared(handles)})


@pytest.mark.gpu
def test_cuda_ipc_handles_rebuild_in_another_process():
    state = {"w": torch.arange(6, dtype=torch.float32, device="cuda")}
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(to_cuda_ipc(state), queue))
    proc.start()
    assert queue.get(timeout=120) == {"w": 15.0}
    proc.join()

"""The weight formats: object-store arrays (bf16 included) and CUDA IPC handles."""

import multiprocessing

import pytest
import torch

from rl_core.weights import from_shared, nbytes, to_cuda_ipc, to_shared


def test_object_store_format_round_trips_fp32_and_bf16():
    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)}
    shared = to_shared(state)
    back = dict(from_shared(shared))
    assert (
        torch.equal(back["a"], state["a"]) and back["b"].dtype == torch.bfloat16 and torch.equal(back["b"], state["b"])
    )
    assert nbytes(shared) == 3 * 4 * 4 + 5 * 2


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

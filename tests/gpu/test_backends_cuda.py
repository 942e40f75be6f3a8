"""Both training backends on CUDA: the conformance suite (logprobs vs a plain HF forward, a step that moves the
policy, checkpoint save/load, export), and Megatron against DTensor on the same batch."""

import pytest
import torch

from rl_core.losses import NLLLoss
from rl_core.testing.conformance import check_training_backend, sample_batch

pytestmark = [pytest.mark.ray]


def make(config, name: str):
    if name == "megatron":
        from rl_backend_megatron.backend import make_backend

        return make_backend(config, config.section("policy.megatron_cfg"))
    from rl_backend_dtensor.backend import make_backend

    return make_backend(config, config.section("policy.dtensor_cfg"))


@pytest.mark.parametrize("name", ["dtensor", "megatron"])
def test_backend_conforms_on_cuda(ray_session, gpu_config, tiny_model_path, tokenizer_of, tmp_path, name):
    config = gpu_config(tiny_model_path, f"policy.backend={name}", "policy.megatron_cfg.enabled=true")
    backend = make(config, name)
    try:
        check_training_backend(backend, tokenizer_of(tiny_model_path), tmp_path)
    finally:
        backend.shutdown()


def test_megatron_and_dtensor_agree_on_cuda(ray_session, gpu_config, tiny_model_path, tokenizer_of, gpu_report):
    batch = sample_batch(tokenizer_of(tiny_model_path))
    results = {}
    for name in ("dtensor", "megatron"):
        config = gpu_config(tiny_model_path, f"policy.backend={name}", "policy.megatron_cfg.enabled=true")
        backend = make(config, name)
        try:
            before = backend.logprobs(batch)
            loss = backend.train(batch, NLLLoss())["loss"]
            results[name] = (before, loss, backend.logprobs(batch))
        finally:
            backend.shutdown()
    (lp_d, loss_d, after_d), (lp_m, loss_m, after_m) = results["dtensor"], results["megatron"]
    gap = float((lp_d - lp_m).abs().max())
    gap_after = float((after_d - after_m).abs().max())
    gpu_report["megatron_vs_dtensor"] = {"logprob_gap": gap, "loss": [loss_d, loss_m], "gap_after_step": gap_after}
    assert gap < 1e-4 and loss_m == pytest.approx(loss_d, abs=1e-4) and gap_after < 1e-3


def test_bf16_training_on_cuda_is_finite_and_close(ray_session, gpu_config, tiny_model_path, tokenizer_of):
    batch = sample_batch(tokenizer_of(tiny_model_path))
    config = gpu_config(tiny_model_path, "policy.dtensor_cfg.mixed_precision=true")
    backend = make(config, "dtensor")
    try:
        metrics = backend.train(batch, NLLLoss())
        assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    finally:
        backend.shutdown()

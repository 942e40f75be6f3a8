"""Both training backends on CUDA: the conformance suite (logprobs vs a plain HF forward, a step that moves the
policy, checkpoint save/load, export), and Megatron against DTensor on the same batch."""

import pytest

from rl_core.certify.conformance import check_training_backend, sample_batch
from rl_core.training.losses import NLLLoss

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
    mask = batch["loss_mask"].bool()  # where logprobs are due (DTensor skips the other positions' logits)
    gap = float((lp_d - lp_m)[mask].abs().max())
    gap_after = float((after_d - after_m)[mask].abs().max())
    gpu_report["megatron_vs_dtensor"] = {"logprob_gap": gap, "loss": [loss_d, loss_m], "gap_after_step": gap_after}
    assert gap < 1e-4 and loss_m == pytest.approx(loss_d, abs=1e-4) and gap_after < 1e-3


#: one plain SGD step: its update is the gradient (times lr), so a gradient off by a scale, or a step that never
#: moved the weights, shows in the update (after AdamW steps it would not: its first step is lr * sign(g))
SGD = ("policy.optimizer.name=sgd", "policy.optimizer.lr=0.01", "policy.max_grad_norm=null")


def compare_steps(gpu_config, model, batch, base: list[str], other: list[str]) -> tuple[float, float, list[dict]]:
    """The DTensor backend on CUDA with the ``base`` and ``other`` overrides, each a fresh backend taking one SGD
    step: the largest gap between their logprobs under ``loss_mask`` before the step, the largest gap between their
    per-parameter updates over the largest entry of ``base``'s, and each step's metrics (base, other)."""
    from rl_core.contracts.refit import RefitRoute, receive_weights

    def weights(backend) -> dict:
        return {
            k: v.float().cpu().clone()
            for k, v in receive_weights(backend.weights_for_refit(RefitRoute(kind="object_store")))
        }

    runs = []
    for extra in (base, other):
        backend = make(gpu_config(model, *SGD, *extra), "dtensor")
        try:
            start, before = weights(backend), backend.logprobs(batch)
            metrics = backend.train(batch, NLLLoss())
            update = {k: start[k] - v for k, v in weights(backend).items()}
            runs.append((before, update, metrics))
        finally:
            backend.shutdown()
    mask = batch["loss_mask"].bool()
    gap = float((runs[1][0] - runs[0][0])[mask].abs().max())
    scale = max(float(u.abs().max()) for u in runs[0][1].values())
    assert scale > 0, "the base step moved nothing"
    update_gap = max(float((runs[1][1][k] - u).abs().max()) for k, u in runs[0][1].items()) / scale
    return gap, update_gap, [runs[0][2], runs[1][2]]


def test_shared_prompts_on_cuda_match_whole_rows(ray_session, gpu_config, tiny_model_path, tokenizer_of, gpu_report):
    """``dtensor_cfg.shared_prefix`` on CUDA (SDPA with a cache and a padding mask): each prompt's three responses
    share its keys and values; logprobs and every parameter's SGD update as with every row whole, with sharing
    shown to run (the start-up check passed it, fewer tokens went through the model)."""
    from rl_core.contracts import batch as B

    tokenizer = tokenizer_of(tiny_model_path)
    rows = B.concat([sample_batch(tokenizer, response=r) for r in (" 7 and 8", " 12", " nine")])  # 3 prompts x 3
    batch = B.select(rows, slice(0, 8))  # the global batch; each micro-batch of 4 holds a prompt twice
    gap, update_gap, (whole, shared) = compare_steps(
        gpu_config, tiny_model_path, batch, ["policy.dtensor_cfg.shared_prefix=false"], []
    )
    gpu_report["shared_prefix_vs_whole_rows"] = {
        "logprob_gap": gap,
        "update_gap": update_gap,
        "forward_tokens": [shared["forward_tokens"], whole["forward_tokens"]],
        "startup_check": {k: v for k, v in shared.items() if k.startswith("shortcut/")},
    }
    assert shared["shortcut/shared_prefix/on"] == 1.0 and shared["forward_tokens"] < whole["forward_tokens"]
    assert gap < 1e-4 and update_gap < 1e-4, (gap, update_gap)


def test_bf16_training_on_cuda_is_close_to_fp32(ray_session, gpu_config, tiny_model_path, tokenizer_of, gpu_report):
    """bf16 parameters with fp32 reduction: the same SGD update as fp32 within bf16 precision, and visibly bf16 (a
    backend that ignored the flag would match fp32 to ~1e-6; one whose bf16 step never moved the weights, to 1)."""
    batch = sample_batch(tokenizer_of(tiny_model_path))
    gap, update_gap, (fp32, bf16) = compare_steps(
        gpu_config, tiny_model_path, batch, [], ["policy.dtensor_cfg.mixed_precision=true"]
    )
    gpu_report["bf16_vs_fp32"] = {"logprob_gap": gap, "update_gap": update_gap, "loss": [fp32["loss"], bf16["loss"]]}
    assert 1e-3 < gap < 0.1, gap
    assert 1e-4 < update_gap < 0.1, update_gap

"""Colocation on one GPU, for real: the DTensor trainer and the Hugging Face generate engine share the GPU (one
placement group, half a GPU each) and take turns; sleeping the engine and offloading the trainer free the memory
they held (nothing kept alive across the switch); every refit route one GPU allows moves the trained weights
into the engine in place."""

import pytest
import torch

from rl_core.contracts.protocols import SamplingParams
from rl_core.contracts.refit import RefitRoute
from rl_core.training.losses import NLLLoss
from rl_core.training.rollouts import rollout_batch

pytestmark = [pytest.mark.ray]

PROMPTS = ["Q: 3 + 4 = ? A:", "Sort the digits 9 1 4. Answer:", "Even or odd? 4 8 1 7", "the answer is"]


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def test_colocated_trainer_and_engine_take_turns(ray_session, gpu_config, small_model_path, tokenizer_of, gpu_report):
    from rl_backend_dtensor.backend import make_backend
    from rl_rollout_hf.engine import make_engine

    config = gpu_config(small_model_path, "policy.generation.backend=hf", "policy.generation.colocated=true")
    tokenizer = tokenizer_of(small_model_path)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    model_bytes = sum(p.stat().st_size for p in small_model_path.glob("*.safetensors"))
    backend = make_backend(config, config.section("policy.dtensor_cfg"))
    engine = make_engine(config, config.section("policy.generation.hf_cfg"))
    figures: dict[str, float] = {"model_mb": model_bytes / 2**20}
    try:
        assert len({w.node_id for w in backend.group.info + engine.group.info}) == 1
        rollouts = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=16, seed=0))
        batch = rollout_batch(rollouts, tokenizer.pad_token_id, 64)
        assert float((batch["generation_logprobs"] - backend.logprobs(batch)).abs().max()) < 1e-4

        before = free_bytes()
        engine.sleep()
        figures["engine_sleep_freed_mb"] = (free_bytes() - before) / 2**20
        backend.train(batch, NLLLoss())  # Adam's state now exists on the GPU too
        engine.wake()
        for kind in ("cuda_ipc", "host_shm", "object_store"):
            route = RefitRoute(kind=kind, receivers=tuple(engine.weight_receivers()), colocated=True, verify=True)
            payload = backend.weights_for_refit(route)
            stats = engine.update_weights(payload)
            assert payload.kind == kind and stats.checksums == pytest.approx(payload.checksums, rel=1e-9), kind
            figures[f"refit_{kind}_s"] = stats.seconds
        after = rollout_batch(engine.generate(prompts, SamplingParams(n=4, max_new_tokens=16, seed=1)), 0, 64)
        assert float((after["generation_logprobs"] - backend.logprobs(after)).abs().max()) < 1e-4

        before = free_bytes()
        backend.offload()  # releases the refit's CUDA IPC tensors, then parameters and Adam state to the host
        figures["trainer_offload_freed_mb"] = (free_bytes() - before) / 2**20
        backend.onload()
    finally:
        engine.shutdown()
        backend.shutdown()
    gpu_report["colocation_one_gpu"] = figures
    assert figures["engine_sleep_freed_mb"] > 0.8 * figures["model_mb"]
    # weights + two Adam moments (3x the fp32 model) leave the GPU, nothing kept alive by the last refit
    assert figures["trainer_offload_freed_mb"] > 2.5 * figures["model_mb"]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_grpo_runs_colocated_on_one_gpu_with_the_hf_engine(ray_session, make_config, tiny_model_path, gpu_report, lora):
    """A colocated GRPO run on one GPU; with LoRA, each refit moves the adapters alone (CUDA IPC) and the engine
    merges them onto the base it keeps."""
    import json
    from pathlib import Path

    from rl_core.launch.run import run_config
    from rl_core.plugins.registry import Registry

    adapters = ["policy.lora.enabled=true", "policy.optimizer.lr=3e-3"] if lora else []
    config = make_config(
        *adapters,
        "warmup_recipe=null",
        f"policy.model_name={tiny_model_path}",
        "policy.generation.backend=hf",
        "grpo.max_num_steps=4",
        "grpo.val_period=4",
        "grpo.max_val_samples=16",
        "checkpointing.save_period=4",
        "health.verify_refit_every=1",
        "health.logprob_mismatch_every=1",
    )
    run_config(config, Registry.discover())
    rows = [json.loads(line) for line in (Path(config.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert all("health/logprob_mismatch" in r for r in rows[1:]), "every step checks the engine against the trainer"
    mismatch = max(r["health/logprob_mismatch"] for r in rows[1:])
    name = "grpo_colocated_hf_lora" if lora else "grpo_colocated_hf"
    gpu_report[name] = {"steps": len(rows) - 1, "max_logprob_mismatch": mismatch}
    assert mismatch < 1e-4

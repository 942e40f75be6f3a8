"""LoRA end to end on CPU: adapters trained on a frozen base (FSDP2 with frozen parameters on two ranks), the base
with adapters switched off as the reference, adapter-only refits into the HF engine, checkpoints and exports of the
adapters, an SFT run with adapters certified (resumed to the same step), and Megatron refusing it before anything
starts. A GRPO run with adapters killed with SIGKILL and resumed: tests/e2e/test_main_job.py; the LoRA recipe
learning: the same file; vLLM taking adapter-only refits: the recipe's run in tests/e2e/test_recipes.py."""

from pathlib import Path

import pytest
import torch
from together import started_together

from rl_core.base.errors import ConfigError
from rl_core.certify import certify_algorithm, certify_backend, certify_engine
from rl_core.certify.conformance import hf_logprobs, sample_batch
from rl_core.config.loader import load_config
from rl_core.contracts import lora
from rl_core.contracts.protocols import SamplingParams
from rl_core.contracts.refit import RefitRoute, RefitSender, receive_weights
from rl_core.plugins.specs import AlgorithmSpec
from rl_core.training.losses import NLLLoss
from rl_core.training.rollouts import rollout_batch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LORA = ["policy.lora.enabled=true", "policy.lora.rank=8", "policy.lora.alpha=16"]


def config(rl_registry, model: Path, run_dir: Path, *overrides: str):
    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            "cluster.device=cpu",
            f"policy.model_name={model}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=8",
            "policy.optimizer.lr=1e-2",
            "policy.max_total_sequence_length=64",
            *LORA,
            *overrides,
        ],
        rl_registry,
    )


def hf_at_loss(model: Path, batch: dict):
    """A plain HF forward's logprobs where the backend gives them (under ``loss_mask``; it skips the rest)."""
    return hf_logprobs(model, batch) * batch["loss_mask"]


def make_backend(rl_registry, model: Path, run_dir: Path, *overrides: str):
    from rl_backend_dtensor.backend import make_backend as make

    cfg = config(rl_registry, model, run_dir, *overrides)
    return make(cfg, cfg.section("policy.dtensor_cfg"))


def test_certify_passes_the_dtensor_backend_with_lora_on_two_ranks(
    ray_session, rl_registry, tiny_model_path, tokenizer, tmp_path
):
    """Every backend check with adapters: the reference is the base (it never trains), refit weights are the merged
    model, checkpoints come back bit-exact, the export round-trips, and gradients (the adapters') are the same on two
    ranks of FSDP2 with a frozen base, and clipped by policy.max_grad_norm."""
    runs = iter(range(100))
    card = certify_backend(
        lambda overrides: make_backend(rl_registry, tiny_model_path, tmp_path / f"run{next(runs)}", *overrides),
        tiny_model_path,
        tokenizer,
        tmp_path / "work",
        variants={"two data-parallel ranks": ["policy.num_workers=2"]},
        starts_at_once=2,
    )
    assert card.passed, [r for r in card.results if not r.passed]


def test_adapters_alone_train_refit_checkpoint_and_export(
    ray_session, rl_registry, tiny_model_path, tokenizer, tmp_path
):
    from transformers import AutoTokenizer

    from rl_backend_dtensor.backend import make_backend as make
    from rl_rollout_hf.engine import make_engine

    own = AutoTokenizer.from_pretrained(tiny_model_path)  # a tokenizer of its own (policy.tokenizer_name)
    own.model_max_length = 4321
    own.save_pretrained(tmp_path / "tokenizer")
    cfg = config(
        rl_registry,
        tiny_model_path,
        tmp_path / "run",
        "policy.generation.backend=hf",
        f"policy.tokenizer_name={tmp_path / 'tokenizer'}",
    )
    starts = (
        lambda: make(cfg, cfg.section("policy.dtensor_cfg")),
        lambda: make_engine(cfg, cfg.section("policy.generation.hf_cfg")),
    )
    with started_together(*starts) as (backend, engine):
        nll = sample_batch(tokenizer)
        base = hf_at_loss(tiny_model_path, nll)  # a separate copy of the base model
        for _ in range(3):
            backend.train(nll, NLLLoss())
        # the reference is the base with the adapters off: the separate copy's logprobs, though the policy moved
        reference, policy = backend.reference_logprobs(nll), backend.logprobs(nll)
        assert float((reference - base).abs().max()) <= 1e-6
        assert float((policy - base).abs().max()) > 1e-2

        # an adapter-only refit: only the adapters' tensors travel, and the engine then samples the trainer's policy
        full = receive_weights(backend.weights_for_refit(RefitRoute(kind="object_store")))
        sender = RefitSender()
        route = RefitRoute(kind="object_store", receivers=tuple(engine.weight_receivers()), adapters_only=True)
        adapters = dict(receive_weights(backend.weights_for_refit(route)))
        assert adapters and all(lora.is_adapter(name) for name in adapters)
        stats = engine.update_weights(sender.publish(adapters, route))
        sender.close()
        adapter_bytes = sum(t.numel() * t.element_size() for t in adapters.values())
        full_bytes = sum(t.numel() * t.element_size() for _, t in full)
        assert stats.num_bytes == adapter_bytes and adapter_bytes < 0.25 * full_bytes
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ("Q: 3 + 4 = ? A:", "the answer is")]
        batch = rollout_batch(engine.generate(prompts, SamplingParams(n=4, max_new_tokens=8, seed=3)), 0, 64)
        gap = (batch["generation_logprobs"] - backend.logprobs(batch))[batch["loss_mask"].bool()].abs().max()
        assert float(gap) <= 1e-4, float(gap)

        # a checkpoint holds the adapters (and their optimizer state), not the frozen base
        from torch.distributed.checkpoint import FileSystemReader

        backend.save_checkpoint(tmp_path / "ckpt")
        keys = [k for k in FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata]
        model_keys = [k for k in keys if k.startswith("model.")]
        assert model_keys and all(lora.is_adapter(k) for k in model_keys), model_keys[:5]

        # the export: the merged model loads as a plain one, and its adapter folder on the base gives the same policy
        backend.export_hf(tmp_path / "hf")
        assert float((hf_at_loss(tmp_path / "hf", nll) - policy).abs().max()) <= 1e-5
        assert AutoTokenizer.from_pretrained(tmp_path / "hf").model_max_length == 4321  # the export carries it
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base_model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base_model, tmp_path / "hf" / "adapter").eval()
        with torch.no_grad():
            logits = adapted(input_ids=nll["input_ids"], attention_mask=nll["attention_mask"]).logits
        from rl_core.contracts.tokens import token_logprobs

        assert float((token_logprobs(logits, nll["input_ids"]) * nll["loss_mask"] - policy).abs().max()) <= 1e-5

        # and the engine certified with adapters (over the base's own weights first): adapter-only refits take
        # effect, zero adapters give the base back
        from safetensors.torch import load_file

        sender = RefitSender()
        route = RefitRoute(kind="object_store", receivers=tuple(engine.weight_receivers()))
        engine.update_weights(sender.publish(load_file(str(tiny_model_path / "model.safetensors")), route))
        sender.close()
        card = certify_engine(engine, tiny_model_path, tokenizer, quick=True, adapters=cfg.policy.lora)
        assert card.passed, [(r.check, r.measured) for r in card.results if not r.passed]
        assert "an adapter-only refit moves the adapters alone and takes effect" in [r.check for r in card.results]


def test_sft_with_lora_certifies_as_an_algorithm(ray_session, rl_registry, tmp_path):
    """``certify_algorithm`` on the quickest loop, with adapters: two steps with finite metrics and a checkpoint each
    (the adapters and their optimizer state), the final export, then a resume from step 1 to the same step 2."""
    overrides = [*LORA, "sft.response_key=answer", "sft.val_period=2", "sft.max_val_samples=16", "data.num_train=64"]
    card = certify_algorithm(rl_registry.get(AlgorithmSpec, "sft"), rl_registry, tmp_path, overrides=overrides)
    assert card.passed, [(r.check, r.measured, r.detail) for r in card.results if not r.passed]
    assert (tmp_path / "straight" / "final" / "adapter" / "adapter_config.json").is_file()
    (resume,) = [r for r in card.results if r.check.startswith("resumed from the step-1 checkpoint")]
    assert resume.measured.endswith("step_000002 and final/ back"), resume.measured


def test_a_named_reference_model_is_the_reference_even_with_lora(
    ray_session, rl_registry, tiny_model_path, tiny_llama_path, tokenizer, tmp_path
):
    """``policy.reference_model_name`` (distillation's teacher) is what ``reference_logprobs`` runs: another model's
    logprobs (a Llama with the same tokenizer), not the base with the adapters off."""
    backend = make_backend(
        rl_registry, tiny_model_path, tmp_path / "run", f"policy.reference_model_name={tiny_llama_path}"
    )
    try:
        nll = sample_batch(tokenizer)
        teacher, base = hf_at_loss(tiny_llama_path, nll), hf_at_loss(tiny_model_path, nll)
        reference = backend.reference_logprobs(nll)
        assert float((reference - teacher).abs().max()) <= 1e-5
        assert float((reference - base).abs().max()) > 1e-2
        assert float((backend.logprobs(nll) - base).abs().max()) <= 1e-5  # the policy is still the base (B = 0)
    finally:
        backend.shutdown()


def test_lora_on_a_backend_without_it_is_refused_before_anything_starts(rl_registry, make_config):
    from rl_core.plugins.selection import select

    with pytest.raises(ConfigError, match=r"training backend 'megatron' does not train LoRA adapters"):
        select(make_config(*LORA, "policy.megatron_cfg.enabled=true"), rl_registry, "cpu")
    assert select(make_config(*LORA), rl_registry, "cpu").backend.chosen.name == "dtensor"


def test_merged_weights_are_base_plus_scaled_product():
    """``lora.merged`` by hand: W + (alpha / r) B @ A, under the plain model's names."""
    g = torch.Generator().manual_seed(0)
    w, a, b = torch.randn(6, 4, generator=g), torch.randn(2, 4, generator=g), torch.randn(6, 2, generator=g)
    state = {
        "base_model.model.layer.q_proj.base_layer.weight": w,
        "base_model.model.layer.q_proj.base_layer.bias": torch.ones(6),
        "base_model.model.layer.q_proj.lora_A.default.weight": a,
        "base_model.model.layer.q_proj.lora_B.default.weight": b,
        "base_model.model.norm.weight": torch.ones(4),
    }
    out = lora.merged(state, scale=2.0)
    assert sorted(out) == ["layer.q_proj.bias", "layer.q_proj.weight", "norm.weight"]
    assert torch.equal(out["layer.q_proj.weight"], w + 2.0 * (b @ a))
    assert torch.equal(out["layer.q_proj.bias"], torch.ones(6))

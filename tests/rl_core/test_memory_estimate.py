"""The trainer's memory estimate, printed before any worker starts, against what it estimates: the parameters the
model has, the adapters ``peft`` adds, the bytes autograd keeps for a micro-batch's backward pass (an upper bound on
every tiny model), a reference model's copy and a critic's states."""

from pathlib import Path

import pytest
import torch

from rl_core.launch.memory import estimate_memory


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """The bytes of the distinct tensors autograd saves in ``model``'s forward and loss on ``ids``, what the
    backward pass holds on to (each storage counted once: views of one tensor share it; the weights, which layers
    save too, are the model states' share)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids).logits.float()
        torch.log_softmax(logits, -1).gather(-1, ids[..., None]).sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("name", ["llama-tiny", "qwen2-tiny", "qwen3-tiny"])
def test_the_estimate_counts_the_models_parameters_and_what_a_micro_batch_keeps(make_config, name):
    from transformers import AutoModelForCausalLM

    from rl_core.data.tiny_models import ensure_tiny_model

    path = ensure_tiny_model(name)
    config = make_config(
        f"policy.model_name={path}", "policy.train_micro_batch_size=4", "policy.max_total_sequence_length=256"
    )
    estimate = estimate_memory(config, str(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    assert estimate.parameters == estimate.trainable == parameters
    assert estimate.model_states == 4 * 4 * parameters  # fp32 weights, gradients and AdamW's two moments
    ids = torch.randint(0, model.config.vocab_size, (4, config.policy.max_total_sequence_length))
    measured = saved_bytes(model, ids)
    # printed as "up to about": never under what autograd keeps, and not far over it
    assert measured <= estimate.activations + estimate.logits <= 1.3 * measured, (estimate, measured)
    assert estimate.reference == estimate.critic == 0
    both = estimate_memory(config, str(path), reference=True, critic=True)
    assert both.reference == 4 * parameters  # a frozen fp32 copy
    assert both.critic == 4 * 4 * parameters + estimate.activations  # a second trained model and its micro-batch
    assert both.total == estimate.total + both.reference + both.critic and "the critic" in both.line()


def test_with_lora_the_optimizer_state_is_the_adapters(make_config, tiny_model_path: Path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = make_config(f"policy.model_name={tiny_model_path}", "policy.lora.enabled=true", "policy.lora.rank=4")
    estimate = estimate_memory(config, str(tiny_model_path))
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path), LoraConfig(r=4, target_modules="all-linear")
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert estimate.trainable == trainable and estimate.parameters == sum(
        p.numel() for p in model.base_model.model.parameters() if not p.requires_grad
    )
    assert estimate.model_states == 4 * (estimate.parameters + 3 * trainable)
    assert "trainer memory: up to about" in estimate.line() and "of them trained" in estimate.line()
    # the reference is the base with the adapters off: no copy
    assert estimate_memory(config, str(tiny_model_path), reference=True).reference == 0


def test_a_model_the_estimate_cannot_build_still_runs_and_says_so(make_config, tiny_model_path, monkeypatch, capsys):
    from rl_core.launch import run
    from rl_core.outputs.console import RunConsole
    from rl_core.plugins.registry import Registry

    def fails(config, model, **_counted):
        raise ValueError("no meta-device build for this architecture")

    monkeypatch.setattr(run, "estimate_memory", fails)
    config = make_config(f"policy.model_name={tiny_model_path}", "warmup_recipe=null")
    run.prepare_run(config, Registry.discover(), RunConsole(progress=False))
    assert "trainer memory: not estimated (ValueError: no meta-device build" in " ".join(
        capsys.readouterr().out.split()
    )

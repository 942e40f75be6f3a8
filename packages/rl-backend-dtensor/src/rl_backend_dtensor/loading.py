"""Loading a rank's model: the policy (trainable, with LoRA adapters when enabled) or the frozen reference, as a
Hugging Face model from its folder, sharded with FSDP2 over the ranks' mesh (a single rank runs it unwrapped)."""

from __future__ import annotations

from typing import Any

import torch

from rl_backend_dtensor.config import DTensorConfig
from rl_core.api import PolicyConfig, lora


def load_model(
    path: str, *, trainable: bool, policy: PolicyConfig, cfg: DTensorConfig, mesh: Any, device: torch.device
) -> Any:
    """The model at ``path`` on ``device``: trainable (activation checkpointing and LoRA as configured) or frozen in
    eval mode; FSDP2-sharded block by block over ``mesh`` unless one rank without CPU offload has nothing to shard
    (FSDP2's per-block hooks cost ~30% of a tiny model's training step on CPU)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model = from_pretrained(path, policy)
    if trainable and cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trainable and policy.lora.enabled:  # a frozen base with adapters; the reference is the base itself
        model = lora.wrap(model, policy.lora, trainable=True)
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    offload = cfg.cpu_offload and device.type == "cuda"
    if mesh.size() == 1 and not offload:
        return model.to(device)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if cfg.mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model if offload else model.to(device)


def from_pretrained(path: str, policy: PolicyConfig) -> Any:
    """The causal LM at ``path``, or with ``policy.head=score`` the same architecture with a one-output score head
    (new if ``path`` holds a causal LM) that knows the tokenizer's padding id, as serving it needs."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    kwargs: dict[str, Any] = {"dtype": torch.float32, "trust_remote_code": policy.trust_remote_code}
    if policy.head == "lm":
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
    if not isinstance(getattr(model, "score", None), torch.nn.Module):
        raise TypeError(f"{type(model).__name__} has no `score` head; policy.head=score needs one")
    tokenizer = AutoTokenizer.from_pretrained(policy.tokenizer_name or path)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model

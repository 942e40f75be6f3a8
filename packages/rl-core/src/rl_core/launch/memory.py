"""The trainer's memory, estimated before any worker starts from the model's config and the batch settings (the
measured peak, ``train/peak_memory_gib``, comes only after the first step, minutes later on a real model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from rl_core.base.schema import Config

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

_FLOAT = 4  # bytes: the trainer keeps weights, gradients, moments and activations in float32


@attrs.frozen(kw_only=True)
class MemoryEstimate:
    """Bytes over all of the trainer's ranks on the host. ``model_states``: the weights, and for the trainable ones
    their gradients and the optimizer's moments (sharded over ranks, so the sum is one copy);
    ``activations``: what one micro-batch a rank keeps for its backward pass through the layers; ``logits``: its
    full-vocabulary logits at every position, their log-softmax and its gradient (an upper bound: a backend that
    takes logits at the loss positions only needs the response's share; a score head has one output)."""

    parameters: int
    trainable: int
    model_states: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.logits

    def line(self) -> str:
        def gib(n: int) -> str:
            return f"{n / 2**30:.1f} GiB"

        trained = "" if self.trainable == self.parameters else f", {self.trainable / 1e6:.2f}M of them trained"
        return (
            f"trainer memory: up to about {gib(self.total)} at its peak ({self.parameters / 1e6:.1f}M parameters"
            f"{trained}: weights, gradients and optimizer state {gib(self.model_states)}; a micro-batch's "
            f"activations {gib(self.activations)}, its logits {gib(self.logits)}), besides the processes' own "
            "(about 1 GiB a rank); policy.train_micro_batch_size scales the last two"
        )


def estimate_memory(config: Config, model: str) -> MemoryEstimate:
    """The estimate for ``config``'s policy on the model folder ``model`` (parameters counted on the meta device:
    nothing is loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    policy = config.policy
    hf = AutoConfig.from_pretrained(model, trust_remote_code=policy.trust_remote_code)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(hf, trust_remote_code=policy.trust_remote_code)
    parameters = sum(p.numel() for p in meta.parameters())
    trainable = lora_parameters(meta, policy.lora.rank, policy.lora.target_modules, policy.lora.exclude_modules)
    trainable = trainable if policy.lora.enabled else parameters
    moments = {"adamw": 2, "sgd": 0}[policy.optimizer.name]
    tokens = policy.train_micro_batch_size * policy.max_total_sequence_length * policy.num_workers
    return MemoryEstimate(
        parameters=parameters,
        trainable=trainable,
        model_states=_FLOAT * (parameters + (1 + moments) * trainable),
        activations=_FLOAT * tokens * hf.num_hidden_layers * _layer_floats_per_token(hf),
        logits=_FLOAT * tokens * (hf.vocab_size if policy.head == "lm" else 1) * 3,
    )


def _layer_floats_per_token(hf: PretrainedConfig) -> int:
    """Floats a decoder layer keeps per token for its backward pass (a Llama-style block, attention by a fused
    kernel that keeps no score matrix): the two norms' inputs and outputs, q and its rotated copy, k and v and
    their rotated k, the attention output and o's input, and the MLP's gate, up, activation and product."""
    h = int(hf.hidden_size)
    heads = int(hf.num_attention_heads)
    head_dim = int(getattr(hf, "head_dim", None) or h // heads)
    kv = int(getattr(hf, "num_key_value_heads", None) or heads) * head_dim
    q = heads * head_dim
    inner = int(getattr(hf, "intermediate_size", None) or 4 * h)
    return 4 * h + 2 * q + 3 * kv + 2 * q + 4 * inner


def lora_parameters(model: torch.nn.Module, rank: int, targets: tuple[str, ...], excluded: tuple[str, ...]) -> int:
    """The adapters' parameters ``policy.lora`` adds to ``model``: ``rank x (in + out)`` for each linear layer it
    targets (``all-linear``: every one but the output layer; else by name suffix, as ``peft`` matches)."""
    import torch

    output = getattr(model, "get_output_embeddings", lambda: None)()

    def matches(name: str, patterns: tuple[str, ...]) -> bool:
        return any(name == p or name.endswith("." + p) for p in patterns)

    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or matches(name, excluded):
            continue
        if ("all-linear" in targets and module is not output) or matches(name, targets):
            count += rank * (module.in_features + module.out_features)
    return count

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


#: what a layer may keep beyond a Llama block's count (per-head query and key norms, a bias, a gate): the estimate
#: is an upper bound on the models the suite builds (tests/rl_core/test_memory_estimate.py measures them)
_MARGIN = 1.15


@attrs.frozen(kw_only=True)
class MemoryEstimate:
    """Bytes over all of the trainer's ranks on the host. ``model_states``: the weights, and for the trainable ones
    their gradients and the optimizer's moments (sharded over ranks, so the sum is one copy);
    ``activations``: what one micro-batch a rank keeps for its backward pass through the layers; ``logits``: its
    full-vocabulary logits at every position, their log-softmax and its gradient (an upper bound: a backend that
    takes logits at the loss positions only needs the response's share; a score head has one output);
    ``reference``: the frozen reference policy's weights, where the run needs its logprobs and it is a copy (not the
    base under LoRA adapters); ``critic``: a value model trained beside the policy (PPO's), its states and a
    micro-batch's activations."""

    parameters: int
    trainable: int
    model_states: int
    activations: int
    logits: int
    reference: int = 0
    critic: int = 0

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.logits + self.reference + self.critic

    def line(self) -> str:
        def gib(n: int) -> str:
            return f"{n / 2**30:.1f} GiB"

        trained = "" if self.trainable == self.parameters else f", {self.trainable / 1e6:.2f}M of them trained"
        others = "".join(
            f"; {what} {gib(n)}"
            for what, n in (("the reference model", self.reference), ("the critic", self.critic))
            if n
        )
        return (
            f"trainer memory: up to about {gib(self.total)} at its peak ({self.parameters / 1e6:.1f}M parameters"
            f"{trained}: weights, gradients and optimizer state {gib(self.model_states)}; a micro-batch's "
            f"activations {gib(self.activations)}, its logits {gib(self.logits)}{others}), besides the processes' own "
            "(about 1 GiB a rank); policy.train_micro_batch_size scales the activations and logits"
        )


def estimate_memory(config: Config, model: str, *, reference: bool = False, critic: bool = False) -> MemoryEstimate:
    """The estimate for ``config``'s policy on the model folder ``model`` (parameters counted on the meta device:
    nothing is loaded), with the reference policy when the run needs its logprobs (``reference``) and a critic
    trained beside it (``critic``: the policy's model with a one-output head)."""
    policy = config.policy
    hf, meta = _on_meta(model, policy.trust_remote_code)
    parameters = sum(p.numel() for p in meta.parameters())
    trainable = lora_parameters(meta, policy.lora.rank, policy.lora.target_modules, policy.lora.exclude_modules)
    trainable = trainable if policy.lora.enabled else parameters
    moments = {"adamw": 2, "sgd": 0}[policy.optimizer.name]
    tokens = policy.train_micro_batch_size * policy.max_total_sequence_length * policy.num_workers
    activations = int(_MARGIN * _FLOAT * tokens * hf.num_hidden_layers * _layer_floats_per_token(hf))
    copied = policy.reference_model_name is not None or not policy.lora.enabled  # else: the base, adapters off
    named = policy.reference_model_name
    referenced = (
        sum(p.numel() for p in _on_meta(named, policy.trust_remote_code)[1].parameters()) if named else parameters
    )
    return MemoryEstimate(
        parameters=parameters,
        trainable=trainable,
        model_states=_FLOAT * (parameters + (1 + moments) * trainable),
        activations=activations,
        logits=_FLOAT * tokens * (hf.vocab_size if policy.head == "lm" else 1) * 3,
        reference=_FLOAT * referenced if reference and copied else 0,
        critic=_FLOAT * parameters * (2 + moments) + activations if critic else 0,
    )


def _on_meta(model: str, trust_remote_code: bool) -> tuple[PretrainedConfig, torch.nn.Module]:
    """The config of the model folder ``model`` and the model built from it on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return hf, AutoModelForCausalLM.from_config(hf, trust_remote_code=trust_remote_code)


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

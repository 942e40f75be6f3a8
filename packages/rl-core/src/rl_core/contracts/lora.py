"""LoRA adapters between trainer and engines: the ``peft`` config both sides build from ``policy.lora``, which
tensors are the adapters', and a ``peft`` model's weights merged back into plain Hugging Face names (for engines
that take whole weights, and for the exported model). torch and peft are imported where used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rl_core.base.schema import LoraConfig

#: the prefix ``peft`` gives a wrapped model's weights, and the infix of an adapted layer's own weights
PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer."


def peft_config(cfg: LoraConfig) -> Any:
    """``peft.LoraConfig`` for a causal LM from ``policy.lora``."""
    import peft

    targets: Any = "all-linear" if tuple(cfg.target_modules) == ("all-linear",) else list(cfg.target_modules)
    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        exclude_modules=list(cfg.exclude_modules) or None,
        task_type="CAUSAL_LM",
    )


def wrap(model: Any, cfg: LoraConfig, *, trainable: bool) -> Any:
    """``model`` with adapters: loaded from ``cfg.adapter_path``, else fresh (B = 0: the base model's outputs)."""
    import peft

    if cfg.adapter_path:
        return peft.PeftModel.from_pretrained(model, cfg.adapter_path, is_trainable=trainable)
    return peft.get_peft_model(model, peft_config(cfg))


def is_adapter(name: str) -> bool:
    """Whether a ``peft`` model's weight is an adapter's (trained, and sent alone to engines that take adapters)."""
    return ".lora_A." in name or ".lora_B." in name


def plain_name(name: str) -> str:
    """The plain model's name of a ``peft`` model's (non-adapter) weight."""
    return name.removeprefix(PEFT_PREFIX).replace(BASE_LAYER, ".")


def pairs(adapters: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Adapters' tensors (``peft`` names) by the plain weight each changes: ``{weight name: (A [r, in], B [out, r])}``.
    An engine that keeps the base weights sets each to ``W0 + scale * B @ A`` (``torch.addmm``, one pass over W) and
    generates with a plain model."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapters.items():
        layer, _, rest = name.partition(".lora_")
        layers.setdefault(plain_name(layer) + ".weight", {})[rest.split(".", 1)[0]] = tensor
    out = {}
    for weight, pair in layers.items():
        if set(pair) != {"A", "B"}:
            raise KeyError(f"adapter of {weight} incomplete: got {sorted(pair)}, expected A and B")
        out[weight] = (pair["A"], pair["B"])
    return out


def merged(state: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A ``peft`` model's full weights as the plain model's: each adapted layer's weight W + scale * B @ A, names
    without ``peft``'s prefix and infixes (what ``from_pretrained`` of the base architecture loads)."""
    adapters = pairs({name: t for name, t in state.items() if is_adapter(name)})
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        plain = plain_name(name)
        if BASE_LAYER in name and plain in adapters:
            a, b = adapters[plain]
            tensor = tensor + scale * (b.to(tensor.dtype) @ a.to(tensor.dtype))
        out[plain] = tensor
    return out

"""A rank's weights and training state on disk: full weights gathered to rank 0, a distributed checkpoint of model,
optimizer, scheduler and RNG, and the Hugging Face export (with LoRA: merged, plus the ``peft`` adapter folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl_core.api import LoraConfig, lora


def full_state_dict(
    model: Any, world_size: int, *, on_device: bool = False, adapters_only: bool = False
) -> dict[str, torch.Tensor]:
    """Full weights on rank 0 (with LoRA: ``peft``'s names, or only the adapters'). With one rank the local shards
    already are the full tensors: no gather, no copy (refit and export then read the live parameters)."""
    if world_size == 1:
        local = {n: t.to_local() if hasattr(t, "to_local") else t for n, t in model.state_dict().items()}
        return {
            n: t.detach() if on_device or t.device.type == "cpu" else t.detach().cpu()
            for n, t in local.items()
            if not adapters_only or lora.is_adapter(n)
        }
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_device, ignore_frozen_params=adapters_only)
    full: dict[str, torch.Tensor] = get_model_state_dict(model, options=options)  # type: ignore[assignment]
    return full


def tied_copies(model: Any) -> set[str]:
    """The state-dict names that are a second name of another parameter (tied embeddings: ``lm_head.weight`` beside
    ``embed_tokens.weight``): a refit sends each tensor once, as a Hugging Face checkpoint stores it."""
    kept = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return set(model.state_dict()) - kept


def save_checkpoint(model: Any, optimizer: Any, scheduler: Any, path: str, *, rank: int, adapters: bool) -> None:
    """Model and optimizer shards at ``path`` (with LoRA, ``adapters``: the adapters only, the base is the model
    folder's), rank 0's scheduler and RNG state in ``extra.pt``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # before the first step the optimizer has no state, and get_state_dict would give it one by a zero-lr step
    # (AdamW's step count then 1, not 0): that must neither change this run nor be what a load restores
    fresh = not optimizer.state
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(adapters))
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    if fresh:
        optimizer.state.clear()
    if rank == 0:
        torch.save(
            {"scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "fresh_optimizer": fresh},
            Path(path) / "extra.pt",
        )
    if dist.get_world_size() > 1:
        dist.barrier()


def load_checkpoint(model: Any, optimizer: Any, scheduler: Any, path: str, *, adapters: bool) -> None:
    """What ``save_checkpoint`` wrote at ``path``, back into the live model, optimizer, scheduler and RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _options(adapters)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    extra = torch.load(Path(path) / "extra.pt", weights_only=False)
    if extra.get("fresh_optimizer"):
        optimizer.state.clear()
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["rng"])


def _options(adapters: bool) -> Any:
    """What a checkpoint holds: every weight, or with LoRA the adapters (the base is the model folder's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=adapters, strict=not adapters)


def export_hf(model: Any, path: str, *, rank: int, world_size: int, lora_cfg: LoraConfig, tokenizer: str) -> None:
    """The plain model (with LoRA: merged) at ``path`` with the tokenizer from ``tokenizer``, and with LoRA its
    adapters at ``path/adapter`` (a ``peft`` folder)."""
    full = full_state_dict(model, world_size)
    if rank == 0:
        from transformers import AutoTokenizer

        if lora_cfg.enabled:
            model.save_pretrained(Path(path) / "adapter", state_dict=full)
            base = model.get_base_model()
            base.save_pretrained(path, state_dict=lora.merged(full, lora_cfg.scale), safe_serialization=True)
        else:
            model.save_pretrained(path, state_dict=full, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(path)
    if world_size > 1:
        dist.barrier()

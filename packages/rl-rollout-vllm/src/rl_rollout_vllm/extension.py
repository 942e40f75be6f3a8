"""Runs inside each vLLM worker process (``worker_extension_cls``): the receiving end of every refit route.

The engine actor reaches these methods with ``collective_rpc``, so with tensor parallelism every TP rank loads
the full weights and vLLM's weight loaders keep each rank's shard. The model runner's ``reload_weights`` redoes
the platform's weight processing (on CPU, oneDNN repacking), which ``model.load_weights`` alone does not. A
model with tied embeddings gets its output layer from the embedding in every reload: a checkpoint (and our refit)
holds the embedding once, and vLLM keeps the output layer's processed copy apart, so without it the layer stayed
at the weights of the first load (a dummy one, on the compile stand-in).
"""

from __future__ import annotations

import pickle
import time
from typing import Any

from rl_core.api import RefitPayload, lora, receive_weights, received_stats


class RefitExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker (``self.rank``, ``self.model_runner``)."""

    model_runner: Any
    rank: int

    def rl_refit(
        self, payload: RefitPayload | bytes, rank_offset: int, adapter_scale: float | None = None
    ) -> tuple[Any, ...]:
        """Reload the weights behind ``payload`` in place; returns ``rl_core.api.received_stats``.

        ``payload`` is a refit payload (engine in the actor's own process) or one pickled to bytes (engine core in
        another process, reached over vLLM's msgpack RPC); on the broadcast route this process is receiver
        ``rank_offset + self.rank``. A payload of LoRA adapters alone (``adapter_scale`` given) is merged here onto
        the base weights, read once from the model folder: only the adapters travel, and vLLM keeps generating
        with a plain model."""
        start = time.perf_counter()
        weights: RefitPayload = pickle.loads(payload) if isinstance(payload, bytes) else payload
        device = next(self.model_runner.get_model().parameters()).device
        named = receive_weights(weights, rank=rank_offset + self.rank, device=device)
        if adapter_scale is not None and named and all(lora.is_adapter(name) for name, _ in named):
            self._reload(self._merged(dict(named), adapter_scale))
        else:
            self._reload(named)
        return received_stats(named, weights, time.perf_counter() - start)

    def rl_load_folder(self, folder: str) -> None:
        """The weights of the model folder ``folder`` (an engine started with dummy weights on its compile
        stand-in, ``rl_rollout_vllm.compile_alias``); the folder the adapters' base is read from."""
        self._weights_folder = folder
        self._reload(list(_folder_weights(folder).items()))

    def _reload(self, named: list[tuple[str, Any]]) -> None:
        """``reload_weights`` of ``named``, a tied model's output layer made from its embedding when not given."""
        tied = getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False)
        names = {name for name, _ in named}
        if tied and "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            named = [*named, ("lm_head.weight", dict(named)["model.embed_tokens.weight"])]
        self.model_runner.reload_weights(weights_iterator=named)

    def _merged(self, adapters: dict[str, Any], scale: float) -> list[tuple[str, Any]]:
        """Every weight of the base model (the folder vLLM loaded), with each adapted one's ``scale * B @ A`` added."""
        base = getattr(self, "_lora_base", None)
        if base is None:
            base = self._lora_base = _folder_weights(
                getattr(self, "_weights_folder", None) or self.model_runner.model_config.model
            )
        import torch

        pairs = lora.pairs(adapters)
        missing = sorted(set(pairs) - set(base))
        if missing:
            raise KeyError(f"adapters for weights the base model does not have: {', '.join(missing[:5])}")

        def merged(name: str, w: torch.Tensor) -> torch.Tensor:
            a, b = pairs[name]
            return torch.addmm(w, b.to(w.device, w.dtype), a.to(w.device, w.dtype), alpha=scale)

        return [(name, merged(name, t) if name in pairs else t) for name, t in base.items()]


def _folder_weights(folder: str) -> dict[str, Any]:
    """The tensors of a model folder's safetensors files."""
    from pathlib import Path

    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        weights.update(load_file(str(path)))
    return weights

"""Runs inside each vLLM worker process (``worker_extension_cls``): the receiving end of every refit route.

The engine actor reaches these methods with ``collective_rpc``, so with tensor parallelism every TP rank loads
the full weights and vLLM's weight loaders keep each rank's shard. The model runner's ``reload_weights`` redoes
the platform's weight processing (on CPU, oneDNN repacking), which ``model.load_weights`` alone does not.
"""

from __future__ import annotations

import pickle
from typing import Any


class RefitExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker (``self.rank``, ``self.model_runner``)."""

    model_runner: Any
    rank: int

    def rl_refit(self, payload: Any, rank_offset: int) -> tuple[int, int]:
        """Reload the weights behind ``payload`` in place: (bytes, tensors).

        ``payload`` is a broadcast plan (join the refit group as ``rank_offset + self.rank``), a safetensors
        path (the engine core runs in another process), pickled CUDA IPC handles, or, with the engine in the
        actor's own process, the object-store arrays themselves."""
        from rl_core.weights import from_shared, receive_broadcast, route_of

        if route_of(payload) == "broadcast":
            device = next(self.model_runner.get_model().parameters()).device
            named = receive_broadcast(payload, rank_offset + self.rank, device)
        elif isinstance(payload, str):
            from safetensors.torch import load_file

            named = list(load_file(payload).items())
        elif isinstance(payload, bytes):
            named = list(from_shared(pickle.loads(payload)))
        else:
            named = list(from_shared(payload))
        self.model_runner.reload_weights(weights_iterator=named)
        return sum(t.numel() * t.element_size() for _, t in named), len(named)

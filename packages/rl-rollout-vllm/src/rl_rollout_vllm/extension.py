"""Runs inside each vLLM worker process (``worker_extension_cls``): the receiving end of every refit route.

The engine actor reaches these methods with ``collective_rpc``, so with tensor parallelism every TP rank loads
the full weights and vLLM's weight loaders keep each rank's shard. The model runner's ``reload_weights`` redoes
the platform's weight processing (on CPU, oneDNN repacking), which ``model.load_weights`` alone does not.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

from rl_core.api import RefitPayload, receive_weights, received_stats


class RefitExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker (``self.rank``, ``self.model_runner``)."""

    model_runner: Any
    rank: int

    def rl_refit(self, payload: RefitPayload | bytes, rank_offset: int) -> tuple[Any, ...]:
        """Reload the weights behind ``payload`` in place; returns ``rl_core.api.received_stats``.

        ``payload`` is a refit payload (engine in the actor's own process) or one pickled to bytes (engine core in
        another process, reached over vLLM's msgpack RPC); on the broadcast route this process is receiver
        ``rank_offset + self.rank``."""
        start = time.perf_counter()
        weights: RefitPayload = pickle.loads(payload) if isinstance(payload, bytes) else payload
        device = next(self.model_runner.get_model().parameters()).device
        named = receive_weights(weights, rank=rank_offset + self.rank, device=device)
        self.model_runner.reload_weights(weights_iterator=named)
        return received_stats(named, weights, time.perf_counter() - start)

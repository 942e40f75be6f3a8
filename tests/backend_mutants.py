"""Training backends with planted bugs, each wrapping a real backend and breaking one thing: ``rl-core certify``
must fail every one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import attrs
import torch

from rl_core.contracts.refit import RefitRoute, RefitSender, receive_weights


class Passthrough:
    def __init__(self, inner: Any, model_path: Path) -> None:
        self.inner, self.model_path = inner, model_path

    def train(self, batch, loss_fn):
        return self.inner.train(batch, loss_fn)

    def logprobs(self, batch):
        return self.inner.logprobs(batch)

    def reference_logprobs(self, batch):
        return self.inner.reference_logprobs(batch)

    def save_checkpoint(self, path):
        self.inner.save_checkpoint(path)

    def load_checkpoint(self, path):
        self.inner.load_checkpoint(path)

    def export_hf(self, path):
        self.inner.export_hf(path)

    def weights_for_refit(self, route):
        return self.inner.weights_for_refit(route)

    def offload(self):
        self.inner.offload()

    def onload(self):
        self.inner.onload()

    def shutdown(self):
        self.inner.shutdown()


@attrs.frozen
class MicroBatchMean:
    """The loss normalised by each micro-batch's own count instead of the global one (the classic bug)."""

    inner: Any

    @property
    def group_size(self) -> int:
        return self.inner.group_size

    def count(self, batch):
        return self.inner.count(batch)

    def __call__(self, batch, logprobs, normalizer):
        return self.inner(batch, logprobs, max(self.inner.count(batch), 1e-8))


class PerMicroBatchMean(Passthrough):
    def train(self, batch, loss_fn):
        return self.inner.train(batch, MicroBatchMean(loss_fn))


class ShiftedLogprobs(Passthrough):
    def logprobs(self, batch):
        return torch.roll(self.inner.logprobs(batch), 1, dims=1) * batch["attention_mask"]


class StaleRefit(Passthrough):
    """weights_for_refit keeps sending the weights it started with."""

    def __init__(self, inner: Any, model_path: Path) -> None:
        super().__init__(inner, model_path)
        self.initial = {
            k: v.clone() for k, v in receive_weights(inner.weights_for_refit(RefitRoute(kind="object_store")))
        }
        self.sender = RefitSender()

    def weights_for_refit(self, route):
        return self.sender.publish(self.initial, route)


class NoopLoad(Passthrough):
    def load_checkpoint(self, path):
        return None


class StaleExport(Passthrough):
    """export_hf writes the model it started from."""

    def export_hf(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        for item in self.model_path.iterdir():
            shutil.copy(item, Path(path) / item.name)


class ReferenceTrains(Passthrough):
    def reference_logprobs(self, batch):
        return self.inner.logprobs(batch)


class IgnoresClipping(Passthrough):
    """Built as if policy.max_grad_norm were not set: the backend that reads no clipping setting."""

    @staticmethod
    def overrides(given):
        return [o for o in given if not o.startswith("policy.max_grad_norm=")]


class ForgetsScheduler(Passthrough):
    """Checkpoints its learning-rate schedule as it was at the start (the DTensor backend keeps it in extra.pt):
    a resumed step then runs at the wrong learning rate."""

    def save_checkpoint(self, path):
        self.inner.save_checkpoint(path)
        extra = torch.load(Path(path) / "extra.pt", weights_only=False)
        extra["scheduler"] = {**extra["scheduler"], "last_epoch": 0, "_step_count": 1}
        torch.save(extra, Path(path) / "extra.pt")


#: mutant -> a check that must fail for it
MUTANTS = {
    PerMicroBatchMean: "loss and gradients are the same with one row per micro-batch",
    ShiftedLogprobs: "logprobs vs a plain HF forward",
    StaleRefit: "export_hf round-trips (weights and logprobs)",
    NoopLoad: "checkpoint load is bit-exact; resumed steps equal uninterrupted ones",
    StaleExport: "export_hf round-trips (weights and logprobs)",
    ReferenceTrains: "the reference policy does not train",
    IgnoresClipping: "gradient clipping follows policy.max_grad_norm",
    ForgetsScheduler: "checkpoint load is bit-exact; resumed steps equal uninterrupted ones",
}

"""The start-up check of the shortcuts a model takes (``ModelForward.paths``), on the user's own model: each is
compared with whole rows on a small synthetic batch built to break it (two groups whose prompts differ in length, a
lone row, a gap in one row's loss, ids drawn from the model's whole vocabulary), logprobs at the loss positions and,
for the trained model, every parameter's gradient. One that differs by more than float rounding is turned off for
the run. Every rank runs the same batch and takes the largest gap of any rank, so all decide alike."""

from __future__ import annotations

import time
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rl_backend_dtensor.forward import SHORTCUTS, ModelForward, Paths
from rl_core.api import batch as B

#: largest gaps allowed (logprob, in nats; gradient, relative to its largest entry): float32 rounding is ~1e-6;
#: bf16 compute rounds at ~1e-2. A shortcut that is wrong is off by far more (0.7 nats and 50% for a model that
#: reads positions from its cache).
TOLERANCE = {False: (1e-3, 1e-3), True: (1e-1, 1e-1)}

#: (prompt length, response lengths) of the synthetic batch's prompt groups: a group of 3, one of 2 whose prompt
#: is shorter than the first's, and a lone row
GROUPS = ((9, (5, 3, 6)), (4, (6, 2)), (12, (4,)))


@attrs.frozen
class ShortcutCheck:
    """One shortcut against whole rows: the largest logprob gap (nats) and gradient gap (relative; None when no
    gradient is checked), and whether both are within ``TOLERANCE``."""

    name: str
    logprob_gap: float
    grad_gap: float | None
    exact: bool

    def metrics(self) -> dict[str, float]:
        gaps = {"logprob_gap": self.logprob_gap, **({"grad_gap": self.grad_gap} if self.grad_gap is not None else {})}
        return {f"shortcut/{self.name}/{k}": v for k, v in {**gaps, "on": float(self.exact)}.items()}

    def describe(self) -> str:
        grad = f", gradients {self.grad_gap:.1e} relative" if self.grad_gap is not None else ""
        return f"{self.name}: logprobs {self.logprob_gap:.1e} nats{grad} from whole rows"


def synthetic_batch(vocab: int, seed: int = 0) -> B.Batch:
    """The rows of ``GROUPS``, right-padded by 3 columns more than the longest; each group's rows share their prompt;
    the loss is on the responses, but for one token of the first row (an observation inside an episode)."""
    g = torch.Generator().manual_seed(seed)
    rows, masks = [], []
    for prompt_len, responses in GROUPS:
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        for length in responses:
            rows.append(prompt + torch.randint(0, vocab, (length,), generator=g).tolist())
            masks.append([0] * prompt_len + [1] * length)
    masks[0][GROUPS[0][0] + 2] = 0
    width = max(map(len, rows)) + 3
    ids, attn = B.pad_rows(rows, 0, width)
    loss_mask, _ = B.pad_rows(masks, 0, width)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask.float()}


def check_shortcuts(forward: ModelForward, vocab: int, *, gradients: bool) -> tuple[list[ShortcutCheck], float]:
    """Each shortcut ``forward`` takes against whole rows; those that differ are turned off in ``forward``. Returns
    the checks and the seconds they took."""
    start = time.perf_counter()
    batch = synthetic_batch(vocab)
    mask = batch["loss_mask"].to(forward.device)
    weights = 0.5 + torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)).to(forward.device)
    model = forward.model
    training = model.training
    model.train(False)  # no dropout: the passes must be comparable
    try:
        plain = _pass(forward, batch, Paths(), mask, weights, gradients)
        checks = []
        for name in SHORTCUTS:
            if not getattr(forward.paths, name):
                continue
            paths = Paths(**{name: True, **({"logits_at_loss_positions": True} if name == "shared_prefix" else {})})
            checks.append(_compare(forward, name, plain, _pass(forward, batch, paths, mask, weights, gradients)))
    finally:
        model.train(training)
        model.zero_grad(set_to_none=True)
    for check in checks:
        if not check.exact:
            forward.turn_off(check.name, f"the start-up check found it inexact on this model ({check.describe()})")
    return checks, time.perf_counter() - start


def _pass(
    forward: ModelForward, batch: B.Batch, paths: Paths, mask: torch.Tensor, weights: torch.Tensor, gradients: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logprobs at the loss positions and (with ``gradients``) this rank's shard of each parameter's gradient of
    their weighted sum."""
    model = forward.model
    # before the forward: after it, FSDP's root module holds its unsharded parameters (their gradients are not
    # the ones it accumulates into)
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(gradients):
        out = forward.logprobs(batch, paths).float() * mask  # [R, T]
        if not gradients:
            return out, {}
        (out * weights).sum().backward()
    # the gradients themselves, no copy: the next pass's ``zero_grad`` lets go of them, and new ones are allocated
    grads = {n: _local(p.grad).detach() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _compare(forward: ModelForward, name: str, plain: tuple, other: tuple) -> ShortcutCheck:
    device = forward.device
    logprob_gap = _largest(float((other[0] - plain[0]).abs().max()), device)
    grad_gap = None
    if plain[1]:
        diff = _largest(max(float((other[1][k] - g).abs().max()) for k, g in plain[1].items()), device)
        scale = _largest(max(float(g.abs().max()) for g in plain[1].values()), device)
        grad_gap = diff / scale if scale > 0 else diff
    bound_logprob, bound_grad = TOLERANCE[forward.cfg.mixed_precision]
    exact = logprob_gap <= bound_logprob and (grad_gap is None or grad_gap <= bound_grad)
    return ShortcutCheck(name=name, logprob_gap=logprob_gap, grad_gap=grad_gap, exact=exact)


def _largest(value: float, device: torch.device) -> float:
    """The largest ``value`` over the ranks (each holds a shard of the gradients)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _local(t: Any) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t

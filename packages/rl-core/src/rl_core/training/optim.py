"""Optimizer and learning-rate schedule from config, shared by training backends that use torch optimizers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rl_core.base.schema import OptimizerConfig, SchedulerConfig

if TYPE_CHECKING:
    import torch


def lr_multiplier(cfg: SchedulerConfig, step: int) -> float:
    """Factor on the base learning rate at optimizer step ``step`` (0-based).

    Linear warm-up over ``warmup_steps`` (``(step + 1) / warmup_steps``), then constant, or a decay over the
    remaining ``total_steps - warmup_steps`` to ``min_lr_ratio``: cosine ``m + (1 - m)(1 + cos(pi p)) / 2`` or
    linear ``1 - (1 - m) p``, with progress ``p`` in [0, 1].
    """
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return 1.0
    assert cfg.total_steps is not None
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    m = cfg.min_lr_ratio
    if cfg.name == "cosine":
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - m) * progress


def make_optimizer(params: Iterable[Any], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    import torch

    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(cfg, step))

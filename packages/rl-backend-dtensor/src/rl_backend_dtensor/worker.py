"""One FSDP2 rank, run inside a Ray actor: it trains on and scores the shard the driver-side ``DTensorBackend`` sends
it, and hands out its weights for refit, checkpoints and export (``loading``, ``forward`` and ``weights`` do the work)."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rl_backend_dtensor import weights
from rl_backend_dtensor.config import DTensorConfig
from rl_backend_dtensor.exactness import ShortcutCheck, check_shortcuts
from rl_backend_dtensor.forward import ModelForward
from rl_backend_dtensor.loading import load_model
from rl_core.api import (
    LossFunction,
    PolicyConfig,
    RefitPayload,
    RefitRoute,
    RefitSender,
    free_port,
    lora,
    make_optimizer,
    make_scheduler,
    node_address,
    thread_budget,
)
from rl_core.api import batch as B

log = logging.getLogger(__name__)


class DTensorWorker:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_path: str,
        policy: PolicyConfig,
        cfg: DTensorConfig,
        seed: int,
        device: str,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.model_path, self.policy, self.cfg = model_path, policy, cfg
        threads = cfg.threads_per_worker or thread_budget(max(1, (os.cpu_count() or 1) // world_size))
        torch.set_num_threads(threads)
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        torch.manual_seed(seed)
        self.lora = policy.lora
        self.model: Any = None
        self.forward: ModelForward | None = None
        self.reference: ModelForward | None = None
        self.refit_sender = RefitSender()

    # -- setup ------------------------------------------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        return node_address()[0], free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=10))
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        self.model = self._load(trainable=True)
        self.tied_copies = {lora.plain_name(n) for n in weights.tied_copies(self.model)}  # the plain model's names
        trained = [p for p in self.model.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.optimizer = make_optimizer(trained, self.policy.optimizer)
        self.scheduler = make_scheduler(self.optimizer, self.policy.scheduler)
        self.forward, shortcuts = self._checked(self.model, gradients=True)
        ip, node_id = node_address()
        return {
            "rank": self.rank,
            "ip": ip,
            "node_id": node_id,
            "device": str(self.device),
            "threads": torch.get_num_threads(),
            "shortcuts": shortcuts,
        }

    def _checked(self, model: Any, *, gradients: bool) -> tuple[ModelForward, dict[str, Any]]:
        """``model``'s forward passes, with each shortcut it takes checked against whole rows (``dtensor_cfg.
        check_shortcuts``); and what was found: the shortcuts off and why, each check's figures, the seconds."""
        forward = ModelForward(model, self.cfg, self.policy.head, self.device)
        checks: list[ShortcutCheck] = []
        seconds = 0.0
        if self.cfg.check_shortcuts:
            inner = model.get_base_model() if hasattr(model, "get_base_model") else model
            vocab = inner.config.get_text_config(decoder=True).vocab_size
            checks, seconds = check_shortcuts(forward, vocab, gradients=gradients)
        found = {
            "off": dict(forward.off),
            "checked": [c.describe() for c in checks],
            "metrics": {k: v for c in checks for k, v in c.metrics().items()},
            "seconds": seconds,
        }
        return forward, found

    def _load(self, *, trainable: bool) -> Any:
        """The policy (``trainable``), or the reference: ``policy.reference_model_name`` if set, else the policy's
        starting weights."""
        path = self.model_path if trainable else self.policy.reference_model_name or self.model_path
        return load_model(
            path, trainable=trainable, policy=self.policy, cfg=self.cfg, mesh=self.mesh, device=self.device
        )

    def _micro_batches(self, shard: B.Batch, size: int, group_size: int) -> tuple[list[B.Batch], torch.Tensor | None]:
        """This rank's micro-batches, padded with inert ones so every rank runs the same number of passes, and the
        order their rows were taken in (None: the shard's). By token budget, the rows go longest first
        (``B.longest_first``): rows of like length share a micro-batch, which is trimmed to its longest row, so
        little padding is computed."""
        order = None
        if self.cfg.dynamic_batching:
            order = B.longest_first(shard, group_size)
            mbs = B.token_budget_micro_batches(B.select(shard, order), self.cfg.max_tokens_per_microbatch, group_size)
        else:
            mbs = B.micro_batches(shard, size, group_size)
        count = torch.tensor([len(mbs)])
        if self.world_size > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        while len(mbs) < int(count):
            dummy = B.select(shard, slice(0, 1))
            dummy = {**dummy, "loss_mask": torch.zeros_like(dummy["loss_mask"])}
            mbs.append(dummy)
        return mbs, order

    @torch.no_grad()
    def logprobs(self, shard: B.Batch, reference: bool = False) -> torch.Tensor:
        assert self.forward is not None, "setup() first"
        if reference and self.lora.enabled and not self.policy.reference_model_name:  # the base: adapters off
            with self.model.disable_adapter():
                return self._all_logprobs(self.forward, shard)
        if not reference:
            return self._all_logprobs(self.forward, shard)
        if self.reference is None:
            self.reference, found = self._checked(self._load(trainable=False), gradients=False)
            for name, why in found["off"].items():
                log.warning("reference model: %s is off: %s", name, why)
        return self._all_logprobs(self.reference, shard)

    def _all_logprobs(self, forward: ModelForward, shard: B.Batch) -> torch.Tensor:
        forward.model.eval()
        rows = B.num_rows(shard)
        chunks, order = self._micro_batches(shard, self.policy.logprob_batch_size, 1)
        parts = [forward.logprobs(mb).float().cpu() for mb in chunks]
        out = B.concat([{"input_ids": p} for p in parts])["input_ids"][:rows]  # [rows, T] in the chunks' order
        if order is None:
            return out
        restored = torch.empty_like(out)
        restored[order] = out  # back in the shard's order
        return restored

    # -- training -------------------------------------------------------------------------------------------------

    def train(self, shard: B.Batch, loss_fn: LossFunction, normalizer: float) -> dict[str, float]:
        assert self.forward is not None, "setup() first"
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        mbs, _ = self._micro_batches(shard, self.policy.train_micro_batch_size, loss_fn.group_size)
        totals: dict[str, float] = {}
        tokens = self.forward.tokens
        for i, mb in enumerate(mbs):
            if self.world_size > 1:
                self.model.set_requires_gradient_sync(i == len(mbs) - 1)
            mb = {k: v.to(self.device) for k, v in mb.items()}
            logprobs = self.forward.logprobs(mb)
            loss, metrics = loss_fn(mb, logprobs, normalizer)
            # FSDP averages gradients over ranks; the loss is already a share of the global sum, so undo that.
            (loss * self.world_size).backward()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        totals["forward_tokens"] = float(self.forward.tokens - tokens)  # summed over the ranks by the driver
        return {**totals, "grad_norm": grad_norm, "lr": float(self.scheduler.get_last_lr()[0])}

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.policy.max_grad_norm if self.policy.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    # -- weights and checkpoints ----------------------------------------------------------------------------------

    def _hf_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full weights in the plain model's names (with LoRA: the adapters merged in)."""
        full = weights.full_state_dict(self.model, self.world_size, on_device=on_device)
        return lora.merged(full, self.lora.scale) if self.lora.enabled else full

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload | None:
        """Rank 0's weights as a refit payload: the plain model's (Hugging Face names; with LoRA the adapters merged
        in; a tied output layer sent once, as its embedding), or with ``route.adapters_only`` the adapters' alone
        (``peft`` names). Other ranks take part in the gather and return None. On GPU the weights stay on the
        device (the GPU routes read them there)."""
        on_device = self.device.type == "cuda"
        if route.adapters_only and self.lora.enabled:
            full = weights.full_state_dict(self.model, self.world_size, on_device=on_device, adapters_only=True)
        else:
            full = self._hf_weights(on_device)
            full = {n: t for n, t in full.items() if n not in self.tied_copies}
        return self.refit_sender.publish(full, route) if self.rank == 0 else None

    def save_checkpoint(self, path: str) -> None:
        weights.save_checkpoint(
            self.model, self.optimizer, self.scheduler, path, rank=self.rank, adapters=self.lora.enabled
        )

    def load_checkpoint(self, path: str) -> None:
        weights.load_checkpoint(self.model, self.optimizer, self.scheduler, path, adapters=self.lora.enabled)

    def export_hf(self, path: str) -> None:
        """The plain model (with LoRA: merged) at ``path``, and with LoRA its adapters at ``path/adapter``."""
        tokenizer = self.policy.tokenizer_name or self.model_path
        weights.export_hf(
            self.model, path, rank=self.rank, world_size=self.world_size, lora_cfg=self.lora, tokenizer=tokenizer
        )

    def offload(self) -> None:
        """Move parameters and optimizer state to CPU while the engine generates (GPU only; a no-op on CPU). The
        last refit is released first: the engine has loaded it, and its CUDA IPC tensors would pin GPU memory."""
        self.refit_sender.release()
        if self.device.type == "cuda":
            self.model.to("cpu")
            _move_optimizer(self.optimizer, "cpu")
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
            _move_optimizer(self.optimizer, self.device)


def _move_optimizer(optimizer: torch.optim.Optimizer, device: Any) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device)

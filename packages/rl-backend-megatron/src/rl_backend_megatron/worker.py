"""One megatron-core rank (tensor x data parallel), run inside a Ray actor."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl_backend_megatron.convert import CONVERTED, megatron_to_hf, shard, unshard
from rl_backend_megatron.plugin import MegatronConfig
from rl_core import batch as B
from rl_core.config import PolicyConfig, SchedulerConfig
from rl_core.optim import lr_multiplier
from rl_core.protocols import LossFunction, RefitRoute
from rl_core.weights import RefitSender

#: the sub-folder of a run checkpoint holding the Megatron dist-checkpoint (model and optimizer).
DIST_CHECKPOINT = "dist_checkpoint"


class MegatronWorker:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_path: str,
        converted: str,
        policy: PolicyConfig,
        cfg: MegatronConfig,
        seed: int,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.model_path, self.converted, self.policy, self.cfg = model_path, Path(converted), policy, cfg
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        torch.manual_seed(seed)
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        self.reference: Any = None
        self.steps = 0
        self.refit_sender = RefitSender()

    def address(self) -> tuple[str, int]:
        from rl_core.cluster import free_port, node_address

        return node_address()[0], free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        from rl_backend_megatron import compat

        compat.apply()
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=10))
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from transformers import AutoConfig

        ps.initialize_model_parallel(tensor_model_parallel_size=self.cfg.tensor_model_parallel_size)
        self.ps = ps
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        model = self._load_model()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
        )
        self.model = DistributedDataParallel(model.config, ddp_config, model)
        o = self.cfg.optimizer
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer=o.optimizer,
                lr=o.lr,
                min_lr=o.min_lr,
                weight_decay=o.weight_decay,
                adam_beta1=o.adam_beta1,
                adam_beta2=o.adam_beta2,
                adam_eps=o.adam_eps,
                clip_grad=o.clip_grad,
                bf16=False,
                fp16=False,
            ),
            [self.model],
        )
        s = self.cfg.scheduler
        self.schedule = SchedulerConfig(
            name={"constant": "constant", "cosine": "cosine", "linear": "linear"}[s.lr_decay_style],
            warmup_steps=s.lr_warmup_iters,
            total_steps=s.lr_decay_iters,
            min_lr_ratio=o.min_lr / o.lr,
        )
        from rl_core.cluster import node_address

        ip, node_id = node_address()
        return {
            "rank": self.rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "ip": ip,
            "node_id": node_id,
        }

    def _load_model(self, state: dict[str, torch.Tensor] | None = None) -> Any:
        """A GPTModel holding this rank's shard of ``state`` (default: the converted weights)."""
        from safetensors.torch import load_file

        from rl_backend_megatron.model import build_gpt

        tp, tp_rank = self.cfg.tensor_model_parallel_size, self.ps.get_tensor_model_parallel_rank()
        model = build_gpt(self.hf_config, tp, 1).to(self.device)
        full = state if state is not None else load_file(str(self.converted / CONVERTED))
        missing, unexpected = model.load_state_dict(
            {k: shard(k, v, tp_rank, tp) for k, v in full.items()}, strict=False
        )
        missing = [m for m in missing if not m.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
        return model

    # -- forward and training -----------------------------------------------------------------------------------

    def _logprobs(self, model: Any, mb: B.Batch) -> torch.Tensor:
        from rl_backend_megatron.model import token_logprobs

        ids = mb["input_ids"].to(self.device)
        return token_logprobs(model, ids) * mb["attention_mask"].to(self.device)

    @torch.no_grad()
    def logprobs(self, shard_: B.Batch, reference: bool = False) -> torch.Tensor:
        if reference and self.reference is None:
            self.reference = self._load_model().eval()
        model = self.reference if reference else self.model
        model.eval()
        parts = [
            self._logprobs(model, mb).float().cpu() for mb in B.micro_batches(shard_, self.policy.logprob_batch_size)
        ]
        return B.concat([{"input_ids": p} for p in parts])["input_ids"]

    def train(self, shard_: B.Batch, loss_fn: LossFunction, normalizer: float) -> dict[str, float]:
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        dp = self.ps.get_data_parallel_world_size()
        totals: dict[str, float] = {}
        for mb in B.micro_batches(shard_, self.policy.train_micro_batch_size, loss_fn.group_size):
            loss, metrics = loss_fn(mb, self._logprobs(self.model, mb), normalizer)
            # Megatron DDP averages gradients over data-parallel ranks; the loss is already a share of the sum.
            (loss * dp).backward()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        self.model.finish_grad_sync()
        lr = self.cfg.optimizer.lr * lr_multiplier(self.schedule, self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _ok, grad_norm, _zeros = self.optimizer.step()
        self.steps += 1
        return {**totals, "grad_norm": float(grad_norm or 0.0), "lr": lr}

    # -- full weights ---------------------------------------------------------------------------------------------

    def _gather(self, local: dict[str, torch.Tensor], on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full tensors from this TP group's shards (every TP rank takes part); on CPU unless ``on_device``."""
        group, tp = self.ps.get_tensor_model_parallel_group(), self.cfg.tensor_model_parallel_size
        out = {}
        for name, t in local.items():
            t = t.detach().contiguous()
            if tp > 1:
                parts = [torch.empty_like(t) for _ in range(tp)]
                dist.all_gather(parts, t, group=group)
                t = unshard(name, parts)
            out[name] = t if on_device else t.cpu()
        return out

    def _named_params(self) -> dict[str, torch.nn.Parameter]:
        return {n.removeprefix("module."): p for n, p in self.model.named_parameters()}

    def full_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        return self._gather({n: p.data for n, p in self._named_params().items()}, on_device)

    def weights_for_refit(self, route: RefitRoute) -> Any:
        """Rank 0's full weights in Hugging Face names, in ``route``'s form; other ranks take part in the
        gather and return None."""
        hf = megatron_to_hf(self.full_weights(on_device=True), self.hf_config)
        return self.refit_sender.publish(hf, route) if self.rank == 0 else None

    def export_hf(self, path: str) -> None:
        hf = megatron_to_hf(self.full_weights(), self.hf_config)
        if self.rank == 0:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_config(self.hf_config, dtype=torch.float32)
            model.load_state_dict(hf, strict=not self.hf_config.tie_word_embeddings)
            model.save_pretrained(path, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(path)
        dist.barrier()

    # -- checkpoints: Megatron dist-checkpointing (torch_dist), loadable by any TP layout --------------------------

    def _sharded_state(self, *, is_loading: bool) -> dict[str, Any]:
        """Model and optimizer as sharded tensors. Adam's state is made complete first (zero moments, step 0:
        what a first step would create), so that a checkpoint taken before any step loads like any other."""
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            if opt.init_state_fn is not None:
                opt.init_state_fn(opt.optimizer, opt.config)
                for group in opt.optimizer.param_groups:
                    for p in group["params"]:
                        opt.optimizer.state[p].setdefault("step", torch.tensor(0.0))
        model = self.model.module.sharded_state_dict()
        return {"model": model, "optimizer": self.optimizer.sharded_state_dict(model, is_loading=is_loading)}

    def save_checkpoint(self, path: str) -> None:
        from megatron.core import dist_checkpointing

        folder = Path(path) / DIST_CHECKPOINT
        folder.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(self._sharded_state(is_loading=False), str(folder))
        if self.rank == 0:
            torch.save({"steps": self.steps, "rng": torch.get_rng_state()}, Path(path) / "extra.pt")
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        from megatron.core import dist_checkpointing

        with torch.no_grad():
            state = dist_checkpointing.load(self._sharded_state(is_loading=True), str(Path(path) / DIST_CHECKPOINT))
            self.model.module.load_state_dict(state["model"], strict=False)
            optim = state["optimizer"]
            for part in optim if isinstance(optim, list) else [optim]:
                # megatron stores one common step and none when it is 0: torch's Adam needs one per parameter
                for entry in part["state"].values():
                    if isinstance(entry, dict):
                        entry.setdefault("step", torch.tensor(0.0))
            self.optimizer.load_state_dict(optim)
        extra = torch.load(Path(path) / "extra.pt", weights_only=False)
        self.steps = int(extra["steps"])
        torch.set_rng_state(extra["rng"])

    def offload(self) -> None:
        return None

    def onload(self) -> None:
        return None

"""One megatron-core rank (tensor x pipeline x data parallel), run inside a Ray actor."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl_backend_megatron.config import MegatronConfig
from rl_backend_megatron.convert import CONVERTED, megatron_to_hf, shard, unshard
from rl_core.api import (
    LossFunction,
    PolicyConfig,
    RefitPayload,
    RefitRoute,
    RefitSender,
    free_port,
    lr_multiplier,
    node_address,
    thread_budget,
)
from rl_core.api import batch as B

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")

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
        device: str,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.model_path, self.converted, self.policy, self.cfg = model_path, Path(converted), policy, cfg
        torch.set_num_threads(thread_budget(max(1, (os.cpu_count() or 1) // world_size)))
        torch.manual_seed(seed)
        self.seed = seed
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        self.reference: Any = None
        self.steps = 0
        self.refit_sender = RefitSender()

    def address(self) -> tuple[str, int]:
        return node_address()[0], free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        from rl_backend_megatron import compat

        if self.device.type == "cpu":
            compat.apply()
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=10))
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from transformers import AutoConfig

        self.pp = self.cfg.pipeline_model_parallel_size
        ps.initialize_model_parallel(
            tensor_model_parallel_size=self.cfg.tensor_model_parallel_size, pipeline_model_parallel_size=self.pp
        )
        self.ps = ps
        if self.device.type == "cuda":
            # megatron's dropout and initialisation draw from its tracked CUDA RNG states, which must be seeded
            from megatron.core import tensor_parallel

            torch.cuda.set_device(self.device)
            tensor_parallel.model_parallel_cuda_manual_seed(self.seed)
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        model = self._load_model()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
        )
        self.model = DistributedDataParallel(model.config, ddp_config, model)
        # after the last micro-batch the schedule syncs gradients over data-parallel ranks and, with tied
        # embeddings split over pipeline stages, sums the embedding's gradient over its two copies
        from megatron.core.distributed import finalize_model_grads

        model.config.finalize_model_grads_func = finalize_model_grads
        self.optimizer = self._optimizer()
        ip, node_id = node_address()
        return {
            "rank": self.rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "ip": ip,
            "node_id": node_id,
        }

    def _optimizer(self) -> Any:
        """Megatron's optimizer with the core's ``policy.optimizer`` settings and ``policy.max_grad_norm``."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o, self.schedule = self.policy.optimizer, self.policy.scheduler
        return get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam" if o.name == "adamw" else "sgd",  # megatron's adam decouples weight decay
                lr=o.lr,
                min_lr=o.lr * self.schedule.min_lr_ratio,
                weight_decay=o.weight_decay,
                adam_beta1=o.betas[0],
                adam_beta2=o.betas[1],
                adam_eps=o.eps,
                sgd_momentum=0.0,  # plain SGD, as torch.optim.SGD in the other backends
                clip_grad=self.policy.max_grad_norm or 0.0,
                bf16=False,
                fp16=False,
            ),
            [self.model],
        )

    def _to_global(self, name: str) -> str:
        """A local parameter name with this pipeline stage's layer index turned into the model's."""
        offset = self.ps.get_pipeline_model_parallel_rank() * (self.hf_config.num_hidden_layers // self.pp)
        return _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", name)

    def _load_model(self) -> Any:
        """This rank's part of the converted model: its pipeline stage's layers, its tensor-parallel shard."""
        from safetensors.torch import load_file

        from rl_backend_megatron.model import build_gpt

        tp, tp_rank = self.cfg.tensor_model_parallel_size, self.ps.get_tensor_model_parallel_rank()
        model = build_gpt(
            self.hf_config,
            tp,
            self.pp,
            first_stage=self.ps.is_pipeline_first_stage(),
            last_stage=self.ps.is_pipeline_last_stage(),
        ).to(self.device)
        full = load_file(str(self.converted / CONVERTED))
        if "output_layer.weight" not in full:  # tied: a last stage holds its own copy of the embedding
            full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
        local = {}
        for name in model.state_dict():
            if not name.endswith("_extra_state"):
                g = self._to_global(name)
                if g not in full:
                    raise RuntimeError(f"the converted weights have no {g!r} (for this rank's {name!r})")
                local[name] = shard(g, full[g], tp_rank, tp)
        model.load_state_dict(local, strict=False)
        return model

    # -- forward and training: megatron's pipeline schedules (no pipelining when PP = 1) -------------------------

    def _schedule(
        self, model: Any, shard_: B.Batch, size: int, on_logprobs: Any, forward_only: bool, group_size: int = 1
    ) -> None:
        """Run ``shard_`` through every pipeline stage in micro-batches of ``size`` rows (padded with inert rows
        to equal shapes, as the schedule sends fixed-size activations between stages). On the last stage,
        ``on_logprobs(mb, logprobs [b, T])`` returns the loss to backpropagate (ignored when ``forward_only``)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from rl_backend_megatron.model import forward, token_logprobs

        padded, _ = B.pad_to_multiple(shard_, size)
        mbs = B.micro_batches(padded, size, group_size)
        n = len(mbs)

        def step(data: Any, chunk: Any) -> tuple[torch.Tensor, Any]:
            # every tensor the loss reads on this rank's device (the driver's shards arrive on CPU)
            mb = B.to_device(next(data), self.device)
            ids = mb["input_ids"]

            def loss(logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                lp = token_logprobs(logits, ids) * mb["attention_mask"]
                # the schedule divides by the number of micro-batches: undo it, the loss is a global share
                return on_logprobs(mb, lp) * n, {}

            return forward(chunk, ids), loss

        get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iter(mbs),
            model=[model],
            num_microbatches=n,
            seq_length=shard_["input_ids"].shape[1],
            micro_batch_size=size,
            forward_only=forward_only,
        )

    @torch.no_grad()
    def logprobs(self, shard_: B.Batch, reference: bool = False) -> torch.Tensor | None:
        """``[rows, T]`` logprobs on the last pipeline stage; None on the others."""
        if reference and self.reference is None:
            self.reference = self._load_model().eval()
        model = self.reference if reference else self.model
        model.eval()
        parts: list[torch.Tensor] = []

        def keep(_mb: B.Batch, lp: torch.Tensor) -> torch.Tensor:
            parts.append(lp.float().cpu())
            return lp.sum() * 0

        self._schedule(model, shard_, self.policy.logprob_batch_size, keep, forward_only=True)
        if not parts:
            return None
        return torch.cat(parts)[: B.num_rows(shard_)]

    def train(self, shard_: B.Batch, loss_fn: LossFunction, normalizer: float) -> dict[str, float]:
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        dp = self.ps.get_data_parallel_world_size()
        totals: dict[str, float] = {}

        def loss_of(mb: B.Batch, lp: torch.Tensor) -> torch.Tensor:
            loss, metrics = loss_fn(mb, lp, normalizer)
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            # Megatron DDP averages gradients over data-parallel ranks; the loss is already a share of the sum.
            return loss * dp

        self._schedule(
            self.model, shard_, self.policy.train_micro_batch_size, loss_of, False, group_size=loss_fn.group_size
        )
        lr = self.policy.optimizer.lr * lr_multiplier(self.schedule, self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _ok, grad_norm, _zeros = self.optimizer.step()
        self.steps += 1
        return {**totals, "grad_norm": float(grad_norm or 0.0), "lr": lr}

    # -- full weights ---------------------------------------------------------------------------------------------

    def _gather(self, local: dict[str, torch.Tensor], on_device: bool = False) -> dict[str, torch.Tensor]:
        """Full tensors in the model's names: this TP group's shards joined (every TP rank takes part), then, with
        pipeline parallelism, every stage's layers (every rank takes part; the result is complete on PP rank 0).
        On CPU unless ``on_device``."""
        group, tp = self.ps.get_tensor_model_parallel_group(), self.cfg.tensor_model_parallel_size
        out = {}
        for name, t in local.items():
            t = t.detach().contiguous()
            if tp > 1:
                parts = [torch.empty_like(t) for _ in range(tp)]
                dist.all_gather(parts, t, group=group)
                t = unshard(name, parts)
            out[self._to_global(name)] = t if on_device and self.pp == 1 else t.cpu()
        if self.pp == 1:
            return out
        if self.hf_config.tie_word_embeddings and not self.ps.is_pipeline_first_stage():
            out.pop("output_layer.weight", None)  # the last stage's copy of the embedding
        stages: list[Any] = [None] * self.pp
        dist.all_gather_object(stages, out, group=self.ps.get_pipeline_model_parallel_group())
        return {n: t.to(self.device) if on_device else t for stage in stages for n, t in stage.items()}

    def full_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        return self._gather({n.removeprefix("module."): p.data for n, p in self.model.named_parameters()}, on_device)

    def weights_for_refit(self, route: RefitRoute) -> RefitPayload | None:
        """Rank 0's full weights in Hugging Face names as a refit payload; other ranks take part in the gather
        and return None."""
        hf = megatron_to_hf(self.full_weights(on_device=True), self.hf_config)
        return self.refit_sender.publish(hf, route) if self.rank == 0 else None

    def export_hf(self, path: str) -> None:
        hf = megatron_to_hf(self.full_weights(), self.hf_config)
        if self.rank == 0:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_config(self.hf_config, dtype=torch.float32)
            model.load_state_dict(hf, strict=not self.hf_config.tie_word_embeddings)
            model.save_pretrained(path, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.policy.tokenizer_name or self.model_path).save_pretrained(path)
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
        """Release the last refit's tensors (they pin device memory); the model stays on its device."""
        self.refit_sender.release()

    def onload(self) -> None:
        return None

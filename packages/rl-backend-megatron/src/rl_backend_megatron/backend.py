"""The driver side of the megatron backend: tensor x pipeline x data parallel ``MegatronWorker`` ranks in Ray
actors."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_backend_megatron.convert import convert_once
from rl_backend_megatron.plugin import MegatronConfig
from rl_backend_megatron.worker import DIST_CHECKPOINT
from rl_core import batch as B
from rl_core.cluster import WorkerGroup
from rl_core.config import Config
from rl_core.errors import ConfigError, InputError
from rl_core.protocols import LossFunction, RefitRoute

log = logging.getLogger(__name__)


class MegatronBackend:
    """Implements ``rl_core.protocols.TrainingBackend`` on megatron-core (TP x PP x DP)."""

    def __init__(self, config: Config, section: MegatronConfig) -> None:
        import torch

        from rl_backend_megatron.worker import MegatronWorker

        policy = config.policy
        tp, pp = section.tensor_model_parallel_size, section.pipeline_model_parallel_size
        if policy.num_workers % (tp * pp):
            raise ConfigError(
                f"policy.num_workers ({policy.num_workers}) must be a multiple of "
                f"policy.megatron_cfg.tensor_model_parallel_size x pipeline_model_parallel_size ({tp} x {pp})"
            )
        if not (Path(policy.model_name) / "config.json").is_file():
            raise InputError(f"policy.model_name: {policy.model_name!r} is not a Hugging Face model folder")
        from transformers import AutoConfig

        layers = AutoConfig.from_pretrained(policy.model_name).num_hidden_layers
        if layers % pp:
            raise ConfigError(
                f"policy.megatron_cfg.pipeline_model_parallel_size ({pp}) must divide the model's {layers} layers"
            )
        converted = convert_once(Path(policy.model_name), force=section.force_reconvert_from_hf, log=log.info)
        self.policy, self.tp, self.world = policy, tp, policy.num_workers
        self.dp = self.world // (tp * pp)
        use_gpu = torch.cuda.is_available() or config.cluster.gpus_per_node > 0
        self.group = WorkerGroup(
            MegatronWorker,
            self.world,
            lambda rank: dict(
                rank=rank,
                world_size=self.world,
                model_path=policy.model_name,
                converted=str(converted),
                policy=policy,
                cfg=section,
                seed=config.seed,
            ),
            name="policy",
            placement=config.cluster.placement,
            gpus_per_worker=1.0 if use_gpu else 0.0,
            required_paths=[policy.model_name, str(converted)],
            log_dir=Path(config.run_dir).resolve() / "logs",
        )
        master = self.group.get([self.group.actors[0].address.remote()])[0]
        self.workers = self.group.call("setup", *master)
        self.dp_of = [w["dp_rank"] for w in self.workers]
        # one rank per data-parallel group reports results: tensor-parallel rank 0 of the last pipeline stage
        self.reporters = [w["tp_rank"] == 0 and w["pp_rank"] == pp - 1 for w in self.workers]

    def _check(self, batch: B.Batch) -> None:
        if batch["input_ids"].shape[1] > self.policy.max_total_sequence_length:
            raise InputError(
                f"a batch has sequences of {batch['input_ids'].shape[1]} tokens, more than "
                f"policy.max_total_sequence_length ({self.policy.max_total_sequence_length})"
            )

    def _per_rank(self, batch: B.Batch, group_size: int) -> tuple[list[B.Batch], int]:
        padded, rows = B.pad_to_multiple(batch, self.dp * group_size)
        shards = B.split(padded, self.dp, group_size)
        return [shards[d] for d in self.dp_of], rows

    def train(self, batch: B.Batch, loss_fn: LossFunction) -> dict[str, float]:
        self._check(batch)
        steps = []
        for chunk in B.micro_batches(batch, self.policy.train_global_batch_size, loss_fn.group_size):
            normalizer = max(loss_fn.count(chunk), 1e-8)
            shards, _ = self._per_rank(chunk, loss_fn.group_size)
            results = self.group.call_each("train", [(s, loss_fn, normalizer) for s in shards])
            firsts = [r for r, reports in zip(results, self.reporters, strict=True) if reports]
            merged = {k: sum(r[k] for r in firsts) for k in firsts[0] if k not in ("grad_norm", "lr")}
            merged.update(grad_norm=results[0]["grad_norm"], lr=results[0]["lr"])
            steps.append(merged)
        return {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}

    def _logprobs(self, batch: B.Batch, reference: bool) -> Any:
        import torch

        self._check(batch)
        shards, rows = self._per_rank(batch, 1)
        parts = self.group.call_each("logprobs", [(s, reference) for s in shards])
        by_dp = {w["dp_rank"]: p for w, p, r in zip(self.workers, parts, self.reporters, strict=True) if r}
        width = batch["input_ids"].shape[1]
        ordered = [torch.nn.functional.pad(by_dp[d], (0, width - by_dp[d].shape[1])) for d in range(self.dp)]
        return torch.cat(ordered)[:rows]

    def logprobs(self, batch: B.Batch) -> Any:
        return self._logprobs(batch, reference=False)

    def reference_logprobs(self, batch: B.Batch) -> Any:
        return self._logprobs(batch, reference=True)

    def weights_for_refit(self, route: RefitRoute) -> Sequence[Any]:
        return [ref for ref in self.group.call("weights_for_refit", route) if ref is not None]

    def save_checkpoint(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.group.call("save_checkpoint", str(path))

    def load_checkpoint(self, path: Path) -> None:
        if not (Path(path) / "extra.pt").is_file() or not (Path(path) / DIST_CHECKPOINT).is_dir():
            raise InputError(
                f"{path} is not a checkpoint of the megatron backend (no {DIST_CHECKPOINT}/ Megatron dist-checkpoint)"
            )
        self.group.call("load_checkpoint", str(path))

    def export_hf(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.group.call("export_hf", str(path))

    def offload(self) -> None:
        self.group.call("offload")

    def onload(self) -> None:
        self.group.call("onload")

    def shutdown(self) -> None:
        self.group.shutdown()

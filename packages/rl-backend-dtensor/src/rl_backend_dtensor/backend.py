"""The driver side of the DTensor backend: a group of ``DTensorWorker`` Ray actors, one per data-parallel rank."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_backend_dtensor.plugin import DTensorConfig
from rl_core import batch as B
from rl_core.cluster import WorkerGroup
from rl_core.config import Config
from rl_core.errors import InputError
from rl_core.protocols import LossFunction, RefitRoute


def check_model_folder(path: str, trust_remote_code: bool) -> None:
    """A clear error for a folder that does not exist or does not hold a causal LM."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        what = "does not exist" if not folder.exists() else "has no config.json"
        raise InputError(f"policy.model_name: the model folder {path!r} {what}; give a local Hugging Face folder")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise InputError(
            f"policy.model_name: {path!r} is a {config.model_type!r} model ({', '.join(config.architectures or [])}), "
            "which is not a causal language model; give a checkpoint with a *ForCausalLM architecture"
        )


class DTensorBackend:
    """Implements ``rl_core.protocols.TrainingBackend`` over FSDP2 ranks in Ray actors."""

    def __init__(self, config: Config, section: DTensorConfig) -> None:
        import torch

        from rl_backend_dtensor.worker import DTensorWorker

        policy = config.policy
        check_model_folder(policy.model_name, policy.trust_remote_code)
        self.policy = policy
        self.world = policy.num_workers
        use_gpu = torch.cuda.is_available() or config.cluster.gpus_per_node > 0
        self.group = WorkerGroup(
            DTensorWorker,
            self.world,
            lambda rank: dict(
                rank=rank,
                world_size=self.world,
                model_path=policy.model_name,
                policy=policy,
                cfg=section,
                seed=config.seed,
            ),
            name="policy",
            placement=config.cluster.placement,
            gpus_per_worker=1.0 if use_gpu else 0.0,
            # the run folder (checkpoints) once the driver has made it: every node must see the same one
            required_paths=[policy.model_name, *[str(p) for p in [Path(config.run_dir).resolve()] if p.is_dir()]],
            log_dir=Path(config.run_dir).resolve() / "logs",
        )
        master = self.group.get([self.group.actors[0].address.remote()])[0]
        self.workers = self.group.call("setup", *master)

    # -- batches --------------------------------------------------------------------------------------------------

    def _check(self, batch: B.Batch) -> None:
        width = batch["input_ids"].shape[1]
        if width > self.policy.max_total_sequence_length:
            raise InputError(
                f"a batch has sequences of {width} tokens, more than policy.max_total_sequence_length "
                f"({self.policy.max_total_sequence_length}); raise it or shorten the data"
            )
        if B.num_rows(batch) == 0:
            raise InputError("the batch is empty")

    def _shards(self, batch: B.Batch, group_size: int) -> tuple[list[B.Batch], int]:
        padded, rows = B.pad_to_multiple(batch, self.world * group_size)
        return B.split(padded, self.world, group_size), rows

    def train(self, batch: B.Batch, loss_fn: LossFunction) -> dict[str, float]:
        """One optimizer step per ``policy.train_global_batch_size`` rows; metrics averaged over those steps."""
        self._check(batch)
        gbs = self.policy.train_global_batch_size
        steps: list[dict[str, float]] = []
        for chunk in B.micro_batches(batch, gbs, loss_fn.group_size):
            normalizer = max(loss_fn.count(chunk), 1e-8)
            shards, _rows = self._shards(chunk, loss_fn.group_size)
            results = self.group.call_each("train", [(s, loss_fn, normalizer) for s in shards])
            merged = {k: sum(r[k] for r in results) for k in results[0] if k not in ("grad_norm", "lr")}
            merged.update(grad_norm=results[0]["grad_norm"], lr=results[0]["lr"])
            steps.append(merged)
        return {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}

    def _logprobs(self, batch: B.Batch, reference: bool) -> Any:
        import torch

        self._check(batch)
        shards, rows = self._shards(batch, 1)
        parts = self.group.call_each("logprobs", [(s, reference) for s in shards])
        width = batch["input_ids"].shape[1]
        parts = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
        return torch.cat(parts)[:rows]

    def logprobs(self, batch: B.Batch) -> Any:
        return self._logprobs(batch, reference=False)

    def reference_logprobs(self, batch: B.Batch) -> Any:
        return self._logprobs(batch, reference=True)

    # -- weights --------------------------------------------------------------------------------------------------

    def weights_for_refit(self, route: RefitRoute) -> Sequence[Any]:
        return [ref for ref in self.group.call("weights_for_refit", route) if ref is not None]

    def save_checkpoint(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.group.call("save_checkpoint", str(path))

    def load_checkpoint(self, path: Path) -> None:
        if not (Path(path) / "extra.pt").is_file():
            raise InputError(f"{path} is not a checkpoint of the dtensor backend (no extra.pt)")
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

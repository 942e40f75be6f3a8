"""The driver side of the megatron backend: tensor x pipeline x data parallel ``MegatronWorker`` ranks in Ray
actors, driven by the core's ``GroupBackend``."""

from __future__ import annotations

import logging
from pathlib import Path

from rl_backend_megatron.config import MegatronConfig
from rl_backend_megatron.convert import convert_once
from rl_backend_megatron.worker import DIST_CHECKPOINT
from rl_core.api import Config, ConfigError, GroupBackend, check_model_folder, start_ranks

log = logging.getLogger(__name__)


def _check_checkpoint(path: Path) -> str | None:
    if (path / "extra.pt").is_file() and (path / DIST_CHECKPOINT).is_dir():
        return None
    return f"no {DIST_CHECKPOINT}/ Megatron dist-checkpoint and extra.pt (written by the megatron backend's save)"


def make_backend(config: Config, section: MegatronConfig) -> GroupBackend:
    from transformers import AutoConfig

    from rl_backend_megatron.worker import MegatronWorker

    policy = config.policy
    tp, pp = section.tensor_model_parallel_size, section.pipeline_model_parallel_size
    if policy.num_workers % (tp * pp):
        raise ConfigError(
            f"policy.num_workers ({policy.num_workers}) must be a multiple of "
            f"policy.megatron_cfg.tensor_model_parallel_size x pipeline_model_parallel_size ({tp} x {pp})"
        )
    check_model_folder(policy.model_name)
    layers = AutoConfig.from_pretrained(policy.model_name).num_hidden_layers
    if layers % pp:
        raise ConfigError(
            f"policy.megatron_cfg.pipeline_model_parallel_size ({pp}) must divide the model's {layers} layers"
        )
    converted = convert_once(Path(policy.model_name), force=section.force_reconvert_from_hf, log=log.info)
    args = {"converted": str(converted), "cfg": section}
    group, workers = start_ranks(MegatronWorker, config, args, required_paths=[policy.model_name, str(converted)])
    # one rank per data-parallel group reports results: tensor-parallel rank 0 of the last pipeline stage
    return GroupBackend(
        group,
        policy,
        dp_rank=[w["dp_rank"] for w in workers],
        reports=[w["tp_rank"] == 0 and w["pp_rank"] == pp - 1 for w in workers],
        check_checkpoint=_check_checkpoint,
    )

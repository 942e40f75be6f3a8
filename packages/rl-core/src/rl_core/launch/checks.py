"""The checks a run passes before any worker starts, each a clear error naming the key to change: the run folder,
the model's context, a reference model's vocabulary, the loggers' packages, reward micro-batching, and a run folder
already checkpointed past the steps asked for."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_core.base.errors import ConfigError, InputError
from rl_core.base.schema import Config, PolicyConfig, to_dict
from rl_core.data.models import check_model_folder, resolve_model_path
from rl_core.outputs.checkpoint import CheckpointManager, verify
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import LoggerSpec
from rl_core.rewards.combine import NamedRewardSource
from rl_core.training.loops import refuse_past_the_end


def check_run_folder(run_dir: Path, need_bytes: int = 0) -> None:
    """The run folder (and its ``checkpoints/``) can be written and has room, or a clear error now."""
    for folder in (run_dir, run_dir / "checkpoints"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".rl-core-write-test", "w") as probe:
                probe.write("ok")
            (folder / ".rl-core-write-test").unlink()
        except OSError as exc:
            raise InputError(
                f"run_dir: cannot write in {folder} ({exc.strerror or exc}); make it writable or choose another run_dir"
            ) from None
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise InputError(
            f"run_dir: {run_dir} has {free / 2**20:.0f} MiB free, and a checkpoint of this model needs about "
            f"{need_bytes / 2**20:.0f} MiB; free some space or choose another run_dir"
        )


def model_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) or sum(
        p.stat().st_size for p in Path(path).glob("*.bin")
    )


def reference(policy: PolicyConfig) -> str | None:
    """``policy.reference_model_name`` resolved to a folder, checked to be a causal LM with the policy's vocabulary
    (its logprobs are compared token by token with the policy's)."""
    if policy.reference_model_name is None:
        return None
    key = "policy.reference_model_name"
    path = resolve_model_path(policy.reference_model_name, key)
    check_model_folder(path, key=key, trust_remote_code=policy.trust_remote_code)
    from transformers import AutoConfig

    sizes = [
        AutoConfig.from_pretrained(p, trust_remote_code=policy.trust_remote_code).vocab_size
        for p in (policy.model_name, path)
    ]
    if sizes[0] != sizes[1]:
        raise InputError(
            f"{key}: {path} has a vocabulary of {sizes[1]} tokens, the policy ({policy.model_name}) {sizes[0]}; the "
            "reference must share the policy's tokenizer"
        )
    return path


def check_lengths(config: Config, model: str, *, rollouts: bool) -> None:
    """``policy.max_total_sequence_length`` within the model's context, and room in it for a prompt after
    ``policy.generation.max_new_tokens``."""
    from transformers import AutoConfig

    policy = config.policy
    context = getattr(
        AutoConfig.from_pretrained(model, trust_remote_code=policy.trust_remote_code), "max_position_embeddings", None
    )
    if context is not None and policy.max_total_sequence_length > context:
        raise ConfigError(
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length}) is more than the model's context "
            f"({context}, max_position_embeddings in {model}/config.json); lower it"
        )
    new_tokens = policy.generation.max_new_tokens
    if rollouts and new_tokens >= policy.max_total_sequence_length:
        raise ConfigError(
            f"policy.generation.max_new_tokens ({new_tokens}) leaves no room for a prompt within "
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length}); lower it, or raise the other"
        )


def enabled_loggers(config: Config, registry: Registry) -> list[LoggerSpec]:
    """The registered loggers whose ``enabled_by`` flag is on (loggers without one are always on)."""
    return [
        spec
        for spec in registry.specs(LoggerSpec).values()
        if spec.enabled_by is None or _flag(to_dict(config), spec.enabled_by)
    ]


def _flag(data: Mapping[str, Any], dotted: str) -> bool:
    """The boolean at a dotted key of the config's plain data (False where it is not set)."""
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return bool(node)


def check_loggers(config: Config, registry: Registry) -> None:
    """Each enabled logger's modules import, or a clear error naming the flag and the package, now."""

    for spec in enabled_loggers(config, registry):
        missing = [m for m in spec.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise InputError(
                f"{spec.enabled_by or 'logger ' + spec.name} is on, but {', '.join(missing)} is not installed: "
                f"pip install '{spec.package or missing[0]}', or turn the logger off"
            )


def check_micro_batching(config: Config, rewards: list[NamedRewardSource]) -> None:
    """NeMo-Aligner's constraint: a reward model that splits each request into ``inference_micro_batch_size``
    chunks over ``replicas`` data-parallel copies needs ``inference_micro_batch_size x replicas <=
    rollout_micro_batch_size`` (the rollouts of one request), or some replicas idle."""
    section: Any = config.sections.get(config.algorithm)
    rollout_mbs = getattr(section, "rollout_micro_batch_size", None)
    if rollout_mbs is None:
        return
    for named in rewards:
        report = getattr(named.source, "micro_batching", None)
        shape = report() if report is not None else None
        if shape is None:
            continue
        inference_mbs, replicas = shape
        if inference_mbs * replicas > rollout_mbs:
            raise ConfigError(
                f"{config.algorithm}.rollout_micro_batch_size ({rollout_mbs}) is smaller than reward source "
                f"{named.name!r}'s inference_micro_batch_size x replicas ({inference_mbs} x {replicas} = "
                f"{inference_mbs * replicas}): each request is split over the reward model's replicas, so some would "
                "idle. Raise rollout_micro_batch_size, or lower the reward model's inference_micro_batch_size or "
                "replicas"
            )


def check_not_past_the_end(config: Config, run_dir: Path) -> None:
    """Before anything starts (not once the workers have, tens of seconds later): a run folder whose newest whole
    checkpoint is past the steps this config asks for is refused (``refuse_past_the_end``). Only checkpoints past
    the end are verified here; the resume verifies the one it loads."""
    total = getattr(config.sections.get(config.algorithm), "max_num_steps", None)
    if total is None:
        return
    for checkpoint in reversed(CheckpointManager(run_dir, config.checkpointing).complete()):
        if checkpoint.step <= total:
            return
        if verify(checkpoint.path) is None:
            refuse_past_the_end(run_dir, checkpoint.step, total)

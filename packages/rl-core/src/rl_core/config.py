"""Run configuration: YAML with ``defaults:`` inheritance and dotted overrides, validated into frozen attrs
classes with cattrs. Unknown keys are errors with a did-you-mean suggestion.

The core defines the sections every run has (``policy``, ``cluster``, ``data``, ``reward``, ``loss_fn``,
``checkpointing``, ``logger``). Registered components contribute their own sections (``grpo``, ``sft``,
``policy.dtensor_cfg``, ``policy.generation.vllm_cfg``, ...) through the ``config_key`` / ``config_class`` of
their records; those are validated by the plugin's class and reached with ``Config.section(key)``.
"""

from __future__ import annotations

import copy
import difflib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import yaml

from rl_core.errors import ConfigError
from rl_core.registry import FIRST_PARTY_SECTIONS, Registry

_pos = attrs.validators.gt(0)
_nonneg = attrs.validators.ge(0)


@attrs.frozen(kw_only=True)
class OptimizerConfig:
    """AdamW by default. (Megatron configures its optimizer in ``policy.megatron_cfg.optimizer``.)"""

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = attrs.field(default=1e-5, validator=_pos)
    weight_decay: float = attrs.field(default=0.0, validator=_nonneg)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule over optimizer steps: linear warm-up, then constant, cosine or linear decay."""

    name: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = attrs.field(default=0, validator=_nonneg)
    #: steps over which cosine/linear decay to ``min_lr_ratio * lr``; required for those schedules.
    total_steps: int | None = None
    min_lr_ratio: float = attrs.field(default=0.0, validator=_nonneg)

    def __attrs_post_init__(self) -> None:
        if self.name != "constant" and not self.total_steps:
            raise ValueError(f"policy.scheduler.total_steps is required for the {self.name!r} schedule")


@attrs.frozen(kw_only=True)
class GenerationConfig:
    """Sampling for rollouts. ``backend`` names a rollout engine; unset, the enabled one of highest priority."""

    backend: str | None = None
    max_new_tokens: int = attrs.field(default=64, validator=_pos)
    temperature: float = attrs.field(default=1.0, validator=_nonneg)
    top_p: float = 1.0
    #: -1 for no top-k.
    top_k: int = -1
    #: strings that end a response (not included in it).
    stop_strings: tuple[str, ...] = ()
    #: token ids that end a response besides the tokenizer's EOS.
    stop_token_ids: tuple[int, ...] = ()
    #: engine replicas (each its own Ray actor).
    num_replicas: int = attrs.field(default=1, validator=_pos)
    #: share devices with the trainer (the engine sleeps while training where the platform allows).
    colocated: bool = True
    #: name of a weight transport (``object_store``, ``cuda_ipc``, ``broadcast``); unset, the highest priority one
    #: that serves this backend, engine, device and placement.
    weight_transport: str | None = None


@attrs.frozen(kw_only=True)
class PolicyConfig:
    #: a local Hugging Face folder, or ``tiny:NAME`` for a model built on first use by ``rl_core.testing``.
    model_name: str
    #: tokenizer folder; unset, the model's own.
    tokenizer_name: str | None = None
    #: name of a training backend; overrides priority selection.
    backend: str | None = None
    #: training ranks (data parallel).
    num_workers: int = attrs.field(default=1, validator=_pos)
    #: rows per optimizer step (a larger rollout batch makes several steps).
    train_global_batch_size: int = attrs.field(default=32, validator=_pos)
    #: rows per forward/backward pass on one rank (gradient accumulation up to the global batch).
    train_micro_batch_size: int = attrs.field(default=4, validator=_pos)
    #: rows per forward pass when only logprobs are needed.
    logprob_batch_size: int = attrs.field(default=16, validator=_pos)
    #: longest prompt + response in tokens; longer input is an error.
    max_total_sequence_length: int = attrs.field(default=512, validator=_pos)
    #: dtype of the rollout engine (the trainer's master weights stay float32).
    precision: Literal["float32", "bfloat16"] = "float32"
    #: gradient clipping by global norm; null for none.
    max_grad_norm: float | None = 1.0
    #: run code shipped with a model folder (off unless you trust it).
    trust_remote_code: bool = False
    optimizer: OptimizerConfig = attrs.Factory(OptimizerConfig)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    generation: GenerationConfig = attrs.Factory(GenerationConfig)

    def __attrs_post_init__(self) -> None:
        if self.train_global_batch_size % (self.train_micro_batch_size * self.num_workers):
            raise ValueError(
                f"policy.train_global_batch_size ({self.train_global_batch_size}) must be a multiple of "
                f"policy.train_micro_batch_size x policy.num_workers ({self.train_micro_batch_size} x "
                f"{self.num_workers}); change one of them"
            )


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """Ray. ``address`` (or ``RAY_ADDRESS``) joins an existing cluster; unset, a local one is started."""

    address: str | None = None
    #: nodes the run expects; joining a cluster with fewer live nodes is an error.
    num_nodes: int = attrs.field(default=1, validator=_pos)
    #: logical CPUs per node for a local Ray (unset: the machine's cores, at least 8, so that a trainer group and
    #: an engine fit on a laptop: they take turns, generation then training).
    cpus_per_node: int | None = None
    #: GPUs per node; also makes workers ask Ray for a GPU when the driver itself sees none.
    gpus_per_node: int = attrs.field(default=0, validator=_nonneg)
    #: ``pack`` worker groups onto as few nodes as possible, or ``spread`` them over the nodes.
    placement: Literal["pack", "spread"] = "pack"
    #: file holding the cluster's Ray auth token (Ray >= 2.52 token authentication); also read from
    #: ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``. When a token is found, ``RAY_AUTH_MODE=token`` is set.
    auth_token_file: str | None = None


@attrs.frozen(kw_only=True)
class DataConfig:
    """Prompt data: JSONL files (one object per line), or a built-in synthetic task."""

    #: JSONL file of training rows (relative to the config file).
    train_path: str | None = None
    #: JSONL file of held-out rows.
    val_path: str | None = None
    #: built-in synthetic task (``addition``), used when no path is given.
    task: str | None = None
    #: rows a built-in task generates for training / validation.
    num_train: int = attrs.field(default=2048, validator=_pos)
    num_val: int = attrs.field(default=64, validator=_pos)
    #: the field holding the prompt; the others are metadata for the rewards.
    prompt_key: str = "prompt"
    #: seed of the built-in task generator.
    seed: int = 0


@attrs.frozen(kw_only=True)
class RewardSourceConfig:
    """One reward source: its registered ``name``, a ``weight`` in the total reward, and its own options."""

    name: str
    weight: float = 1.0
    options: Any = None


@attrs.frozen(kw_only=True)
class RewardConfig:
    sources: tuple[RewardSourceConfig, ...] = ()


@attrs.frozen(kw_only=True)
class LossConfig:
    """The clipped policy-gradient loss (GRPO, REINFORCE). Names follow NeMo RL."""

    ratio_clip_min: float = attrs.field(default=0.2, validator=_nonneg)
    ratio_clip_max: float = attrs.field(default=0.2, validator=_nonneg)
    #: dual clip for negative advantages (> 1), off when None.
    ratio_clip_c: float | None = None
    #: plain REINFORCE: no ratio, no clipping (the gradient of ``-A * log pi``).
    disable_ppo_ratio: bool = False
    reference_policy_kl_penalty: float = attrs.field(default=0.0, validator=_nonneg)
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = 20.0
    kl_output_clamp_value: float | None = 10.0
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = False
    #: truncation of the importance weight (TIS); None for no truncation.
    truncated_importance_sampling_ratio: float | None = None
    token_level_loss: bool = True

    def __attrs_post_init__(self) -> None:
        if self.ratio_clip_c is not None and self.ratio_clip_c <= 1.0:
            raise ValueError(f"loss_fn.ratio_clip_c must be > 1 (got {self.ratio_clip_c}); set it to null to disable")


@attrs.frozen(kw_only=True)
class CheckpointingConfig:
    enabled: bool = True
    save_period: int = attrs.field(default=10, validator=_pos)
    #: keep the best ``keep_top_k`` checkpoints by ``metric_name`` (the latest one is always kept).
    keep_top_k: int | None = 3
    metric_name: str | None = "val/reward"
    higher_is_better: bool = True
    #: write the final policy as a Hugging Face folder to ``RUN_DIR/final`` when the run ends.
    export_final_hf: bool = True


@attrs.frozen(kw_only=True)
class LoggerConfig:
    """JSONL metrics are always written; the others when enabled."""

    tensorboard_enabled: bool = False
    wandb_enabled: bool = False
    mlflow_enabled: bool = False
    wandb_project: str = "rl-core"
    #: ``offline`` works without a network.
    wandb_mode: Literal["online", "offline"] = "offline"
    #: MLflow tracking URI; unset, a file store in the run folder.
    mlflow_tracking_uri: str | None = None
    #: rich progress bars (off when the output is not a terminal, or with ``false``).
    progress: bool = True


@attrs.frozen(kw_only=True)
class Config:
    """The whole, validated configuration of a run."""

    #: ``grpo``, ``reinforce``, ``sft``, ``dpo`` (or an algorithm a plugin registers).
    algorithm: str = "grpo"
    #: seeds torch, sampling and data order; the same seed reproduces a run.
    seed: int = 42
    #: the run folder: resolved config, metrics, checkpoints. A run in an existing folder resumes.
    run_dir: str = "runs/default"
    #: a recipe (path relative to this file, or ``builtin:NAME``) run first in ``RUN_DIR/warmup``; its final
    #: policy becomes this run's ``policy.model_name`` (for example a short SFT warm-up before GRPO).
    warmup_recipe: str | None = None
    policy: PolicyConfig
    cluster: ClusterConfig = attrs.Factory(ClusterConfig)
    data: DataConfig = attrs.Factory(DataConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    loss_fn: LossConfig = attrs.Factory(LossConfig)
    checkpointing: CheckpointingConfig = attrs.Factory(CheckpointingConfig)
    logger: LoggerConfig = attrs.Factory(LoggerConfig)
    #: sections contributed by registered components, by dotted config key.
    sections: Mapping[str, Any] = attrs.Factory(dict)

    def section(self, key: str) -> Any:
        try:
            return self.sections[key]
        except KeyError:
            raise ConfigError(
                f"config section {key!r} is not known; is the plugin that provides it installed?"
            ) from None


# ------------------------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------------------------

_converter = cattrs.Converter(forbid_extra_keys=True)


def read_yaml(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config, merging the files named by its ``defaults:`` (a path or a list, relative to it, or a
    built-in recipe ``builtin:NAME``)."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError(f"{path}: 'defaults' forms a cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(data).__name__}")
    parents = data.pop("defaults", None) or []
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        if parent.startswith("builtin:"):
            from rl_core.recipes import resolve_recipe

            parent_path = resolve_recipe(parent)
        else:
            parent_path = path.parent / parent
        merged = deep_merge(merged, read_yaml(parent_path, (*_seen, path)))
    return deep_merge(merged, data)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], value typed as YAML: numbers, booleans, lists, null)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value (e.g. grpo.max_num_steps=10)")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads 1e-5 as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _attrs_classes_in(tp: Any) -> list[type]:
    """The attrs classes a field type can hold: ``C``, ``C | None``, ``tuple[C, ...]``, ``list[C]``."""
    if attrs.has(tp):
        return [tp]
    return [c for arg in typing.get_args(tp) for c in _attrs_classes_in(arg)]


def check_keys(cls: type, data: Any, prefix: str, extra: Mapping[str, Sequence[str]] | None = None) -> None:
    """Reject keys that ``cls`` does not have, naming the dotted key and the closest valid one.

    ``extra`` maps a prefix (``"policy."``) to section names that plugins own there, offered as suggestions.
    """
    if not isinstance(data, Mapping):
        return
    extra = extra or {}
    hints = _field_types(cls)
    names = [f.name for f in attrs.fields(cls) if f.name != "sections"]
    for key, value in data.items():
        if key not in names:
            candidates = [*names, *extra.get(prefix, ())]
            close = difflib.get_close_matches(str(key), candidates, n=1, cutoff=0.6)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(candidates)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        for sub in _attrs_classes_in(hints[key]):
            items = value if isinstance(value, list) else [value]
            for item in items:
                check_keys(sub, item, f"{prefix}{key}.", extra)


def _pop_path(data: dict[str, Any], dotted: str) -> Any:
    *parents, last = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node.pop(last, None) if isinstance(node, dict) else None


def _format_exception(exc: BaseException, type_: Any) -> str:
    """cattrs' wording, except that our validators' own messages are kept (they say what to change)."""
    from cattrs.v import format_exception

    message = str(exc)
    if isinstance(exc, ValueError) and message and not message.startswith(("invalid literal", "could not convert")):
        return message
    return format_exception(exc, type_)


def structure_section(cls: type, data: Any, where: str, extra: Mapping[str, Sequence[str]] | None = None) -> Any:
    check_keys(cls, data, f"{where}." if where else "", extra)
    try:
        return _converter.structure(data if data is not None else {}, cls)
    except cattrs.BaseValidationError as exc:
        details = "; ".join(cattrs.transform_error(exc, path=where or "$", format_exception=_format_exception))
        raise ConfigError(f"invalid config: {details}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config at '{where or 'top level'}': {exc}") from None


def build_config(data: Mapping[str, Any], registry: Registry) -> Config:
    """Validate a raw config mapping into a ``Config``, structuring plugin sections with their classes."""
    raw = copy.deepcopy(dict(data))
    sections: dict[str, Any] = {}
    claimed = registry.section_classes()
    for key, (_kind, spec) in sorted(claimed.items()):
        sections[key] = structure_section(spec.config_class, _pop_path(raw, key), key)
    for key, component in FIRST_PARTY_SECTIONS.items():
        if key in claimed:
            continue
        value = _pop_path(raw, key)
        if isinstance(value, Mapping) and value.get("enabled"):
            kind = "rollout_engine" if "generation" in key else "training_backend"
            raise ConfigError(f"{key}.enabled is true, but {registry.why_missing(kind, component)}")
    sources = _pop_path(raw, "reward.sources") or []
    if "policy" not in raw or not isinstance(raw.get("policy"), Mapping) or "model_name" not in raw["policy"]:
        raise ConfigError("policy.model_name is required: a local Hugging Face folder, or tiny:qwen2-tiny")
    owned: dict[str, list[str]] = {}
    for key in [*claimed, *FIRST_PARTY_SECTIONS]:
        parent, _, leaf = key.rpartition(".")
        owned.setdefault(f"{parent}." if parent else "", []).append(leaf)
    core = structure_section(Config, raw, "", owned)
    reward = RewardConfig(sources=tuple(_reward_source(i, s, registry) for i, s in enumerate(sources)))
    return attrs.evolve(core, reward=reward, sections=sections)


def _reward_source(index: int, entry: Any, registry: Registry) -> RewardSourceConfig:
    where = f"reward.sources[{index}]"
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise ConfigError(f"{where} must be a mapping with a 'name' (e.g. {{name: math_verify}}), got {entry!r}")
    entry = dict(entry)
    name = entry.pop("name")
    weight = entry.pop("weight", 1.0)
    spec = registry.specs("reward_source").get(name)
    if spec is None:
        raise ConfigError(f"{where}.name: {registry.why_missing('reward_source', name)}")
    options = structure_section(spec.config_class, entry, where) if spec.config_class is not None else None
    if spec.config_class is None and entry:
        raise ConfigError(f"{where}: reward source {name!r} takes no options, got {sorted(entry)}")
    try:
        weight = float(weight)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.weight must be a number, got {weight!r}") from None
    return RewardSourceConfig(name=name, weight=weight, options=options)


def load_config(path: Path | None, overrides: Sequence[str], registry: Registry) -> Config:
    """Read ``path`` (or the built-in default recipe when None), apply ``overrides``, validate."""
    if path is None:
        from rl_core.recipes import default_recipe_path

        path = default_recipe_path()
    data = _relative_to(read_yaml(Path(path)), Path(path).resolve().parent)
    return build_config(apply_overrides(data, overrides), registry)


#: keys holding file paths that a config file gives relative to itself.
_PATH_KEYS = (("data", "train_path"), ("data", "val_path"), ("warmup_recipe",))


def _relative_to(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for keys in _PATH_KEYS:
        node = out
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if isinstance(value, str) and value and not value.startswith("builtin:") and not Path(value).is_absolute():
            node[keys[-1]] = str(base / value)
    return out


def to_dict(config: Config) -> dict[str, Any]:
    """The resolved config as plain data, plugin sections put back at their dotted keys."""
    out = _converter.unstructure(attrs.evolve(config, sections={}, reward=RewardConfig()))
    out.pop("sections", None)
    out["reward"] = {
        "sources": [
            {"name": s.name, "weight": s.weight, **(_converter.unstructure(s.options) if s.options is not None else {})}
            for s in config.reward.sources
        ]
    }
    for key, value in config.sections.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = _converter.unstructure(value)
    return _plain(out)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def enabled_map(
    config: Config, registry: Registry, kind: Literal["training_backend", "rollout_engine"]
) -> dict[str, bool]:
    """Which components of ``kind`` the config enables through their sections' ``enabled`` flag."""
    out: dict[str, bool] = {}
    for name, spec in registry.specs(kind).items():
        section = config.sections.get(spec.config_key) if spec.config_key else None
        out[name] = bool(getattr(section, "enabled", section is None))
    return out


__all__ = [
    "CheckpointingConfig",
    "ClusterConfig",
    "Config",
    "DataConfig",
    "GenerationConfig",
    "LoggerConfig",
    "LossConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "RewardConfig",
    "RewardSourceConfig",
    "SchedulerConfig",
    "build_config",
    "load_config",
]

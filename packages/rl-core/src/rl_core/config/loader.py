"""Loading a run configuration: YAML with ``defaults:`` inheritance and dotted overrides, validated with cattrs
into the frozen attrs classes of ``rl_core.base.schema``. Unknown keys are errors with a did-you-mean suggestion.

The core defines the sections every run has (``policy``, ``cluster``, ``data``, ``reward``, ``loss_fn``,
``checkpointing``, ``logger``). Registered components contribute their own sections (``grpo``, ``sft``,
``policy.dtensor_cfg``, ``policy.generation.vllm_cfg``, ...) through the ``config_key`` / ``config_class`` of
their records; those are validated by the plugin's class and reached with ``Config.section(key)``.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs
import yaml
from cattrs.v import format_exception

from rl_core.base.errors import ConfigError, closest
from rl_core.base.schema import Config, EnvironmentConfig, RewardConfig, RewardSourceConfig
from rl_core.config.recipes import default_recipe_path, resolve_recipe
from rl_core.plugins.registry import Registry
from rl_core.plugins.specs import EnvironmentSpec, RewardSourceSpec, TaskSpec

# ------------------------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------------------------

_converter = cattrs.Converter(forbid_extra_keys=True)


def _strict_bool(value: Any, _type: type) -> bool:
    """A bool key takes true or false only: cattrs alone reads any string as ``bool(text)``, so ``maybe`` (or
    ``false`` quoted) would silently be True."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"must be true or false (got {value!r})")


_converter.register_structure_hook(bool, _strict_bool)


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


def resolve_aliases(cls: type, data: Any, prefix: str) -> Any:
    """``data`` with the keys ``cls.ALIASES`` names renamed to their canonical keys (recursively into sections)."""
    if not isinstance(data, Mapping):
        return data
    aliases: Mapping[str, str] = getattr(cls, "ALIASES", {})
    out: dict[str, Any] = {}
    for key, value in data.items():
        canonical = aliases.get(key, key)
        if canonical in out or (canonical != key and canonical in data):
            raise ConfigError(f"'{prefix}{key}' and '{prefix}{canonical}' are the same key; give one of them")
        out[canonical] = value
    if attrs.has(cls):
        hints = _field_types(cls)
        for name in out:
            if name in hints:
                for sub in _attrs_classes_in(hints[name]):
                    value = out[name]
                    if isinstance(value, list):
                        out[name] = [resolve_aliases(sub, v, f"{prefix}{name}.") for v in value]
                    else:
                        out[name] = resolve_aliases(sub, value, f"{prefix}{name}.")
    return out


def check_keys(cls: type, data: Any, prefix: str, extra: Mapping[str, Sequence[str]] | None = None) -> None:
    """Reject keys that ``cls`` does not have, naming the dotted key and the closest valid one (or, for a key
    listed in ``cls.MOVED``, where its setting lives now).

    ``extra`` maps a prefix (``"policy."``) to section names that plugins own there, offered as suggestions.
    """
    if not isinstance(data, Mapping):
        return
    extra = extra or {}
    hints = _field_types(cls)
    names = [f.name for f in attrs.fields(cls) if f.name != "sections"]
    moved: Mapping[str, str] = getattr(cls, "MOVED", {})
    for key, value in data.items():
        if key in moved:
            raise ConfigError(f"'{prefix}{key}' is not a setting here: {moved[key]}")
        if key not in names:
            candidates = [*names, *extra.get(prefix, ())]
            close = closest(str(key), candidates)
            hint = f"; did you mean '{prefix}{close}'?" if close else f"; valid keys: {', '.join(candidates)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        for sub in _attrs_classes_in(hints[key]):
            items = value if isinstance(value, list) else [value]
            for item in items:
                check_keys(sub, item, f"{prefix}{key}.", extra)


def unclaimed_sections(cls: type, data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of ``data`` that ``cls`` does not have and whose value is a section with an ``enabled`` flag: the
    section of a plugin that is not installed (or did not load). Disabled, it is ignored; enabled, it is an error."""
    if not isinstance(data, Mapping) or not attrs.has(cls):
        return []
    hints = _field_types(cls)
    out = []
    for key, value in data.items():
        if key not in hints:
            if isinstance(value, Mapping) and "enabled" in value:
                out.append(f"{prefix}{key}")
            continue
        for sub in _attrs_classes_in(hints[key]):
            out += unclaimed_sections(sub, value, f"{prefix}{key}.")
    return out


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

    message = str(exc)
    choices = _literal_choices(type_)
    if choices:
        given = message.split(" not in literal", 1)[0]
        close = closest(given, choices)
        hint = f"; did you mean {close!r}?" if close else ""
        return f"must be one of {', '.join(repr(c) for c in choices)} (got {given!r}){hint}"
    if isinstance(exc, ValueError) and message and not message.startswith(("invalid literal", "could not convert")):
        return message
    return format_exception(exc, type_)


def _literal_choices(type_: Any) -> list[Any]:
    """The values a ``Literal[...]`` (or ``Literal[...] | None``) type allows; [] for other types."""
    if typing.get_origin(type_) is Literal:
        return list(typing.get_args(type_))
    return [c for arg in typing.get_args(type_) if typing.get_origin(arg) is Literal for c in typing.get_args(arg)]


def _key_first(error: str) -> str:
    """cattrs' ``MESSAGE @ $.a.b`` as ``a.b: MESSAGE``."""
    message, sep, path = error.rpartition(" @ ")
    return f"{path.removeprefix('$.').removeprefix('$')}: {message}" if sep else error


def structure_section(cls: type, data: Any, where: str, extra: Mapping[str, Sequence[str]] | None = None) -> Any:
    """``data`` validated into an instance of the attrs class ``cls``; errors name the dotted key under ``where``."""
    prefix = f"{where}." if where else ""
    data = resolve_aliases(cls, data, prefix)
    check_keys(cls, data, prefix, extra)
    try:
        return _converter.structure(data if data is not None else {}, cls)
    except cattrs.BaseValidationError as exc:
        errors = cattrs.transform_error(exc, path=where or "$", format_exception=_format_exception)
        details = "; ".join(_key_first(e) for e in errors)
        raise ConfigError(f"invalid config: {details}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config at '{where or 'top level'}': {exc}") from None


def build_config(data: Mapping[str, Any], registry: Registry) -> Config:
    """Validate a raw config mapping into a ``Config``, structuring plugin sections with their classes."""
    raw = copy.deepcopy(dict(data))
    sections: dict[str, Any] = {}
    claimed = registry.section_classes()
    for key, cls in sorted(claimed.items()):
        sections[key] = structure_section(cls, _pop_path(raw, key), key)
    for key in unclaimed_sections(Config, raw):
        parent, _, leaf = key.rpartition(".")
        near = closest(leaf, [k.rpartition(".")[2] for k in claimed if k.rpartition(".")[0] == parent])
        if near:  # a plugin's section misspelt, not one of a missing plugin
            raise ConfigError(f"unknown config key '{key}'; did you mean '{parent + '.' if parent else ''}{near}'?")
        if _pop_path(raw, key).get("enabled"):
            raise ConfigError(
                f"{key}.enabled is true, but no installed plugin provides the section {key}{registry.unavailable()}"
            )
    sources = _pop_path(raw, "reward.sources") or []
    environment = _environment(raw.pop("environment", None), registry)
    if "policy" not in raw or not isinstance(raw.get("policy"), Mapping) or "model_name" not in raw["policy"]:
        raise ConfigError("policy.model_name is required: a local Hugging Face folder, or tiny:qwen2-tiny")
    owned: dict[str, list[str]] = {}
    for key in claimed:
        parent, _, leaf = key.rpartition(".")
        owned.setdefault(f"{parent}." if parent else "", []).append(leaf)
    core = structure_section(Config, raw, "", owned)
    if core.data.task:  # the task's name now (its options and rows when the data is read, before any worker)
        name = core.data.task.partition(":")[0]
        if name not in registry.specs(TaskSpec):
            raise ConfigError(f"data.task: {registry.why_missing(TaskSpec, name)}")
    reward = RewardConfig(sources=tuple(_reward_source(i, s, registry) for i, s in enumerate(sources)))
    return attrs.evolve(core, reward=reward, environment=environment, sections=sections)


def _environment(entry: Any, registry: Registry) -> EnvironmentConfig:
    """The ``environment`` section: the core's keys, and the named environment's own options (its class)."""
    if entry is None:
        return EnvironmentConfig()
    if not isinstance(entry, Mapping):
        raise ConfigError(f"environment must be a mapping, e.g. {{name: calculator, max_turns: 4}}, got {entry!r}")
    core_keys = {f.name for f in attrs.fields(EnvironmentConfig)} - {"options"}
    for key in set(entry) & set(EnvironmentConfig.MOVED):
        raise ConfigError(f"'environment.{key}' is not a setting here: {EnvironmentConfig.MOVED[key]}")
    name = entry.get("name")
    own = {k: v for k, v in entry.items() if k not in core_keys}
    if name is None:
        if own:
            raise ConfigError(f"environment: options {sorted(own)} given, but no environment name (environment.name)")
        return structure_section(EnvironmentConfig, dict(entry), "environment")
    spec = registry.specs(EnvironmentSpec).get(name)
    if spec is None:
        raise ConfigError(f"environment.name: {registry.why_missing(EnvironmentSpec, name)}")
    if spec.config_class is None and own:
        raise ConfigError(f"environment {name!r} takes no options, got {sorted(own)}")
    hint = {"environment.": sorted(core_keys)}  # a misspelt core key is suggested too
    options = structure_section(spec.config_class, own, "environment", hint) if spec.config_class is not None else None
    core = structure_section(EnvironmentConfig, {k: v for k, v in entry.items() if k in core_keys}, "environment")
    return attrs.evolve(core, options=options)


def _reward_source(index: int, entry: Any, registry: Registry) -> RewardSourceConfig:
    where = f"reward.sources[{index}]"
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise ConfigError(f"{where} must be a mapping with a 'name' (e.g. {{name: math_verify}}), got {entry!r}")
    entry = dict(entry)
    name = entry.pop("name")
    weight = entry.pop("weight", 1.0)
    spec = registry.specs(RewardSourceSpec).get(name)
    if spec is None:
        raise ConfigError(f"{where}.name: {registry.why_missing(RewardSourceSpec, name)}")
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

    path = default_recipe_path() if path is None else resolve_recipe(str(path))  # builtin:NAME or a file
    data = _relative_to(read_yaml(Path(path)), Path(path).resolve().parent)
    return build_config(apply_overrides(data, overrides), registry)


#: keys holding file paths that a config file gives relative to itself.
_PATH_KEYS = (("data", "train_path"), ("data", "val_path"), ("warmup_recipe",))


def _relative_to(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for keys in _PATH_KEYS:
        node: Any = out
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if isinstance(value, str) and value and not value.startswith("builtin:") and not Path(value).is_absolute():
            # ORG/NAME with no suffix that is not a path here may be a dataset in the Hugging Face cache
            hub_name = value.count("/") == 1 and not value.startswith(".") and not Path(value).suffix
            if not hub_name or (base / value).exists():
                node[keys[-1]] = str(base / value)
    return out

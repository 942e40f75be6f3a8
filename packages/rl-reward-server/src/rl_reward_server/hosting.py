"""The scorers a server hosts: ``--scorer name:key=value,...`` specs, validated in the server's process and built
in each scorer process (``rl_reward_server.pool``)."""

from __future__ import annotations

from typing import Any

from rl_core.api import ConfigError, structure_section


def parse_scorer(text: str, registry: Any) -> tuple[str, Any, Any]:
    """``name:key=value,key=value`` -> (name, its reward-source record, its validated options)."""
    import yaml

    name, _, rest = text.partition(":")
    spec = registry.specs("reward_source").get(name)
    if spec is None or name == "remote":
        known = ", ".join(n for n in sorted(registry.specs("reward_source")) if n != "remote")
        raise ConfigError(f"--scorer {name!r}: not a scorer this server can host; known: {known}")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--scorer {text!r}: options are key=value pairs separated by commas")
        options[key] = yaml.safe_load(value)
    cfg = structure_section(spec.config_class, options, f"--scorer {name}") if spec.config_class is not None else None
    return name, spec, cfg


def build_scorer(text: str, registry: Any) -> tuple[str, Any]:
    """``(name, the reward source built from the spec)``: what a scorer process hosts."""
    name, spec, cfg = parse_scorer(text, registry)
    return name, spec.factory(cfg)

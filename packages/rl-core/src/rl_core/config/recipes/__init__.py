"""Built-in recipes, addressed as ``builtin:NAME`` (``rl-core run`` with no config runs ``builtin:default``)."""

from __future__ import annotations

from pathlib import Path

from rl_core.base.errors import ConfigError

HERE = Path(__file__).parent


def resolve_recipe(name: str) -> Path:
    """``builtin:NAME`` -> the packaged YAML; anything else is a path."""
    if name.startswith("builtin:"):
        path = HERE / f"{name.removeprefix('builtin:')}.yaml"
        if not path.is_file():
            known = ", ".join(f"builtin:{p.stem}" for p in sorted(HERE.glob("*.yaml")))
            raise ConfigError(f"no built-in recipe {name!r}; known: {known}")
        return path
    return Path(name)


def default_recipe_path() -> Path:
    return resolve_recipe("builtin:default")

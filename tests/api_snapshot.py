"""The public API as a record: every name ``rl_core.api`` exports and every public function of its helper modules
(``batch``, ``tokens``, ``lora``, ``advantages``), with each callable's parameters. ``python tests/api_snapshot.py``
prints it; ``packages/rl-core/api-0.1.json`` holds the one of the last release, which the suite holds the code to."""

from __future__ import annotations

import inspect
import json
import types
from typing import Any

MODULES = ("batch", "tokens", "lora", "advantages")


def _parameters(obj: Any) -> list[list[Any]] | None:
    target = obj.__init__ if inspect.isclass(obj) and "__init__" in vars(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [
        [p.name, p.kind.name, p.default is not inspect.Parameter.empty]
        for p in signature.parameters.values()
        if p.name != "self"
    ]


def _entry(obj: Any) -> dict[str, Any]:
    kind = (
        "module"
        if isinstance(obj, types.ModuleType)
        else "class"
        if inspect.isclass(obj)
        else "function"
        if callable(obj)
        else "value"
    )
    out: dict[str, Any] = {"kind": kind}
    if kind in ("class", "function"):
        out["parameters"] = _parameters(obj)
    return out


def snapshot() -> dict[str, dict[str, Any]]:
    import rl_core.api as api

    names = {name: _entry(getattr(api, name)) for name in api.__all__}
    for module in MODULES:
        mod = getattr(api, module, None)  # an older API may lack one
        for name, obj in vars(mod or types).items():
            if mod and not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                names[f"{module}.{name}"] = _entry(obj)
    return dict(sorted(names.items()))


def breaks(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """What a plugin written against ``old`` would meet in ``new``: a name gone, another kind, a parameter removed,
    renamed, moved or turned required (a new parameter with a default, a name added, are fine)."""
    out = []
    for name, was in old.items():
        now = new.get(name)
        if now is None:
            out.append(f"{name}: removed")
        elif now["kind"] != was["kind"]:
            out.append(f"{name}: was a {was['kind']}, now a {now['kind']}")
        elif was.get("parameters") is not None and now.get("parameters") is not None:
            before, after = was["parameters"], now["parameters"]
            after_by_name = {p[0]: (i, p) for i, p in enumerate(after)}
            for i, (pname, pkind, default) in enumerate(before):
                if pname not in after_by_name:
                    out.append(f"{name}: parameter {pname!r} removed")
                    continue
                j, (_n, kind_now, default_now) = after_by_name[pname]
                if pkind != "KEYWORD_ONLY" and (j != i or kind_now == "KEYWORD_ONLY"):
                    out.append(f"{name}: parameter {pname!r} moved")
                if default and not default_now:
                    out.append(f"{name}: parameter {pname!r} lost its default")
            for pname, kind_now, default_now in after:
                if (
                    not default_now
                    and pname not in {p[0] for p in before}
                    and kind_now not in ("VAR_POSITIONAL", "VAR_KEYWORD")
                ):
                    out.append(f"{name}: new required parameter {pname!r}")
    return out


if __name__ == "__main__":
    print(json.dumps(snapshot(), indent=1))

"""Names that moved: the old spelling keeps working for a minor version, with a ``DeprecationWarning`` that says
where the name went and when the old one goes. A module declares its moved names with ``moved_names`` as its
``__getattr__`` (PEP 562), so nothing is imported until an old name is used."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any


def moved_names(
    module: str, names: Iterable[str], to: str, *, shown: tuple[str, str], since: str, removed_in: str
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each of ``names`` is looked up in the module ``to`` (imported on first
    use, which also breaks the import cycle when ``to`` imports ``module``), with a warning that names the two as
    plugins import them (``shown``: the old and the new module, ``rl_core.api.batch`` and ``rl_core.api.tokens``)."""
    known = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in known:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{shown[0]}.{name} moved to {shown[1]}.{name} in rl-core {since}; the old name is removed in rl-core "
            f"{removed_in}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(to), name)

    return __getattr__

"""The certify checks under their earlier import path (``rl_core.testing.certify``), which plugin tests written
against the previous release use; they live in ``rl_core.certify``."""

from typing import Any

from rl_core import certify as _certify

__all__ = _certify.__all__


def __getattr__(name: str) -> Any:
    return getattr(_certify, name)

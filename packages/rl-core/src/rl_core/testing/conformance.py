"""The contract checks under their earlier import path (``rl_core.testing.conformance``), which plugin tests use;
they live in ``rl_core.certify.conformance``."""

from typing import Any

from rl_core.certify import conformance as _conformance


def __getattr__(name: str) -> Any:
    return getattr(_conformance, name)

"""The pytest plugin: markers, and fixtures for tiny models, a session-wide Ray, configs and the registry.

Light at import: torch, transformers and ray are imported inside the fixtures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_core.base.schema import ClusterConfig
from rl_core.config.loader import load_config
from rl_core.data.tiny_models import ensure_tiny_model
from rl_core.distributed.cluster import init_ray
from rl_core.plugins.registry import Registry

MARKERS = {
    "slow": "takes more than a few seconds",
    "ray": "starts Ray actors",
    "vllm": "starts a vLLM engine",
    "megatron": "needs megatron-core",
    "gpu": "needs a CUDA GPU (skipped without one)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """A ~1M-parameter random-init Qwen2 causal LM with its tokenizer (built once, cached)."""

    return ensure_tiny_model("qwen2-tiny")


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    """A ~1M-parameter random-init Llama causal LM with its tokenizer (built once, cached)."""

    return ensure_tiny_model("llama-tiny")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session (starting Ray costs seconds and ~700 MB)."""
    import ray

    started = not ray.is_initialized()
    init_ray(ClusterConfig(), verbose=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def rl_registry() -> Any:
    """The registry with every installed plugin (entry points) loaded."""

    return Registry.discover()


@pytest.fixture
def make_config(rl_registry: Any, tmp_path: Path) -> Callable[..., Any]:
    """``make_config("grpo.max_num_steps=2", recipe=None)``: a validated config from a recipe (default: the
    built-in default) with overrides, its run folder under ``tmp_path``."""

    def build(*overrides: str, recipe: str | Path | None = None) -> Any:
        return load_config(Path(recipe) if recipe else None, [f"run_dir={tmp_path / 'run'}", *overrides], rl_registry)

    return build

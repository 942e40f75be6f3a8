"""The GPU check kit (docs/gpu.md): run on a machine with CUDA by ``tests/gpu/run.sh``; every test here is marked
``gpu`` and skipped without CUDA. Figures the tests measure are collected into ``bench/results/gpu_tests.json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def gpu_report() -> Iterator[dict[str, Any]]:
    """A dict the tests fill with what they measured, written to bench/results/gpu_tests.json at the end."""
    report: dict[str, Any] = {}
    yield report
    if report:
        import torch

        report["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        report["torch"] = torch.__version__
        out = ROOT / "bench" / "results" / "gpu_tests.json"
        out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def small_model_path() -> Path:
    """~25M parameters (100 MB in fp32): large enough that moving it shows in the GPU's free memory."""
    from rl_core.data.tiny_models import ensure_tiny_model

    return ensure_tiny_model("qwen2-small")


@pytest.fixture
def gpu_config(make_config):
    """A config for the GPU: short sequences, small batches, the run folder under the test's tmp_path."""

    def build(model: Path, *overrides: str):
        return make_config(
            "warmup_recipe=null",
            f"policy.model_name={model}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "policy.logprob_batch_size=8",
            "policy.max_total_sequence_length=64",
            "policy.optimizer.lr=1e-3",
            *overrides,
        )

    return build


@pytest.fixture(scope="session")
def tokenizer_of():
    from transformers import AutoTokenizer

    return lambda path: AutoTokenizer.from_pretrained(path)

"""Where Ray places the policy's ranks and the engine's replicas, on GPUs declared to a Ray of its own (no CUDA is
touched): colocated on 1 GPU, colocated on 2 GPUs with a TP=2 engine, and not colocated. The actors here only
report where they are; what is under test is the layout and ``WorkerGroup``'s placement of it."""

import json
import subprocess
import sys
import textwrap

import pytest

from rl_core.base.errors import ConfigError
from rl_core.distributed.placement import engine_layout, policy_layout

SCRIPT = textwrap.dedent(
    """
    import json, os, sys

    import ray

    from rl_core.distributed.cluster import WorkerGroup
    from rl_core.config.loader import load_config
    from rl_core.distributed.placement import engine_layout, policy_layout
    from rl_core.plugins.registry import Registry


    class Probe:
        def __init__(self, **_kwargs):
            pass

        def where(self):
            resources = ray.get_runtime_context().get_assigned_resources()
            return {
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_share": resources.get("GPU", 0.0),
                "pg": ray.get_runtime_context().get_placement_group_id(),
            }


    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False, logging_level="ERROR")
    registry = Registry.discover()
    cases = {
        "colocated_1gpu": (["policy.num_workers=1"], 1),
        "colocated_2gpu_tp2": (["policy.num_workers=2"], 2),
        "separate": (["policy.num_workers=1", "policy.generation.colocated=false"], 1),
    }
    out = {}
    for name, (overrides, tp) in cases.items():
        config = load_config(None, [f"run_dir=/tmp/placement-{name}", "cluster.device=cuda", *overrides], registry)
        groups = []
        try:
            for role, layout in (("policy", policy_layout(config, "cuda")), ("rollout", engine_layout(config, "cuda", tp))):
                group = WorkerGroup(Probe, layout, lambda rank: {}, name=role)
                groups.append(group)
                out.setdefault(name, {})[role] = group.call("where")
        finally:
            for group in groups:
                group.shutdown()
    out["placement_groups_left"] = sum(1 for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED")
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def placed():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.ray
def test_colocated_on_one_gpu_trainer_and_engine_share_it(placed):
    (trainer,), (engine,) = placed["colocated_1gpu"]["policy"], placed["colocated_1gpu"]["rollout"]
    assert trainer["gpu_ids"] == engine["gpu_ids"] == ["0"] and trainer["visible"] == engine["visible"] == "0"
    assert trainer["pg"] == engine["pg"] and trainer["gpu_share"] == engine["gpu_share"] == 0.5


@pytest.mark.ray
def test_colocated_on_two_gpus_the_tp2_engine_sees_both(placed):
    ranks, (engine,) = placed["colocated_2gpu_tp2"]["policy"], placed["colocated_2gpu_tp2"]["rollout"]
    assert sorted(r["gpu_ids"][0] for r in ranks) == ["0", "1"]
    assert len({r["pg"] for r in ranks} | {engine["pg"]}) == 1
    # its share sits on rank 0's GPU; Ray's CUDA_VISIBLE_DEVICES is replaced by both bundles' GPUs
    assert engine["gpu_ids"] == ["0"] and sorted(engine["visible"].split(",")) == ["0", "1"]


@pytest.mark.ray
def test_not_colocated_the_engine_gets_gpus_of_its_own(placed):
    (trainer,), (engine,) = placed["separate"]["policy"], placed["separate"]["rollout"]
    assert trainer["pg"] != engine["pg"] and trainer["gpu_share"] == engine["gpu_share"] == 1.0
    assert {trainer["gpu_ids"][0], engine["gpu_ids"][0]} == {"0", "1"}
    assert placed["placement_groups_left"] == 0, "every placement group, shared or not, is removed at shutdown"


def test_a_colocated_engine_larger_than_the_trainer_is_a_clear_error(make_config):
    config = make_config("cluster.device=cuda", "policy.num_workers=1", "policy.generation.num_replicas=2")
    assert policy_layout(config, "cuda").size == 1
    with pytest.raises(ConfigError, match="num_replicas x tensor_parallel_size .* must be <= policy.num_workers"):
        engine_layout(config, "cuda", 1)
    cpu = engine_layout(config, "cpu", 1)
    assert cpu.num_gpus == 0 and not cpu.shared


#: torch's generated version file, as a build writes it
VERSION_PY = (
    "from typing import Optional\n__version__ = '2.13.0'\ncuda: Optional[str] = {cuda}\nhip: Optional[str] = {hip}\n"
)


@pytest.mark.parametrize(
    ("cuda", "hip", "cpu_only"),
    [("None", "None", True), ("'12.8'", "None", False), ("None", "'6.4.0'", False)],
    ids=["cpu-build", "cuda-build", "rocm-build"],
)
def test_a_cpu_only_torch_is_told_from_its_version_file_without_importing_it(
    monkeypatch, tmp_path, cuda, hip, cpu_only
):
    """``detected_device`` answers "cpu" for a torch built for CPUs alone without importing it (`plugins --explain`
    and `--dry-run` in 0.4 s instead of 2.6); a CUDA or ROCm build, or a version file it cannot read, is asked."""
    import importlib.machinery
    import importlib.util

    from rl_core.distributed import placement

    package = tmp_path / "torch"
    package.mkdir()
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(package / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    (package / "version.py").write_text(VERSION_PY.format(cuda=cuda, hip=hip))
    assert placement._cpu_only_torch() is cpu_only
    (package / "version.py").write_text("cuda = (")
    assert placement._cpu_only_torch() is False
    (package / "version.py").unlink()
    assert placement._cpu_only_torch() is False


def test_the_cli_tells_the_device_without_importing_torch_on_a_cpu_build():
    probe = (
        "import sys; from rl_core.config.loader import load_config; from rl_core.plugins.registry import Registry; "
        "from rl_core.distributed.placement import detected_device; registry = Registry.discover(); "
        "print(detected_device(load_config(None, [], registry)), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import torch

    if torch.version.cuda is None and torch.version.hip is None:  # this machine's build: torch is never imported
        assert out.stdout.split() == ["cpu", "False"], out.stdout
    else:
        assert out.stdout.split() == ["cuda" if torch.cuda.is_available() else "cpu", "True"], out.stdout

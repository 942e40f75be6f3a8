"""The Slurm launch cannot run here; it is checked by reading: valid bash, and every rl-core override it passes
is a valid key of the config it runs (the commands it calls are tested elsewhere: the reward server's
--host/--token, joining a token-authenticated Ray cluster, cluster.placement=spread)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rl_core.config.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "slurm" / "grpo_hetjob.sbatch"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_is_valid_bash():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_overrides_are_valid_config(rl_registry):
    text = SCRIPT.read_text()
    run = text[text.index("rl-core run") :]
    keys = re.findall(r"^\s+\"?([a-z_.]+)=", run, flags=re.M)
    assert {"run_dir", "cluster.address", "cluster.placement", "policy.num_workers", "reward.sources"} <= set(keys)
    values = {
        "run_dir": "/tmp/x",
        "cluster.address": "10.0.0.1:6379",
        "cluster.num_nodes": "2",
        "cluster.gpus_per_node": "8",
        "cluster.placement": "spread",
        "policy.num_workers": "16",
        "policy.train_micro_batch_size": "1",
        "policy.train_global_batch_size": "64",
        "reward.sources": "[{name: remote, url: 'http://h:8000', scorer: math_verify}]",
    }
    config = load_config(
        ROOT / "examples" / "configs" / "grpo_math_dtensor_vllm.yaml", [f"{k}={values[k]}" for k in keys], rl_registry
    )
    assert config.cluster.placement == "spread" and config.reward.sources[0].name == "remote"

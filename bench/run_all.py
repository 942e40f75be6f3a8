"""Run every benchmark in turn (each writes bench/results/NAME.json and its section of docs/benchmarks.md)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
# (bench/gpu.py needs a CUDA GPU: docs/gpu.md)
BENCHMARKS = [
    "reward_server.py",
    "train_throughput.py",
    "generation.py",
    "grpo_vs_trl.py",
    "async_grpo.py",
    "multi_turn.py",
    "lora.py",
    "profile_train.py",
    "loss_variants.py",
    "shortcut_check.py",
    "agent_endpoint.py",
]

if __name__ == "__main__":
    only = sys.argv[1:] or BENCHMARKS
    for name in only:
        print(f"=== {name}", flush=True)
        subprocess.run([sys.executable, str(HERE / name)], check=True, cwd=HERE)

"""A real multi-node Ray cluster on this machine: a head and a second node started with ``ray start``, each with
its own resources and temp dir, stopped by the test through its own processes (never a machine-wide
``ray stop``). On a token-authenticated cluster, a short GRPO job places its 2 data-parallel ranks on different
nodes; a training worker killed mid-run stops the run with a message naming it, and the run resumes there, its
ranks on the two nodes again. (One job for all of it: a separate job on a cluster without a token joined through
the same ``ray.init(address=...)`` and placed its ranks the same way, 48 s for nothing this one does not show.)"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOKEN = "rl-core-test-token-0123456789abcdef0123456789abcdef"
#: the Hugging Face engine (a start ~5 s shorter than vLLM's, eager): the engine is not what is tested here, and
#: vLLM runs across the Ray layer in test_main_job.py, the calculator recipe, test_vllm.py and the recipes
JOB = [
    "warmup_recipe=null",
    "policy.generation.backend=hf",
    "grpo.max_num_steps=2",
    "grpo.val_period=2",
    "grpo.max_val_samples=16",
    "checkpointing.save_period=1",
    "logger.progress=false",
]


def ray_exe() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else shutil.which("ray")


class Cluster:
    """A head and a second node, as two `ray start --block` process groups with their own temp dirs."""

    def __init__(self, root: Path, auth: str) -> None:
        self.root, self.port = root, _free_port()
        self.env = {**os.environ, "RAY_AUTH_MODE": auth}
        if auth == "token":
            self.env["RAY_AUTH_TOKEN"] = TOKEN
        self.procs: list[subprocess.Popen] = []
        self.dirs = [root / "h", root / "w"]  # short: Ray's socket paths must stay under 107 characters

    def start(self) -> "Cluster":
        common = ["--num-cpus=3", "--block", "--disable-usage-stats"]
        self._spawn(
            "head",
            [
                "start",
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.dirs[0]}",
                *common,
            ],
        )
        self._wait_nodes(1)
        self._spawn("node2", ["start", f"--address=127.0.0.1:{self.port}", f"--temp-dir={self.dirs[1]}", *common])
        self._wait_nodes(2)
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                [ray_exe(), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _wait_nodes(self, n: int) -> None:
        probe = "import ray; ray.init(address='auto', log_to_driver=False); print(sum(x['Alive'] for x in ray.nodes()))"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = subprocess.run(
                [sys.executable, "-c", probe],
                env={**self.env, "RAY_ADDRESS": self.address},
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1] == str(n):
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {n} nodes: {(self.root / 'head.log').read_text()[-2000:]}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        # nothing of a test cluster is worth a graceful stop (`ray start --block` takes 5 s or more to end on SIGTERM)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # the daemons `ray start` launched run in sessions of their own: find them by our temp dirs
        marks = [str(d) for d in self.dirs]
        for p in psutil.process_iter(["cmdline"]):
            if any(m in " ".join(p.info["cmdline"] or []) for m in marks):
                p.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(auth: str) -> Iterator[Cluster]:
    root = Path(f"/tmp/rlc{os.getpid()}{auth[0]}")
    root.mkdir(exist_ok=True)
    c = Cluster(root, auth)
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def token_cluster() -> Iterator[Cluster]:
    yield from cluster("token")


def job_env(cluster: Cluster) -> dict[str, str]:
    """The driver's environment: none of the test's RAY_ variables, the token where the cluster wants one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    if cluster.env["RAY_AUTH_MODE"] == "token":
        env["RAY_AUTH_TOKEN"] = TOKEN  # rl-core turns on RAY_AUTH_MODE=token itself when a token is at hand
    return env


def job(run_dir: Path, cluster: Cluster, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rl_core.cli",
        "run",
        f"run_dir={run_dir}",
        *JOB,
        f"cluster.address={cluster.address}",
        "cluster.placement=spread",
        "policy.num_workers=2",
        *overrides,
    ]


def worker_nodes(run_dir: Path, group: str) -> dict[int, str]:
    """Where each worker of ``group`` ran, from the driver's log (placement is logged, not printed)."""
    output = (run_dir / "logs" / "driver.log").read_text()
    line = next(line for line in output.splitlines() if f"{group} workers:" in line)
    return {int(r): node for r, node in re.findall(r"\[(\d+)\] pid \d+ on \S+ \(node ([0-9a-f]+)\)", line)}


def test_a_killed_training_worker_stops_the_run_and_it_resumes(token_cluster: Cluster, tmp_path: Path):
    """On a token-authenticated cluster, the ranks spread over its two nodes: rank 1 killed at step 2 of 3."""
    run, env = tmp_path / "run", job_env(token_cluster)
    cmd = job(run, token_cluster, "grpo.max_num_steps=3")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    lines: list[str] = []
    pid = None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 2/3"):
            placed = re.search(r"policy workers: .*\[1\] pid (\d+)", (run / "logs" / "driver.log").read_text())
            pid = int(placed.group(1))
            os.kill(pid, signal.SIGKILL)
            break
    rest, _ = proc.communicate(timeout=600)
    output = " ".join(("".join(lines) + rest).split())
    assert proc.returncode == 2, output[-3000:]
    assert f"worker policy[1] (pid {pid}) on node" in output and "died" in output
    assert "last log lines" in output and "Resume the run from its last checkpoint" in output
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    nodes = worker_nodes(run, "policy")
    assert len(nodes) == 2 and nodes[0] != nodes[1], nodes
    assert (run / "checkpoints" / "step_000003").is_dir()

"""The examples of docs/plugins.md and docs/environments.md, as written there: installed from the doc's own code blocks,
discovered through its entry point, selected from a config, and certified by ``rl-core certify``."""

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def doc_files() -> dict[str, str]:
    """The code blocks of docs/plugins.md and docs/environments.md that start with ``# file: PATH``, by path."""
    text = "".join((ROOT / "docs" / name).read_text() for name in ("plugins.md", "environments.md"))
    blocks = re.findall(r"```(?:toml|python)\n# file: (\S+)\n(.*?)```", text, re.S)
    return {path: body for path, body in blocks}


def install_documented(package: str, tmp_path: Path) -> dict[str, str]:
    """Write the doc's files of ``package`` under ``tmp_path``, pip-install it into a folder of its own, and return
    the environment that sees it."""
    for path, body in doc_files().items():
        if path.startswith(f"{package}/"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(body)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(tmp_path / package)], check=True, timeout=600)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def rl_core_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``rl-core ARGS`` in a process that sees the installed documented plugin."""
    return subprocess.run(
        [sys.executable, "-m", "rl_core.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_the_documented_reward_source_installs_and_certifies(tmp_path: Path):
    assert {"rl-reward-length/pyproject.toml", "rl-reward-length/rl_reward_length/__init__.py"} <= set(doc_files())
    env = install_documented("rl-reward-length", tmp_path)
    cli = functools.partial(rl_core_cli, env)

    card = cli("certify", "length", "--option", "target=12", "--json")
    assert card.returncode == 0, card.stdout + card.stderr
    assert json.loads(card.stdout)["passed"]
    chosen = cli("plugins", "--explain", "reward.sources=[{name: length, target: 12}]", "--json")
    assert chosen.returncode == 0 and json.loads(chosen.stdout)["reward_sources"] == ["length"], chosen.stderr
    typo = cli("plugins", "--explain", "reward.sources=[{name: length, targt: 12}]")
    assert typo.returncode == 2 and "did you mean 'reward.sources[0].target'" in typo.stderr, typo.stderr


@pytest.mark.slow
def test_the_documented_environment_installs_and_certifies(tmp_path: Path):
    files = {k for k in doc_files() if k.startswith("rl-env-repeat/")}
    assert files == {"rl-env-repeat/pyproject.toml", "rl-env-repeat/rl_env_repeat/__init__.py"}
    env = install_documented("rl-env-repeat", tmp_path)
    rows = tmp_path / "words.jsonl"
    rows.write_text("".join(json.dumps({"word": w}) + "\n" for w in ("apple", "stone", "river")))
    card = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "certify", "repeat", "--data", str(rows), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert card.returncode == 0 and json.loads(card.stdout)["passed"], card.stdout + card.stderr


@pytest.mark.slow
def test_the_documented_task_adapter_installs_and_certifies(tmp_path: Path):
    assert {"rl-task-words/pyproject.toml", "rl-task-words/rl_task_words/__init__.py"} <= set(doc_files())
    env = install_documented("rl-task-words", tmp_path)
    cli = functools.partial(rl_core_cli, env)

    card = cli("certify", "words:reverse", "--option", "min_length=5", "--json")
    assert card.returncode == 0, card.stdout + card.stderr
    checks = json.loads(card.stdout)["checks"]
    assert all(c["passed"] for c in checks) and len(checks) == 10, checks
    wrong = cli("certify", "words:mirror", "--json")  # a failed check that says why, not a traceback
    first = json.loads(wrong.stdout)["checks"][0]
    assert wrong.returncode == 1 and "no puzzle 'mirror'; choose one of reverse, upper" in first["detail"], first


@pytest.mark.slow
@pytest.mark.ray
def test_the_documented_algorithm_installs_and_runs(tmp_path: Path):
    files = {k for k in doc_files() if k.startswith("rl-algo-bestofn/")}
    assert files == {"rl-algo-bestofn/pyproject.toml", "rl-algo-bestofn/rl_algo_bestofn/__init__.py"}
    env = install_documented("rl-algo-bestofn", tmp_path)
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_core.cli",
            "run",
            "algorithm=best_of_n",
            f"run_dir={run}",
            "warmup_recipe=null",
            "policy.generation.backend=hf",
            "best_of_n.max_num_steps=2",
            "best_of_n.val_period=2",
            "best_of_n.max_val_samples=8",
            "best_of_n.min_reward=0.0",
            "logger.progress=false",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["kept"] == 8.0 and "train/loss" in rows[1]
    assert "val/reward" in rows[2] and (run / "final" / "config.json").is_file()

"""The reward-source example of docs/plugins.md, as written there: installed from the doc's own code blocks,
discovered through its entry point, selected from a config, and certified by ``rl-core certify``."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def doc_files() -> dict[str, str]:
    """The doc's code blocks that start with ``# file: PATH``, by path."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```(?:toml|python)\n# file: (\S+)\n(.*?)```", text, re.S)
    return {path: body for path, body in blocks}


@pytest.mark.slow
def test_the_documented_reward_source_installs_and_certifies(tmp_path: Path):
    files = doc_files()
    assert {"rl-reward-length/pyproject.toml", "rl-reward-length/rl_reward_length/__init__.py"} <= set(files)
    for path, body in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(tmp_path / "rl-reward-length")], check=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rl_core.cli", *args], capture_output=True, text=True, env=env, timeout=300
        )

    card = cli("certify", "length", "--option", "target=12", "--json")
    assert card.returncode == 0, card.stdout + card.stderr
    assert json.loads(card.stdout)["passed"]
    chosen = cli("plugins", "--explain", "reward.sources=[{name: length, target: 12}]", "--json")
    assert chosen.returncode == 0 and json.loads(chosen.stdout)["reward_sources"] == ["length"], chosen.stderr
    typo = cli("plugins", "--explain", "reward.sources=[{name: length, targt: 12}]")
    assert typo.returncode == 2 and "did you mean 'reward.sources[0].target'" in typo.stderr, typo.stderr


@pytest.mark.slow
def test_the_documented_environment_installs_and_certifies(tmp_path: Path):
    files = {k: v for k, v in doc_files().items() if k.startswith("rl-env-repeat/")}
    assert set(files) == {"rl-env-repeat/pyproject.toml", "rl-env-repeat/rl_env_repeat/__init__.py"}
    for path, body in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, str(tmp_path / "rl-env-repeat")], check=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
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

"""A throwaway third-party plugin package, built and installed during the test, is discovered through its entry
point and selected by priority (built for another rl-core, it is listed with a warning); a sibling plugin that raises
at import time is reported and skipped."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{dist}"
version = "9.9.9"
dependencies = ["rl-core>=7"]  # built for a later rl-core than this one: rl-core plugins warns

[project.entry-points.rl_core]
{ep} = "{module}"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""

GOOD = """
import attrs
from rl_core.api import TrainingBackendSpec, hookimpl


@attrs.frozen(kw_only=True)
class Section:
    enabled: bool = False


def factory(config, section):
    raise NotImplementedError


@hookimpl
def rl_training_backends():
    return [TrainingBackendSpec(name="turbo", priority=300, config_key="policy.turbo_cfg",
                                config_class=Section, factory=factory, package="rl-backend-turbo")]
"""

BROKEN = "raise ImportError('this plugin is broken on purpose')\n"


def make_package(root: Path, dist: str, ep: str, module: str, code: str) -> Path:
    pkg = root / dist
    (pkg / module).mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, ep=ep, module=module))
    (pkg / module / "__init__.py").write_text(textwrap.dedent(code))
    return pkg


@pytest.mark.slow
def test_third_party_plugin_is_discovered_and_selected(tmp_path: Path):
    site = tmp_path / "site"
    good = make_package(tmp_path, "rl-backend-turbo", "turbo", "rl_backend_turbo", GOOD)
    broken = make_package(tmp_path, "rl-backend-broken", "broken", "rl_backend_broken", BROKEN)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(good), str(broken)],
        check=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "rl_core.cli", *args], capture_output=True, text=True, env=env, timeout=120
        )

    listing = cli("plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    plugins = {p["plugin"]: p for p in json.loads(listing.stdout)}
    assert plugins["turbo"]["distribution"] == "rl-backend-turbo" and plugins["turbo"]["version"] == "9.9.9"
    assert plugins["broken"]["status"] == "failed" and "broken on purpose" in plugins["broken"]["error"]
    assert plugins["dtensor"]["status"] == "loaded" and plugins["megatron"]["status"] == "loaded"
    assert "rl-backend-turbo is built for rl-core >=7 but rl-core 0.1.0 is installed" in plugins["turbo"]["warning"]
    assert plugins["dtensor"]["warning"] == ""

    explain = cli("plugins", "--explain", "policy.turbo_cfg.enabled=true", "policy.megatron_cfg.enabled=true", "--json")
    assert explain.returncode == 0, explain.stderr
    backend = json.loads(explain.stdout)["training_backend"]
    assert backend["chosen"] == "turbo" and [r["name"] for r in backend["runners_up"]] == ["megatron", "dtensor"]

    selected_broken = cli("plugins", "--explain", "policy.backend=broken")
    assert selected_broken.returncode == 2
    assert "failed to import" in selected_broken.stderr and "broken on purpose" in selected_broken.stderr

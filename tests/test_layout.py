"""The core's layout holds (docs/concepts.md, "The layers"): sub-packages with a docstring each, nothing else at the
top but ``api`` and ``cli``, no function over 60 lines, no import of the core inside a function (every core module
imports light, so none needs deferring), and the earlier import paths of the test helpers still work."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "packages" / "rl-core" / "src" / "rl_core"
#: the top-level modules that are not sub-packages: the public API, the command line, and the version hatch reads
TOP_LEVEL = {"__init__.py", "__about__.py", "api.py", "cli.py"}


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_the_core_top_level_is_api_cli_and_documented_sub_packages():
    modules = {p.name for p in CORE.glob("*.py")}
    assert modules == TOP_LEVEL, f"move {sorted(modules - TOP_LEVEL)} into a sub-package"
    packages = [p for p in CORE.iterdir() if (p / "__init__.py").exists()]
    assert len(packages) >= 8
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{package.name}/__init__.py needs a paragraph saying what it holds"


def test_no_function_is_longer_than_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for path in sorted(ROOT.glob("packages/*/src/**/*.py"))
        for fn in _functions(path)
        if fn.end_lineno - fn.lineno + 1 > 60
    ]
    assert not long, long


def test_the_core_and_plugins_import_the_core_only_at_module_level():
    """``rl_core`` (``rl_core.api`` for a plugin) imports light: a function-level import of it only hides a plugin's
    dependencies from its reader."""
    inside = [
        f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}"
        for path in sorted(ROOT.glob("packages/*/src/**/*.py"))
        for fn in _functions(path)
        for node in ast.walk(fn)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rl_core")
    ]
    assert not inside, inside


def test_every_core_module_imports_without_torch_ray_or_transformers():
    code = (
        "import importlib, pkgutil, sys, rl_core\n"
        "for m in pkgutil.walk_packages(rl_core.__path__, 'rl_core.'):\n"
        "    importlib.import_module(m.name)\n"
        "heavy = sorted({'torch', 'ray', 'transformers', 'vllm', 'megatron'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_earlier_paths_of_the_test_helpers_still_import():
    from rl_core.certify import certify_engine
    from rl_core.certify.conformance import sample_batch
    from rl_core.testing import certify, conformance

    assert certify.certify_engine is certify_engine
    assert conformance.sample_batch is sample_batch


def test_the_contributors_map_names_files_that_exist_and_every_algorithm_has_its_spec():
    """docs/concepts.md "Where it goes": each path it names exists, and each algorithm module is registered."""
    import re

    text = (ROOT / "docs" / "concepts.md").read_text()
    table = text[text.index("## Where it goes") :].split("\n## ", 1)[0]
    named = re.findall(r"`((?:packages|tests|examples|docs)/[^`]+)`", table)
    assert len(named) >= 15, named
    assert not [p for p in named if not (ROOT / p).exists()], "named in the map, missing from the tree"
    from rl_core.plugins.builtin import rl_algorithms

    registered = {spec.run.__module__.rsplit(".", 1)[1] for spec in rl_algorithms()}
    modules = {p.stem for p in (CORE / "algorithms").glob("*.py")} - {"__init__"}
    assert modules == registered, f"an algorithm module without its AlgorithmSpec: {sorted(modules - registered)}"

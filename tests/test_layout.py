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


def test_the_core_imports_itself_only_at_module_level():
    inside = [
        f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}"
        for path in sorted(CORE.rglob("*.py"))
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

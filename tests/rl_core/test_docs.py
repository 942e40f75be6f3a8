"""docs/config-reference.md is generated from the attrs classes and must be current."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current():
    out = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "config-reference"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert out.stdout == committed, "regenerate it: rl-core config-reference -o docs/config-reference.md"
    # a user reads the reference to learn what a key does: none without a description (a #: comment above it)
    rows = [line.split(" | ") for line in committed.splitlines() if line.startswith("| `")]
    bare = [row[0].strip("| `") for row in rows if not row[3].strip(" |")]
    assert len(rows) > 200 and not bare, f"keys without a description: {bare}"


def _yaml_value(default: str) -> str | None:
    """A default as the reference prints it (Python's repr), as a YAML value; None where it is not a plain value."""
    import ast

    if default in ("required", "(section)"):
        return None
    value = ast.literal_eval(default)
    if isinstance(value, tuple):
        value = list(value)
    import json

    return json.dumps(value)  # JSON is YAML


def reference_rows() -> list[tuple[str, str]]:
    import re

    rows = re.findall(
        r"^\| `([^`]+)` \| `[^`]*` \| `([^`]+)` \|", (ROOT / "docs" / "config-reference.md").read_text(), re.M
    )
    assert len(rows) > 100
    return rows


def test_every_key_of_the_config_reference_is_one_the_loader_accepts(make_config):
    """The reference and the loader agree: each key it lists, set to the default it states, loads."""
    import re

    source = re.compile(r"reward\.sources\[\] \(name: (\w+)\)\.(\w+)")
    required: dict[str, str] = {}  # per reward source: its required keys, given a placeholder
    for key, default in reference_rows():
        if default == "required" and (m := source.fullmatch(key)):
            value = "'http://127.0.0.1:1'" if m[2] == "url" else "x"
            required[m[1]] = required.get(m[1], "") + f", {m[2]}: {value}"
    checked = 0
    for key, default in reference_rows():
        value = _yaml_value(default)
        if value is None:
            continue
        if m := source.fullmatch(key):
            rest = required.get(m[1], "")
            if m[1] == "remote":  # one of url / urls is needed: the other one
                rest += ", urls: ['http://127.0.0.1:1']" if m[2] == "url" else ", url: 'http://127.0.0.1:1'"
            overrides = [f"reward.sources=[{{name: {m[1]}, {m[2]}: {value}{rest}}}]"]
        elif m := re.fullmatch(r"environment \(name: (\w+)\)\.(\w+)", key):
            overrides = [f"environment.name={m[1]}", f"environment.{m[2]}={value}"]
        else:
            overrides = [f"{key}={value}"]
        try:
            make_config(*overrides)
        except Exception as exc:
            raise AssertionError(
                f"the reference lists {key} (default {default}), the loader refuses it: {exc}"
            ) from exc
        checked += 1
    assert checked > 100

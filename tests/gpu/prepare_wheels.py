"""On a machine with pip and the package index (not the GPU machine): download what the GPU machine lacks as
cp312 manylinux wheels into ``.whl/`` (ignored by git, carried to the GPU machine), at most 64 MiB in all.

    python tests/gpu/prepare_wheels.py

The GPU machine has Python 3.12 with its own CUDA torch, transformers, pluggy, attrs, pyyaml, rich, numpy,
safetensors, tokenizers, psutil, pytest, httpx and more (docs/gpu.md); it lacks Ray (and Ray's jsonschema), cattrs,
megatron-core and hatchling (to install this repository's packages). Ray's wheel carries a Java folder
(``ray/jars/``, ~33 MB) that nothing here uses: it is dropped, with its lines in the wheel's RECORD.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".whl"
LIMIT = 64 * 2**20
#: name==version: what tests/gpu and bench/gpu.py import that the GPU machine lacks, and what those need.
WHEELS = [
    "ray==2.60.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "cattrs==26.2.1",
    "megatron-core==0.16.1",
    "hatchling==1.33.0",
    "trove-classifiers==2026.9.21.13",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def download(spec: str, dest: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
    ]
    args += ["--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", str(dest), spec]
    subprocess.run(args, check=True)


def strip_jars(wheel: Path) -> None:
    """Rewrite ``wheel`` without ``ray/jars/`` (and without their RECORD lines)."""
    with tempfile.NamedTemporaryFile(dir=wheel.parent, suffix=".whl", delete=False) as tmp:
        out_path = Path(tmp.name)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out_path, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename.startswith("ray/jars/"):
                continue
            data = src.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith("ray/jars/")).encode()
            dst.writestr(item, data)
    out_path.replace(wheel)


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for spec in WHEELS:
        name = spec.split("==")[0].replace("-", "_").lower()
        if not any(p.name.lower().startswith(f"{name}-") for p in OUT.glob("*.whl")):
            download(spec, OUT)
    for wheel in OUT.glob("ray-*.whl"):
        with zipfile.ZipFile(wheel) as z:
            has_jars = any(n.startswith("ray/jars/") for n in z.namelist())
        if has_jars:
            strip_jars(wheel)
    total = sum(p.stat().st_size for p in OUT.glob("*.whl"))
    for p in sorted(OUT.glob("*.whl")):
        print(f"{p.stat().st_size / 2**20:6.1f} MiB  {p.name}")
    print(f"{total / 2**20:6.1f} MiB in all (limit {LIMIT / 2**20:.0f} MiB)")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())

"""Warm-up models built before, kept under ``RL_CORE_CACHE/warmups/KEY`` and copied into a new run's
``RUN_DIR/warmup`` instead of being trained again. ``KEY`` is what makes the model: the warm-up's resolved config
(``run_identity``: without its run folder and logging), the files of its base model and data (names, sizes,
modification times), the installed versions of torch, transformers and peft, and the source of rl-core and of
every loaded plugin (so an edited backend or loss builds a new one). ``warmup_cache: false`` builds it again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from rl_core.base.paths import cache_root
from rl_core.base.schema import Config
from rl_core.data.models import resolve_model_path
from rl_core.launch.folder import run_identity
from rl_core.plugins.registry import Registry

#: libraries whose versions change what the same code computes
_LIBRARIES = ("torch", "transformers", "peft")


def warmup_key(warm: Config, registry: Registry) -> str:
    """The cache key of warm-up run ``warm`` (16 hex digits)."""
    digest = hashlib.sha256(run_identity(warm).encode())
    files = [Path(resolve_model_path(warm.policy.model_name))]
    files += [Path(p) for p in (warm.data.train_path, warm.data.val_path) if p]
    for path in files:
        digest.update(json.dumps(_stats(path)).encode())
    for library in _LIBRARIES:
        digest.update(f"{library}=={_version(library)}".encode())
    for package in _packages(registry):
        digest.update(_source_digest(package).encode())
    return digest.hexdigest()[:16]


def cached(key: str) -> bool:
    """Whether a whole warm-up run is cached under ``key``."""
    return (_folder(key) / "final" / "config.json").is_file()


def restore(key: str, warmup_dir: Path) -> Path:
    """Copy the cached warm-up ``key`` into ``warmup_dir`` (which must not exist yet); returns its cache folder."""
    cached = _folder(key)
    warmup_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".warmup-", dir=warmup_dir.parent))
    shutil.copytree(cached, tmp, dirs_exist_ok=True, copy_function=_link_or_copy)
    tmp.rename(warmup_dir)
    return cached


def store(key: str, warmup_dir: Path) -> None:
    """Keep the finished warm-up run in ``warmup_dir`` under ``key`` (atomically; a key cached meanwhile by
    another run is left as it is)."""
    cached = _folder(key)
    if cached.is_dir():
        return
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cached.parent))
    try:
        shutil.copytree(warmup_dir, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("checkpoints", ".lock*"))
        tmp.rename(cached)
    except OSError:  # stored concurrently by another run: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def _folder(key: str) -> Path:
    return cache_root() / "warmups" / key


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the cache and the run folder share a file system (a model's weights are not copied);
    a copy elsewhere."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _stats(path: Path) -> list[tuple[str, int, int]]:
    """(name, size, modification time) of the file ``path`` or of each file below the folder ``path``."""
    if path.is_file():
        return [(path.name, path.stat().st_size, path.stat().st_mtime_ns)]
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _packages(registry: Registry) -> list[Path]:
    """The folders of rl-core's and each loaded plugin's top-level package."""
    names = {"rl_core"} | {
        p.module.split(".")[0] for p in registry.plugins.values() if p.status == "loaded" and p.module
    }
    folders = []
    for name in sorted(names):
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if where is not None:
            folders.append(Path(where).parent)
    return folders


def _source_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()

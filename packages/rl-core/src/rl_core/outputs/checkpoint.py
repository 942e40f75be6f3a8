"""Checkpoints in the run folder: written atomically, verified on load, pruned to the best ``keep_top_k``.

A checkpoint is ``RUN_DIR/checkpoints/step_000010/`` holding ``policy/`` (the backend's own format),
``state.json`` (step, metrics, data position, RNG), ``config.yaml`` and, written last, ``manifest.json``: every
file with its size and sha256. It is written under a temporary name and renamed when complete, so a run killed
mid-write leaves only a ``.tmp`` folder that is ignored and removed. On resume the newest checkpoint whose files
all match its manifest is used; each newer one that does not is skipped with one line saying why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from rl_core.base.errors import RLCoreError
from rl_core.base.schema import CheckpointingConfig

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step_(\d{6,})$")
MANIFEST = "manifest.json"


class CheckpointError(RLCoreError):
    """A checkpoint could not be written; the message says why in one line."""


@attrs.frozen(kw_only=True)
class Checkpoint:
    step: int
    path: Path
    state: Mapping[str, Any]

    @property
    def policy_dir(self) -> Path:
        return self.path / "policy"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, checksums: bool = True) -> None:
    """``folder/manifest.json``: every file below ``folder`` (relative path, size, sha256), written atomically."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if checksums:
            entry["sha256"] = _sha256(path)
        files[str(path.relative_to(folder))] = entry
    atomic_write_text(folder / MANIFEST, json.dumps({"files": files}, indent=1))


def verify(folder: Path) -> str | None:
    """Why ``folder`` is not a whole checkpoint (None when it is): a missing or unreadable manifest, state or file, a
    size or checksum that differs from the manifest's."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (written last, so the checkpoint was never finished)"
    except (OSError, ValueError) as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    for name, entry in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']}"
        if "sha256" in entry and _sha256(path) != entry["sha256"]:
            return f"{name} does not match its checksum (corrupted)"
    try:
        json.loads((folder / "state.json").read_text())
    except (OSError, ValueError) as exc:
        return f"state.json is unreadable ({exc})"
    return None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; when the block succeeds it replaces ``path`` whole (an existing
    ``path`` is removed only then), and when it fails it is removed and ``path`` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".old-{path.name}-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save_failure(step: int, root: Path, exc: BaseException) -> CheckpointError:
    """One line: the disk is full (named as such), or the root cause."""
    free = shutil.disk_usage(root).free
    if free < 64 * 2**20 or (isinstance(exc, OSError) and exc.errno == 28):
        why = f"no space left on device ({free / 2**20:.1f} MiB free on {root}); free space or choose another run_dir"
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = f"{type(exc).__name__}: {lines[-1] if lines else exc!r}"
    return CheckpointError(f"checkpoint of step {step} not written to {root}: {why}")


class CheckpointManager:
    def __init__(self, run_dir: Path, cfg: CheckpointingConfig) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.cfg = cfg

    def _folders(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
        return sorted(found)

    def complete(self) -> list[Checkpoint]:
        """Checkpoints whose state reads back, oldest first (not verified against their manifests: see ``latest``).
        Half-written ones (``.tmp``) are never listed."""
        out = []
        for step, path in self._folders():
            try:
                out.append(Checkpoint(step=step, path=path, state=json.loads((path / "state.json").read_text())))
            except (OSError, ValueError):
                continue
        return out

    def latest(self, skipped: Callable[[str], None] = log.warning) -> Checkpoint | None:
        """The newest checkpoint that is whole (``verify``); ``skipped(line)`` hears of each newer one that is not."""
        for step, path in reversed(self._folders()):
            problem = verify(path)
            if problem is None:
                return Checkpoint(step=step, path=path, state=json.loads((path / "state.json").read_text()))
            skipped(f"checkpoint {path.name} skipped: {problem}")
        return None

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        write_policy: Callable[[Path], None],
        config_yaml: str,
        also: Mapping[str, Callable[[Path], None]] | None = None,
    ) -> Path:
        """Write a checkpoint atomically (the policy in ``policy/``, each of ``also``'s models in the folder of its
        name: a critic's in ``critic/``); a failure removes what was written and raises one clear line."""
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / f"step_{step:06d}"
        try:
            with atomic_folder(final) as tmp:
                write_policy(tmp / "policy")
                for name, write in (also or {}).items():
                    write(tmp / name)
                (tmp / "config.yaml").write_text(config_yaml)
                (tmp / "state.json").write_text(json.dumps(dict(state), indent=1))
                write_manifest(tmp, self.cfg.checksums)
        except RLCoreError:  # already one clear message (a dead worker, say): the half-written folder is gone
            raise
        except Exception as exc:
            raise _save_failure(step, self.root, exc) from exc
        self._prune()
        return final

    def _prune(self) -> None:
        keep = self.cfg.keep_top_k
        done = self.complete()
        if keep is None or len(done) <= keep:
            return
        latest = done[-1]
        metric = self.cfg.metric_name

        def score(c: Checkpoint) -> float:
            value = c.state.get("metrics", {}).get(metric) if metric else None
            if value is None:
                return float(c.step)  # no metric: keep the newest
            return float(value) if self.cfg.higher_is_better else -float(value)

        ranked = sorted(done, key=lambda c: (score(c), c.step), reverse=True)
        keep_set = {c.path for c in ranked[:keep]} | {latest.path}
        for c in done:
            if c.path not in keep_set:
                log.info("removing checkpoint %s (not in the top %d by %s)", c.path.name, keep, metric)
                shutil.rmtree(c.path, ignore_errors=True)

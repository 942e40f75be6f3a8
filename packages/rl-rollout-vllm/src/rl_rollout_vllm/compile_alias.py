"""A model folder's stand-in for vLLM's compile cache: its files but the weights, in a cache folder named by their
content. vLLM keys that cache by the model's path among its factors, so every new folder of one architecture (each
run's warm-up model, a copy) compiled again (~26 s of a ~32 s start on the tiny model); an engine started on the
stand-in with dummy weights, then given the folder's own (``RefitExtension.rl_load_folder``), reads it back."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from rl_core.api import cache_root

#: the weights' files, loaded from the model's own folder; everything else (configs, tokenizer, code) is copied
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def compile_alias(model: str) -> Path | None:
    """The stand-in of the local folder ``model`` (made once, atomically); None where vLLM must load the folder
    itself: not a local folder, or weights other than safetensors (the extension reads those alone)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file())
    weights = [p for p in files if p.name.endswith(WEIGHTS) or p.name.endswith(".safetensors.index.json")]
    if not weights or any(not p.name.endswith((".safetensors", ".safetensors.index.json")) for p in weights):
        return None
    kept = [p for p in files if p not in weights]
    digest = hashlib.sha256()
    for p in kept:
        digest.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    alias = cache_root() / "vllm-models" / digest.hexdigest()[:16]
    if not (alias / "config.json").is_file():
        alias.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=alias.parent, prefix=".tmp-"))
        for p in kept:
            shutil.copy2(p, tmp / p.name)
        try:
            os.rename(tmp, alias)
        except OSError:  # another engine made it meanwhile: the same content
            shutil.rmtree(tmp, ignore_errors=True)
    return alias

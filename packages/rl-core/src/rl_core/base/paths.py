"""Where rl-core keeps its caches: built tiny models, vLLM and inductor compile caches, converted checkpoints."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``RL_CORE_CACHE``, else ``~/.cache/rl_core``."""
    return Path(os.environ.get("RL_CORE_CACHE", Path.home() / ".cache" / "rl_core"))

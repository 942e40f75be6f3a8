"""Shared test setup: caches (tiny models, vLLM/inductor compile caches) in the repository's .cache folder."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RL_CORE_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

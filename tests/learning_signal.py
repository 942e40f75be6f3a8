"""The learning-signal warnings a finished run's ``metrics.jsonl`` raises, replayed (no new run): how the suite
checks that its recipe runs raise no false alarm."""

import json
from pathlib import Path

from rl_core.training.signal import SignalWatch, limit_setting


def signal_warnings(run: Path, config) -> list[str]:
    said: list[str] = []
    watch = SignalWatch(*limit_setting(config), warn=said.append)
    for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if row["step"] > 0:
            watch.step(row["step"], row)
    return said

"""Where log records go during a run: everything (rl_core's, Ray's, transformers', Python warnings) into
``RUN_DIR/logs/driver.log``; on the terminal only rl_core's warnings and errors, unless ``--verbose``. Worker output
is in ``RUN_DIR/logs/NAME-RANK.log`` (``rl_core.cluster``); Ray forwards it to the terminal only with
``--verbose``."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _OnlyOurs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith("rl_") and record.levelno >= logging.WARNING


@contextlib.contextmanager
def run_logs(run_dir: Path, verbose: bool) -> Iterator[Path]:
    """Route log records and warnings as the module says while the block runs; yields the driver log's path."""
    path = run_dir / "logs" / "driver.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter(FORMAT))
    terminal = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and h is not to_file]
    filters = [] if verbose else [_OnlyOurs()]
    for handler in terminal:
        for f in filters:
            handler.addFilter(f)
    old_level = root.level
    root.addHandler(to_file)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            yield path
        finally:
            logging.captureWarnings(False)
            root.removeHandler(to_file)
            to_file.close()
            root.setLevel(old_level)
            for handler in terminal:
                for f in filters:
                    handler.removeFilter(f)

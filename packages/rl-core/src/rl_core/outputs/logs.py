"""Where log records go during a run: everything (rl_core's, the plugins', Ray's, transformers', Python warnings)
into ``RUN_DIR/logs/driver.log``; on the terminal only the warnings and errors of rl_core and of the loaded plugins'
packages (a plugin's ``logging.getLogger(__name__)``), unless ``--verbose``. Worker output is in
``RUN_DIR/logs/NAME-RANK.log`` (``rl_core.distributed.cluster``); Ray forwards it to the terminal only with ``--verbose``."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Collection, Iterator
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _OnlyOurs(logging.Filter):
    def __init__(self, packages: Collection[str]) -> None:
        super().__init__()
        self.packages = tuple(packages)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and record.name.split(".")[0] in self.packages


@contextlib.contextmanager
def run_logs(run_dir: Path, verbose: bool, packages: Collection[str] = ("rl_core",)) -> Iterator[Path]:
    """Route log records and warnings as the module says while the block runs; yields the driver log's path."""
    path = run_dir / "logs" / "driver.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter(FORMAT))
    terminal = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and h is not to_file]
    filters = [] if verbose else [_OnlyOurs(packages)]
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

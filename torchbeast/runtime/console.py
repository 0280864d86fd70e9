"""The console's log lines: set up by every command that trains, tests or benchmarks."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("torchbeast")

LOG_FORMAT = "[%(levelname)s:%(process)d %(asctime)s] %(message)s"


def setup_console_logging(suppress: bool = False) -> None:
    """Log lines on stdout; with ``suppress`` (--suppress_logs) only progress lines and
    warnings."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    if suppress:
        suppress_console_logs()


def suppress_console_logs() -> None:
    """Keeps only progress lines (steps, SPS, time left, mean return, entropy) and warnings on the
    console; out.log still gets everything."""

    def progress_or_warning(record: logging.LogRecord) -> bool:
        return record.name == "torchbeast.progress" or record.levelno >= logging.WARNING

    for handler in log.handlers:
        if type(handler) is logging.StreamHandler:
            handler.addFilter(progress_or_warning)

"""The console's log lines: set up by every command that trains, tests or benchmarks."""

from __future__ import annotations

import logging
import sys
import threading
import time

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


class RateLimitedLog:
    """Warnings about what peers do (refused streams, dropped batches): at most ``burst``
    lines per ``period_s``, then a count of ``what`` was not logged, so that a flood of bad
    connections cannot flood the log."""

    def __init__(self, what: str, burst: int = 20, period_s: float = 10.0):
        self.what, self.burst, self.period_s = what, burst, period_s
        self.lock = threading.Lock()
        self.window_start = time.monotonic()
        self.logged = self.suppressed = 0

    def warning(self, message: str, *args) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.window_start >= self.period_s:
                if self.suppressed:
                    log.warning(
                        "%d more %s in the last %.0f s were not logged.",
                        self.suppressed,
                        self.what,
                        now - self.window_start,
                    )
                self.window_start, self.logged, self.suppressed = now, 0, 0
            if self.logged >= self.burst:
                self.suppressed += 1
                return
            self.logged += 1
        log.warning(message, *args)

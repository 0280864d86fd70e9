"""Runs a process at a fraction of its speed, to stand in for a slower machine: it is
stopped and continued (SIGSTOP, SIGCONT) in 20 ms cycles until it exits.

    python scripts/throttle.py PID 0.1    # PID runs 10% of the time
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

PERIOD_S = 0.02

if __name__ == "__main__":
    pid, share = int(sys.argv[1]), float(sys.argv[2])
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C
    try:
        while True:
            os.kill(pid, signal.SIGCONT)
            time.sleep(PERIOD_S * share)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(PERIOD_S * (1 - share))
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # never leave it stopped
    except ProcessLookupError:
        pass  # it exited

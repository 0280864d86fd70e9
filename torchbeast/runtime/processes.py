"""Small helpers for processes the program starts (kept free of torch imports)."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (belt and braces)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass

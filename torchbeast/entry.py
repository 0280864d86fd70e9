"""What an entry point does first: until its work begins, a Ctrl-C ends it at once, in one
line.

Starting a command imports torch and the rest for a second or more (several on a loaded
machine). Python's KeyboardInterrupt raised in the middle of one of those imports was a
traceback, or a segmentation fault from torch's half-loaded extension. Before the work
begins nothing has been written or started, so ending the process there loses nothing.
This module imports nothing heavy, so that it is in place before those imports are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def quit_now(signum: int, frame: object) -> None:
    """SIGINT's handler while a command starts: one line, and the process ends."""
    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(INTERRUPTED_EXIT_CODE)


@contextlib.contextmanager
def interrupt_quits() -> Iterator[None]:
    """Meanwhile, until ``work_begins``, a Ctrl-C is ``quit_now``. Only where Ctrl-C would
    otherwise raise KeyboardInterrupt in this, the main thread: a process that ignores
    SIGINT (started in the background by a script) or handles it its own way keeps that."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, quit_now)
    try:
        yield
    finally:
        work_begins()


# The tools, commands whose modules import their libraries as they load (torch, matplotlib):
# nothing of theirs runs before those imports, so the package's ``__init__`` puts
# ``quit_now`` in place as ``python -m`` starts one (``quit_while_a_tool_loads``). Each calls
# ``work_begins`` first thing in its ``main``. The training entry points keep their imports
# inside ``main``, in ``interrupt_quits``.
TOOLS = frozenset(
    f"torchbeast.{name}"
    for name in ("bench", "learncheck", "lightlog", "plot", "scaling", "study", "study_plot")
)


def module_run_by_python() -> str | None:
    """The module of ``python [options] -m MODULE ...`` while the interpreter imports its
    packages to find it (Python then has ``sys.argv[0]`` "-m"); None at any other time."""
    words = getattr(sys, "orig_argv", [])
    if sys.argv[:1] != ["-m"] or "-m" not in words[1:-1]:
        return None
    return words[words.index("-m", 1) + 1]


def quit_while_a_tool_loads() -> None:
    """``quit_now`` for a Ctrl-C while one of the ``TOOLS`` loads, under the same
    conditions as ``interrupt_quits``; its ``main`` calls ``work_begins``."""
    if (
        module_run_by_python() in TOOLS
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, quit_now)


def work_begins() -> None:
    """From here a Ctrl-C raises KeyboardInterrupt again, which the work unwinds from (its
    processes stopped, its checkpoint written)."""
    if signal.getsignal(signal.SIGINT) is quit_now:
        signal.signal(signal.SIGINT, signal.default_int_handler)

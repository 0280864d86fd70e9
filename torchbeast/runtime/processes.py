"""Small helpers for processes the program starts (standard library only: a spawned
child imports this module before it can guard itself, see :func:`guarded_main`)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator


def child_dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with the thread that
    starts it (PR_SET_PDEATHSIG), or None where Linux's prctl is not at hand. libc is
    loaded here, in the parent: a child forked from a threaded parent must not dlopen."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def sigterm_as_ctrl_c() -> None:
    """A scheduler's SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does:
    a tool that runs training runs as its children stops them, and keeps what it has."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@contextlib.contextmanager
def further_stops_said(note: str) -> Iterator[None]:
    """While the children stop (each writes its checkpoint), a second Ctrl-C or SIGTERM
    prints ``note`` and is not obeyed: leaving then would kill them mid-write (they die
    with this process). Signals are the main thread's: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def say(signum: int, frame: object) -> None:
        print(note, file=sys.stderr, flush=True)

    previous = {number: signal.signal(number, say) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (belt and braces). A fork
    server's child also watches multiprocessing's sentinel of the process that started
    it: Linux's guard is on the server, which lives on while any of its children does
    (each holds the pipe whose end tells the server its starter is gone). An actor that
    waited for weights its learner was killed in the middle of writing waited forever."""
    guard = child_dies_with_parent()
    if guard is not None:
        guard()
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid() and parent.is_alive():
        watch_parent(parent)


def guarded_main(parent_pid: int, target: str, *args: object) -> None:
    """A child's entry: it dies with ``parent_pid``, then runs ``target(*args)``.

    ``target`` is "module:function", imported only once the guard is in place: a parent
    killed while its children import their modules must not leave them running. Spawn
    has unpickled ``args`` and re-imported the parent's ``__main__`` before this runs, so
    ``args`` are plain data and entry points keep their top-level imports light.
    """
    die_with_parent()
    if os.getppid() != parent_pid:
        # A fork server's child, or the parent died before the guard was set. Then
        # multiprocessing's sentinel of the parent (a pipe whose writing end it holds)
        # says whether it lives.
        parent = multiprocessing.parent_process()
        if parent is None or parent.pid != parent_pid or not parent.is_alive():
            raise SystemExit(1)  # nobody would stop this process
    module, _, function = target.partition(":")
    getattr(importlib.import_module(module), function)(*args)


def watch_parent(parent: multiprocessing.process.BaseProcess) -> None:
    """Kills this process once ``parent`` (multiprocessing's view of the process that
    started it) is gone, as Linux's guard does: a daemon thread waits on its sentinel."""

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of other processes so far, from /proc (0 for a process
    that is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total

"""What every runtime does with the actors or processes it starts, written once: restart a
dead one within a budget, end the run with one line when it cannot go on, start children
with the stop signals blocked (or fork them from a server that ignores them), stop them by
a deadline, and stop on SIGTERM.

Standard library only: PolyBeast's env side, which never imports torch, uses it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator

MAX_DEATHS_PER_MINUTE_PER_ACTOR = 3
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
STOP_TIMEOUT_S = 5.0

log = logging.getLogger("torchbeast")


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal 40" for one without a name (a real-time signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def last_line(error: BaseException | str) -> str:
    """The last line of an error or traceback: what a one-line report shows."""
    lines = str(error).strip().splitlines()
    if lines:
        return lines[-1]
    return type(error).__name__ if isinstance(error, BaseException) else "unknown error"


class RestartBudget:
    """Deaths a run tolerates: at most ``per_minute`` times the number of actors in any
    60 s, counted over the whole pool (one actor may use all of it), so that one crash is
    replaced and training goes on, while actors that keep dying stop the run."""

    def __init__(self, num_actors: int, per_minute: int = MAX_DEATHS_PER_MINUTE_PER_ACTOR):
        self.limit = per_minute * num_actors
        self.recent: list[float] = []  # monotonic times of deaths in the last minute

    def record_death(self) -> bool:
        """Notes a death; True while a replacement is within the budget."""
        now = time.monotonic()
        self.recent = [t for t in self.recent if now - t < 60] + [now]
        return len(self.recent) <= self.limit

    def deaths_text(self) -> str:
        return f"{len(self.recent)} in the last minute"


class Supervised:
    """A pool's run-ending state: ``error`` (one line for the user) and ``stopping``."""

    def __init__(self, stopping: threading.Event | None = None):
        self.stopping = stopping or threading.Event()
        self.error: str | None = None

    def fail(self, message: str) -> None:
        """Ends the run with ``message``; the first failure is the one reported."""
        if self.error is None:
            self.error = message
        self.stopping.set()


class RunBusy(RuntimeError):
    """Another command trains the run already (or its lock cannot be taken)."""


RUN_LOCK_NAME = ".lock"  # in a run's folder: held while a command trains the run


@contextlib.contextmanager
def run_folder_held(run_dir: str, xpid: str) -> Iterator[None]:
    """Holds the run's folder while this command trains it: two at once on one --xpid
    wrote over each other's checkpoint (a finished run's, too) and set each other's logs
    aside. Where the folder cannot take the lock file (an unwritable savedir), the run's
    own checks say why in one line; where its file system has no locks, nothing is held. A
    folder it made and the run left empty (refused as it started) is removed."""
    made = not os.path.isdir(run_dir)
    path = os.path.join(run_dir, RUN_LOCK_NAME)
    if os.path.isdir(path):  # it would not open: the run went unguarded, without a word
        raise RunBusy(
            f"{path} is a folder, not the lock file that keeps two commands from training "
            "the run at once: move it away"
        )
    try:
        os.makedirs(run_dir, exist_ok=True)
        lock = open(path, "a+")
    except OSError:
        yield
        return
    with lock, contextlib.ExitStack() as cleanup:
        if made:
            cleanup.callback(remove_if_unused, run_dir)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise RunBusy(
                f"run {xpid} is being trained by another command (process {holder}) in "
                f"{run_dir}: wait for it to end, stop it, or give this one another --xpid"
            ) from None
        except OSError:  # no locks on this file system
            pass
        else:
            lock.seek(0)
            lock.truncate()
            lock.write(f"{os.getpid()}\n")
            lock.flush()
        yield


def remove_if_unused(run_dir: str) -> None:
    """Removes a run folder that holds nothing but its lock."""
    with contextlib.suppress(OSError):
        if os.listdir(run_dir) == [RUN_LOCK_NAME]:
            os.unlink(os.path.join(run_dir, RUN_LOCK_NAME))
            os.rmdir(run_dir)


class Stopped(KeyboardInterrupt):
    """A signal (Ctrl-C, or SIGTERM, which schedulers send before they take a machine)
    stopped the run before its end. Its exit code is 128 + the signal's number, as a shell
    reports a process the signal ended: a scheduler that restarts unfinished jobs sees one,
    and the same command resumes it. (A KeyboardInterrupt, so that whatever unwinds on
    Ctrl-C unwinds on it too.)"""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.message = message

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STOPPED_WHILE_STARTING = (
    "stopped by SIGTERM before training began; nothing was lost: run the same command to "
    "start (or resume)"
)


class FirstSignal:
    """A signal handler whose first signal calls ``stop`` and whose later ones change
    nothing (``received`` says whether one came): a later one may come while the first's
    ``stop`` holds an Event's lock, and setting it again there would wait for ever."""

    def __init__(self, stop: Callable[[], None] | None = None):
        self.stop = stop
        self.received = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.received:
            return
        self.received = True
        self.act(signum)

    def act(self, signum: int) -> None:
        if self.stop is not None:
            self.stop()


class Sigterm(FirstSignal):
    """What SIGTERM does to a training command: while the run starts (no ``stop`` yet),
    the first one raises Stopped, which unwinds what has started (a Ray instance, env
    processes) as Ctrl-C does; while it trains, it calls ``stop`` (the trainer's: stop,
    checkpoint, exit); a later one changes nothing."""

    def act(self, signum: int) -> None:
        if self.stop is None:
            raise Stopped(signum, STOPPED_WHILE_STARTING)
        self.stop()


@contextlib.contextmanager
def sigterm_handled(stop: Callable[[], None] | None = None) -> Iterator[Sigterm]:
    """Meanwhile SIGTERM is handled by a ``Sigterm`` (the command's, where its start
    installed one); ``stop``: what it does while training, and afterwards nothing, since
    the run is stopping anyway."""
    installed = signal.getsignal(signal.SIGTERM)
    if isinstance(installed, Sigterm):
        installed.stop = stop
        try:
            yield installed
        finally:
            if stop is not None:
                installed.stop = lambda: None
        return
    own = Sigterm()
    own.stop = stop
    previous = signal.signal(signal.SIGTERM, own)
    try:
        yield own
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_blocked(signals: Collection[int] = STOP_SIGNALS) -> Iterator[None]:
    """Blocks ``signals`` in this thread meanwhile: a signal that comes meanwhile waits
    until the block ends. Children that are not Python inherit the mask (Ray's raylet);
    a Python child starts with none (``python_children_ignore``)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


@contextlib.contextmanager
def python_children_ignore(signals: Collection[int] = (signal.SIGINT,)) -> Iterator[None]:
    """Meanwhile, a Python process started here begins ignoring ``signals`` (Ctrl-C), until
    it sets its own handlers: it keeps them ignored through exec, and so installs no
    KeyboardInterrupt (the signal mask it does not keep: a Ctrl-C to the process group
    while an actor unpickled its tensors was a traceback from it). This process's own stop
    signals are blocked meanwhile, and wait for their handlers where they reach this
    thread. Only the main thread may change a handler: elsewhere, the block alone."""
    main = threading.current_thread() is threading.main_thread()
    previous = {number: signal.getsignal(number) for number in signals} if main else {}
    with signals_blocked({*STOP_SIGNALS, *signals}):
        # Ignoring a signal discards it where it waits: one that came since the block
        # began (a SIGTERM lost, a run that would not stop) is raised again at the end.
        waiting = signal.sigpending() & set(previous)
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, signal.SIG_IGN)
        try:
            yield
        finally:
            for number, handler in previous.items():
                if handler is not None:
                    signal.signal(number, handler)
            for number in waiting:  # blocked still: it waits for the block's end
                signal.raise_signal(number)


def forked_children(preload: Iterable[str], fork_here: bool = True) -> mp.context.BaseContext:
    """A context whose processes fork from one server process that imported ``preload``
    (and the main module, where it is a file) once. A child starts in a fraction of a
    second, where a spawned one spent ~1.5 s of CPU importing torch, and the children share
    those pages (a ``-m`` main module still runs anew in each, as in a spawned child, but
    finds its imports done). The server is started here if it is not running, ignoring
    SIGINT and SIGTERM, as its children do until they set their own handlers: a stop signal
    to the process group while a child starts is no traceback from it, and the server ends
    only with this process. With ``fork_here`` (the caller's word that its state may be
    forked: e.g. CUDA never started) the server is this process forked, where that is safe
    (``server_forked_from_here``). Spawn's context where the server cannot start (its
    socket needs a writable temporary folder)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["__main__", *preload])
    try:
        with python_children_ignore(STOP_SIGNALS), server_forked_from_here(fork_here):
            multiprocessing.forkserver.ensure_running()
    except OSError as error:  # e.g. a $TMPDIR too long for a socket's path
        log.info(
            "Children are spawned, each importing torch anew: no fork server could start (%s).",
            error.strerror or error,
        )
        return mp.get_context("spawn")
    return context


FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"


def only_thread() -> bool:
    """Whether this process runs no Python thread but this one: no lock of Python's (the
    import lock, a logging handler's) can be held by another thread as it forks. Native
    threads it may have are numerical libraries' idle pools, as a spawned server that
    imported them has too: OpenBLAS's, which shuts itself down for a fork, and OpenMP's,
    which the children, one op thread each, never use."""
    return threading.active_count() == 1


@contextlib.contextmanager
def server_forked_from_here(allowed: bool) -> Iterator[None]:
    """Meanwhile, a fork server that multiprocessing starts is this process forked, not a
    new interpreter that imports torch and the preloaded modules again (~1.8 s of CPU):
    where ``allowed``, on Linux, while this process runs no other Python thread.
    multiprocessing still starts the server and talks to it; only how its process begins
    changes (``spawnv_passfds``, which it calls for that)."""
    spawn = multiprocessing.util.spawnv_passfds
    if not (allowed and sys.platform.startswith("linux") and only_thread()):
        yield
        return
    multiprocessing.resource_tracker.ensure_running()  # spawned as before, not forked

    def fork_or_spawn(path: str, args: list[str], passfds: Collection[int]) -> int:
        command = args[-1] if len(args) > 2 and args[-2] == "-c" else ""
        if not command.startswith(FORK_SERVER_COMMAND):  # the resource tracker's, say
            return spawn(path, args, passfds)
        for stream in (sys.stdout, sys.stderr):  # or the server would write them again
            if stream is not None:
                stream.flush()
        with warnings.catch_warnings():  # Python 3.12+ counts the native pools above
            warnings.filterwarnings("ignore", "This process .* is multi-threaded")
            pid = os.fork()
        if pid == 0:
            serve_forked(command, passfds)  # never returns
        return pid

    multiprocessing.util.spawnv_passfds = fork_or_spawn
    try:
        yield
    finally:
        multiprocessing.util.spawnv_passfds = spawn


def serve_forked(command: str, passfds: Collection[int]) -> None:
    """In the forked server: becomes what the spawned one starts as, then serves (the
    stdlib's ``main``, run by ``command``) until the parent is gone, and exits."""
    status = 1
    try:
        # A spawned server starts with no signal blocked, the stop signals ignored.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        detach_descriptors(passfds)
        root = logging.getLogger()
        for logger in (log, root):  # as in a new interpreter: the run's are the run's
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
        log.setLevel(logging.NOTSET)
        log.propagate = True
        root.setLevel(logging.WARNING)
        exec(command, {})  # raises SystemExit once the parent's end of that pipe closes
    except SystemExit:
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)


def detach_descriptors(passfds: Collection[int]) -> None:
    """Points each descriptor but stdin, stdout, stderr and ``passfds`` at /dev/null, as a
    spawned server has none of them: the run's lock file stays locked only while the run
    lives, and the pipe the server reads for EOF (the parent's life) is one whose writing
    end it does not hold. Pointed, not closed: an object of the run's that holds one (a log
    file) can still write or close it, into nothing, and never into a file opened since."""
    kept = {0, 1, 2, *passfds}
    inherited = [int(name) for name in os.listdir("/proc/self/fd") if int(name) not in kept]
    nothing = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in inherited:
            if fd == nothing:
                continue
            try:
                os.fstat(fd)
            except OSError:  # the listing's own, closed by now
                continue
            os.dup2(nothing, fd)
    finally:
        os.close(nothing)


def starting_child(context: mp.context.BaseContext) -> contextlib.AbstractContextManager:
    """What a child's start in ``context`` needs so that a Ctrl-C to the process group
    does not kill it before it sets its handlers (``forked_children``: nothing)."""
    if context.get_start_method() == "forkserver":
        return contextlib.nullcontext()
    return python_children_ignore()


def join_or_kill(
    processes: Iterable[mp.process.BaseProcess], timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """Waits until ``timeout_s`` in all for the processes to exit, then kills the rest."""
    processes = list(processes)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout_s)

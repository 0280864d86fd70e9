"""The environment side of PolyBeast: env servers (classic) and env clients (inverted).

Either way one stream carries one environment: it sends a Hello and its first frame,
then answers every Action with one Step. Classic: the learner dials an env server, which
starts a fresh environment for each stream. Inverted: an env client dials the learner
and redials with backoff when the learner goes away (a new stream is a new episode).

This side never imports torch: env machines need only the environments and gRPC.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.queues import SimpleQueue

import grpc
import numpy as np

from torchbeast import envs
from torchbeast.config.poly import PolyEnvSettings
from torchbeast.core.errors import UserError, shown
from torchbeast.runtime.poly import codec, network
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly import polybeast_pb2_grpc as pb_grpc
from torchbeast.runtime.processes import guarded_main
from torchbeast.runtime.supervision import (
    RestartBudget,
    forked_children,
    join_or_kill,
    signal_name,
)

log = logging.getLogger("torchbeast")

MAX_BACKOFF_S = 5.0
# Of an environment's error, sent to the learner: its line and its traceback's end, in
# gRPC's 8 KiB of metadata even where each character is percent-encoded (3 bytes).
MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS = 300, 2000
# A client that hears one of these will not be let in by trying again.
FATAL_CODES = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
)


class EnvFailed(Exception):
    """The environment itself raised (a bug of its, not the stream's): its error's line,
    with ``details`` its traceback."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.details = traceback.format_exc()


@contextlib.contextmanager
def its_own_failure() -> Iterator[None]:
    """Raises what the environment raises as EnvFailed (a bad Action stays ProtocolError)."""
    try:
        yield
    except codec.ProtocolError:
        raise
    except Exception as error:
        raise EnvFailed(error) from error


def env_session(
    settings: PolyEnvSettings,
    client_id: str,
    actions: Iterator[pb.Action],
    seed: int | None = None,
    max_steps: int = 0,
) -> Iterator[pb.EnvMessage]:
    """Hello, the first frame, then one Step per Action; stops after ``max_steps`` if set.

    The stream carries ``settings.envs_per_stream`` envs, stepped together.
    """
    num_envs = settings.envs_per_stream
    with its_own_failure():
        env = envs.create_env(settings.env, num_envs=num_envs, num_threads=1)
    try:
        num_actions, extras = env.spec.num_actions, env.spec.episode_extras
        yield codec.hello(client_id, env.spec, num_envs, dict(settings.env.options))
        with its_own_failure():
            first = codec.step_message(env.reset(seed=seed), extras)
        yield first
        for steps, message in enumerate(actions, start=1):
            action = np.asarray(message.action, dtype=np.int64)
            if action.shape != (num_envs,) or not ((0 <= action) & (action < num_actions)).all():
                raise codec.ProtocolError(
                    f"an Action needs {num_envs} actions in [0, {num_actions}), got "
                    f"{list(message.action)[:8]}"
                )
            with its_own_failure():
                step = codec.step_message(env.step(action), extras)
            yield step
            if steps == max_steps:
                return
    finally:
        env.close()


# --------------------------------------------------------------------------- classic


# Streams (a server's) or sessions (a client's) each incarnation of an env process numbers
# its seeds from: far beyond what one runs.
STREAMS_PER_INCARNATION = 1_000_000


class EnvServicer(pb_grpc.EnvServerServicer):
    """Serves a fresh environment on every stream the learner opens."""

    def __init__(
        self, settings: PolyEnvSettings, address: str, server_index: int, incarnation: int = 0
    ):
        self.settings = settings
        self.address = address
        self.server_index = server_index
        self.num_servers = len(settings.network.server_addresses())
        # A replacement's streams take seeds its predecessors' did not.
        self.counter = itertools.count(incarnation * STREAMS_PER_INCARNATION)
        self.failures_said: set[str] = set()  # each environment error's traceback once

    def StreamEnv(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        stream_index = next(self.counter)
        worker = stream_index * self.num_servers + self.server_index
        seed = envs.worker_seed(self.settings.env.seed, worker, self.settings.envs_per_stream)
        client_id = f"{socket.gethostname()}:{self.address}#{stream_index}"
        try:
            yield from env_session(self.settings, client_id, request_iterator, seed)
        except codec.ProtocolError as error:
            log.warning("Closing stream %s from %s: %s", client_id, context.peer(), error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except EnvFailed as error:
            if str(error) in self.failures_said:
                log.warning("Stream %s: %s%s", client_id, codec.ENV_FAILED, error)
            else:  # a learner redials every few seconds: one traceback for each error
                self.failures_said.add(str(error))
                log.warning("Stream %s: %s%s", client_id, codec.ENV_FAILED, error.details)
            context.abort(
                grpc.StatusCode.ABORTED,
                f"{codec.ENV_FAILED}{str(error)[:MAX_ERROR_CHARS]}\n"
                f"{error.details[-MAX_TRACEBACK_CHARS:]}",
            )


def serve(
    settings: PolyEnvSettings, address: str, server_index: int, ready=None, incarnation: int = 0
) -> None:
    """Runs one env server on ``address`` until SIGINT or SIGTERM; ``incarnation``: how
    many processes of this index were killed and replaced before it."""
    stop = _stop_on_signals()
    server, _ = network.create_server(settings.network, address, settings.max_streams)
    servicer = EnvServicer(settings, address, server_index, incarnation)
    pb_grpc.add_EnvServerServicer_to_server(servicer, server)
    server.start()
    log.info("Env server %d serving %s on %s.", server_index, settings.env.env, address)
    if ready is not None:
        ready.set()
    stop.wait()
    server.stop(grace=0.5).wait()


# --------------------------------------------------------------------------- inverted


def connect_once(
    settings: PolyEnvSettings,
    stub: pb_grpc.LearnerStub,
    client_id: str,
    seed: int | None,
    stop: threading.Event,
) -> None:
    """One stream to the learner, until either side ends it or ``stop`` is set."""
    outgoing: queue.Queue[pb.EnvMessage | None] = queue.Queue()
    responses = stub.ConnectEnv(
        iter(outgoing.get, None), metadata=network.call_metadata(settings.network)
    )
    try:
        for message in env_session(settings, client_id, responses, seed, settings.client_steps):
            outgoing.put(message)
            if stop.is_set():
                break  # the half-close below lets the learner learn from what it got
    finally:
        outgoing.put(None)  # half-close: the learner learns from what it got
        try:
            for _ in responses:  # wait for the learner to close its side
                pass
        except grpc.RpcError:
            pass


def run_client(
    settings: PolyEnvSettings,
    process_index: int,
    client_index: int,
    stop: threading.Event,
    failures: list[str],
    incarnation: int = 0,
) -> None:
    """Dials the learner and keeps an environment connected to it until ``stop``.

    Its envs' seeds follow from ``--seed`` and its place among the ``--num_servers``
    processes of ``--clients_per_process`` clients, so a seeded run can be reproduced."""
    try:
        channel = network.create_channel(settings.network, settings.connect)
    except network.NetworkError as error:  # e.g. an unreadable --tls_ca: one line, exit 1
        failures.append(str(error))
        stop.set()
        return
    stub = pb_grpc.LearnerStub(channel)
    backoff = 0.1
    for session in itertools.count(incarnation * STREAMS_PER_INCARNATION):
        if stop.is_set():
            break
        client_id = f"{socket.gethostname()}:{os.getpid()}:{client_index}#{session}"
        client = process_index * settings.clients_per_process + client_index
        worker = session * settings.network.num_servers * settings.clients_per_process + client
        seed = envs.worker_seed(settings.env.seed, worker, settings.envs_per_stream)
        try:
            connect_once(settings, stub, client_id, seed, stop)
            backoff = 0.1
            if settings.client_steps:
                break  # a short-lived client: its one session is over
        except Exception as error:  # e.g. the environment failed: one line, and stop
            if not isinstance(error, grpc.RpcError):
                log.exception("Env client %s failed.", client_id)
                what = f"{codec.ENV_FAILED}{error}" if isinstance(error, EnvFailed) else repr(error)
                failures.append(f"env client {client_id}: {what}")
                stop.set()
                break
            if error.code() in FATAL_CODES:
                failures.append(
                    f"the learner at {settings.connect} refused {client_id}: "
                    f"{error.code().name}: {shown(error.details())}"
                )
                stop.set()
                break
            if backoff == 0.1:
                details = error.details()  # e.g. its --max_clients reached
                log.info(
                    "Learner at %s unavailable (%s%s); retrying.",
                    settings.connect,
                    error.code().name,
                    f": {shown(details, quote=False)}" if details else "",
                )
            stop.wait(backoff)
            backoff = min(2 * backoff, MAX_BACKOFF_S)
    channel.close()


def run_clients(
    settings: PolyEnvSettings, process_index: int = 0, incarnation: int = 0
) -> str | None:
    """``clients_per_process`` env clients in this process, each on its own thread, until
    a signal; the first one's failure, if one failed (which stops the others)."""
    stop = _stop_on_signals()
    failures: list[str] = []
    threads = [
        threading.Thread(
            target=run_client,
            args=(settings, process_index, i, stop, failures, incarnation),
            daemon=True,
        )
        for i in range(settings.clients_per_process)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
    return failures[0] if failures else None


# --------------------------------------------------------------------------- processes


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    said: list[int] = []

    def handler(signum: int, frame: object) -> None:
        # Only the first sets it: a later one may come while the first holds the Event's
        # lock, and setting it again there would wait on that lock for ever.
        if not said:
            said.append(signum)
            stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return stop


def process_main(
    settings: PolyEnvSettings,
    index: int,
    log_level: int = logging.INFO,
    failures: SimpleQueue | None = None,
    incarnation: int = 0,
) -> None:
    """One env process: started by :func:`start_processes`, through ``guarded_main``.
    Its error line goes to stderr, and to ``failures`` where the command that started it
    says it (``polybeast``: then all it writes goes to stdout, gRPC's own lines too,
    stderr being the run's one error line's)."""
    if failures is not None:
        sys.stderr.flush()
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    logging.basicConfig(
        format="[%(levelname)s:%(process)d %(asctime)s] %(message)s", level=log_level
    )
    try:
        if settings.connect:
            failure = run_clients(settings, index, incarnation)
        else:
            address = settings.network.server_addresses()[index]
            serve(settings, address, index, incarnation=incarnation)
            failure = None
    except network.NetworkError as error:
        failure = str(error)
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        if failures is not None:
            failures.put(failure)
        sys.exit(1)


def start_processes(
    settings: PolyEnvSettings, log_level: int = logging.INFO, failures: SimpleQueue | None = None
) -> list[mp.process.BaseProcess]:
    """Starts ``num_servers`` env server (or, with ``--connect``, env client) processes;
    their log lines below ``log_level`` are not shown (``polybeast --suppress_logs``);
    ``failures``: see :func:`process_main`."""
    envs.env_spec(settings.env)  # a bad --env is one error line here, not one per process
    count = (
        settings.network.num_servers
        if settings.connect
        else len(settings.network.server_addresses())
    )
    return [start_process(settings, index, log_level, failures) for index in range(count)]


def process_context() -> mp.context.BaseContext:
    """Where env processes start: forked from one server that has this module (gRPC,
    gymnasium, the env families) imported, started by the first call; a spawned process
    spent ~0.7 s of CPU importing them. The server is this process forked where torch is
    not loaded here (``polybeast_env``), else a new interpreter (the ``polybeast``
    command's learner): env processes never load torch."""
    return forked_children([__name__, "torchbeast.envs"], fork_here="torch" not in sys.modules)


def start_process(
    settings: PolyEnvSettings,
    index: int,
    log_level: int = logging.INFO,
    failures: SimpleQueue | None = None,
    incarnation: int = 0,
) -> mp.process.BaseProcess:
    """Starts env process ``index`` of :func:`start_processes`, or (``incarnation`` > 0)
    its replacement."""
    entry = f"{__name__}:process_main"  # imported by the child once it dies with this one
    process = process_context().Process(
        target=guarded_main,
        args=(os.getpid(), entry, settings, index, log_level, failures, incarnation),
        name=f"env-{index}",
        daemon=True,
    )
    process.start()
    return process


def stop_processes(processes: list[mp.process.BaseProcess], timeout_s: float = 5.0) -> None:
    """SIGTERM to each env process, and SIGKILL to those still alive after ``timeout_s``."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    join_or_kill(processes, timeout_s)


def run_processes(settings: PolyEnvSettings) -> int:
    """polybeast_env: runs the processes until a signal, or until one of them fails; one
    a signal kills (the OOM killer) is replaced within the budget of a dead actor's."""
    logging.basicConfig(format="[%(levelname)s:%(process)d %(asctime)s] %(message)s")
    processes = start_processes(settings)
    reward = envs.reward_description(settings.env)
    if reward is not None:
        log.warning(
            "Reward: %s. Give the learner the same reward flags, or no --env: told --env "
            "without them, it refuses environments whose per-episode figures differ.",
            reward,
        )
    stop = _stop_on_signals()
    replacements = Replacements(processes, functools.partial(start_process, settings))
    try:
        while not stop.is_set() and any(p.is_alive() for p in processes):
            stop.wait(0.2)
            if failure := replacements.replace_killed(stop):
                raise EnvProcessKilled(failure)
            if stop.is_set():  # a signal to the whole group: they stop with it
                break
            if any(process.exitcode not in (None, 0) for process in processes):
                return 1  # its own error line is above (killed ones were replaced)
    finally:
        stop_processes(processes)
    return 0


class EnvProcessKilled(UserError, RuntimeError):
    """Env processes that signals (the OOM killer, a user's kill) keep ending."""


class Replacements:
    """Replaces the env processes a signal kills (the OOM killer), as a dead actor is, within
    the same budget; one that exits with its own error is not replaced. ``processes`` is
    changed in place, so that whoever stops them stops the replacements."""

    def __init__(self, processes: list, start: Callable[..., mp.process.BaseProcess]):
        """``start(index, incarnation=n)`` starts process ``index``'s n-th replacement."""
        self.processes = processes
        self.start = start
        self.budget = RestartBudget(len(processes))
        self.incarnations = [0] * len(processes)

    def replace_killed(self, stopping: threading.Event) -> str | None:
        """Starts a new process in place of each one a signal killed; the line that stops
        the run once they keep dying, else None. None replaced once ``stopping`` is set: a
        signal to the whole process group stops them with it."""
        for index, process in enumerate(self.processes):
            if stopping.is_set():
                return None
            if process.exitcode is None or process.exitcode >= 0:
                continue
            killed = killed_text(index, process)
            if not self.budget.record_death():
                return (
                    f"env processes keep dying: {self.budget.deaths_text()} (last: {killed}); "
                    "check memory (e.g. fewer --num_servers)"
                )
            log.warning("%s; starting a new one.", killed)
            self.incarnations[index] += 1
            self.processes[index] = self.start(index, incarnation=self.incarnations[index])
        return None


def killed_text(index: int, process: mp.process.BaseProcess) -> str:
    """ "Env process 0 (pid 123) was killed by SIGKILL (out of memory?)"."""
    name = signal_name(-process.exitcode)
    why = " (out of memory?)" if name == "SIGKILL" else ""
    return f"Env process {index} (pid {process.pid}) was killed by {name}{why}"

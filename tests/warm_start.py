"""``python -m MODULE ARGS`` for the tests, without paying for the imports each time.

A command of this project spends some 3 s of CPU importing torch (and ``torch._dynamo``,
which ``torch.optim`` imports as the optimizer is built) before it does anything, and the
suite runs a few hundred of them. So each pytest worker starts one server (this module run
as a script) that imports those once. For each command the server forks a child, which
takes the command's argument list, working folder, environment and standard streams, and
then runs the module as ``python -m`` does (``runpy``), ending as the command ends: its exit
status, output, files and children are the command's own.

What differs from a cold start: the modules the server imported are not imported again,
every child shares the server's hash seed, and a child's command line in /proc is the
server's. The server refuses to start if its imports print anything, which a cold start
would print to the command's own stderr. Tests of what a command imports, and tests that
signal a run or look at its processes while it runs, start real processes.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a MonoBeast run imports that costs time: torch's optimizer brings torch._dynamo.
PRELOAD = (
    "torch._dynamo",
    "torch.optim",
    "gymnasium",
    "ale_py",
    "torchbeast.cli",
    "torchbeast.core.learner",
    "torchbeast.envs.atari",
    "torchbeast.envs.minatar",
    "torchbeast.runtime.mono",
    "torchbeast.runtime.training",
)
READY = "ready"
MESSAGE_BYTES = 1 << 20


def run(
    command: list[str], *, timeout: float, env: dict | None = None, cwd: str = REPO
) -> subprocess.CompletedProcess:
    """What ``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`` gives. A ``python -m`` command in this process's environment is run
    by a child of this worker's warm server (a new server where this environment has
    changed); one given another environment than the server's starts cold, since imports
    read it (``PYTHONPATH``, the thread pools' variables)."""
    request = _warm_request(command, env, cwd)
    if request is None:
        return subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
    try:
        connection, pid = _ask(request, [0, out_write, err_write])
    finally:
        os.close(out_write)
        os.close(err_write)
    with connection:
        try:
            status, out, err = _communicate(connection, out_read, err_read, timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(command, timeout) from None
    return subprocess.CompletedProcess(
        command, os.waitstatus_to_exitcode(status), _text(out), _text(err)
    )


def start(
    command: list[str], *, stdout: int, env: dict | None = None, cwd: str = REPO
) -> subprocess.Popen | Started:
    """What ``subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=STDOUT,
    stdin=DEVNULL, start_new_session=True)`` starts, warm on the terms of ``run``: a
    process in a session and process group of its own, whose group a test may signal as
    soon as this returns. ``polybeast_env`` always starts cold: with torch loaded, as a
    warm child has it, it starts its env processes from a new interpreter, where a user's
    command forks them from itself."""
    request = _warm_request(command, env, cwd)
    if request is None or request["module"] == "torchbeast.polybeast_env":
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    with open(os.devnull) as nothing:
        connection, pid = _ask({**request, "session": True}, [nothing.fileno(), stdout, stdout])
    return Started(command, connection, pid)


class Started:
    """A command that a warm server's child runs, as ``subprocess.Popen`` gives it: its
    ``pid`` (that of its session and group), ``poll``, ``wait`` and signals. It is the
    server's child, not this process's, so its exit status comes from the server."""

    def __init__(self, args: list[str], connection: socket.socket, pid: int):
        self.args, self.pid, self.returncode = args, pid, None
        self._connection = connection

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._take_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._take_status()
        return self.returncode

    def _take_status(self) -> None:
        said = self._connection.recv(MESSAGE_BYTES)
        self._connection.close()
        if not said:
            raise RuntimeError("the warm server went away during the command")
        self.returncode = os.waitstatus_to_exitcode(json.loads(said)["status"])

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _warm_request(command: list[str], env: dict | None, cwd: str) -> dict | None:
    """The request for a warm server, or None where ``command`` must start cold: it is
    no ``python -m``, or its environment is not this process's nor the server's."""
    own = env is None
    env = dict(os.environ if own else env)
    if command[:2] != [sys.executable, "-m"] or not (own or _outside_pytest(env) == _server_env()):
        return None
    return {"module": command[2], "args": list(command[3:]), "cwd": cwd, "env": env}


def _ask(request: dict, streams: list[int]) -> tuple[socket.socket, int]:
    """Sends ``request`` with the child's standard streams; the connection on which the
    server will report the child's exit status, and the child's pid, which the child
    sends once it is in its own session where the request asks for one."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(_server_address(request["env"]))
        socket.send_fds(connection, [json.dumps(request).encode()], streams)
        said = connection.recv(MESSAGE_BYTES)
        if not said:
            raise RuntimeError("the warm server went away as it started the command")
        return connection, json.loads(said)["pid"]
    except BaseException:
        connection.close()
        raise


def _outside_pytest(env: dict) -> dict:
    """``env`` without the variables pytest sets and changes for each test."""
    return {key: value for key, value in env.items() if not key.startswith("PYTEST_")}


def _communicate(connection: socket.socket, out: int, err: int, timeout: float):
    """Reads both streams to their end (as ``communicate`` does: a child left holding one
    keeps the command from ending) and the exit status the server reports."""
    chunks: dict[int, list[bytes]] = {out: [], err: []}
    open_streams, status = {out, err}, None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for source in (out, err, connection):
            selector.register(source, selectors.EVENT_READ)
        while open_streams or status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                for stream in open_streams:
                    os.close(stream)
                raise subprocess.TimeoutExpired("", timeout)
            for key, _ in selector.select(left):
                if key.fileobj is connection:
                    said = connection.recv(MESSAGE_BYTES)
                    if not said:
                        raise RuntimeError("the warm server went away during the command")
                    status = json.loads(said)["status"]
                    selector.unregister(connection)
                    continue
                data = os.read(key.fd, 1 << 16)
                chunks[key.fd].append(data)
                if not data:
                    selector.unregister(key.fd)
                    open_streams.remove(key.fd)
                    os.close(key.fd)
    return status, b"".join(chunks[out]), b"".join(chunks[err])


def _text(data: bytes) -> str:
    """As ``text=True`` decodes: the locale's encoding, universal newlines."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


class Server:
    """A warm server started by this worker: its process, the folder of its socket, and the
    environment it imported under (pytest's variables aside)."""

    def __init__(self, env: dict):
        self.env = _outside_pytest(env)
        self.folder = tempfile.mkdtemp(prefix="warm", dir="/tmp")
        self.address = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_start", self.address],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        atexit.register(self.stop)
        said = self.process.stdout.readline().strip()
        if said != READY:
            self.stop()
            raise RuntimeError(f"the warm server printed as it imported: {said!r}")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_server: Server | None = None


def _server_env() -> dict | None:
    return _server.env if _server is not None else None


def _server_address(env: dict) -> str:
    """The socket of this worker's server that imported under ``env``: a new server where
    there is none alive, or where it imported under another environment (this worker's
    own changed: a module it imported set a variable, or a test did)."""
    global _server
    if _server is not None and (
        _server.process.poll() is not None or _server.env != _outside_pytest(env)
    ):
        _server.stop()
        _server = None
    if _server is None:
        _server = Server(env)
    return _server.address


def serve(address: str) -> tuple[dict, list[int]] | None:
    """Forks a child for each request on ``address`` and reports its exit status; returns
    the request and its streams in the child, None in the server once its parent is gone."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(8)
    print(READY, flush=True)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        if select.select([listener], [], [], 0.05)[0]:
            connection, _ = listener.accept()
            message, streams, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 3)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in children.values():
                    other.close()
                request = json.loads(message)
                if request.get("session"):
                    os.setsid()  # before the pid is told: the test may signal its group
                connection.send(json.dumps({"pid": os.getpid()}).encode())
                connection.close()
                return request, streams
            for stream in streams:
                os.close(stream)
            children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            try:
                connection.send(json.dumps({"status": status}).encode())
            except OSError:  # the test that asked has gone
                pass
            connection.close()
    return None


def become(request: dict, streams: list[int]) -> None:
    """This child takes the command's streams, folder, environment and argument list."""
    for target, stream in enumerate(streams):
        os.dup2(stream, target)
        os.close(stream)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]
    sys.argv = ["-m", *request["args"]]
    sys.modules.pop(request["module"], None)  # runpy warns of a module run twice
    if "numpy" in sys.modules:  # Python's own generator is reseeded at a fork; numpy's not
        sys.modules["numpy"].random.seed()


def main() -> None:
    import importlib
    import runpy

    for name in PRELOAD:
        importlib.import_module(name)
    work = serve(sys.argv[1])
    if work is None:
        return
    request, streams = work
    become(request, streams)
    runpy._run_module_as_main(request["module"])


if __name__ == "__main__":
    main()

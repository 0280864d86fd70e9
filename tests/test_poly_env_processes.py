"""PolyBeast's env processes die with the process that started them and never import torch.

Real processes, real signals: an entry point is started with a marker in its environment,
which every process it starts inherits (also once they are orphans, reparented to PID 1),
then killed with SIGKILL while its env processes start; none of them may be left running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import spawn
from tests.test_monobeast import read_rows, wait_for_rows
from tests.test_polybeast import ENV, LEARNER, REPO, wait_for

MARKER = "TORCHBEAST_TEST_PROCESS_TREE"


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours
        if f"{MARKER}={marker}".encode() in environ and state != "Z":
            found.append(int(entry))
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def env_processes(marker: str) -> list[int]:
    """The processes the entry point's fork server started: the marked processes whose
    parent and grandparent are marked (not the entry point, nor what it started itself:
    the server, the resource tracker)."""
    pids = set(marked_processes(marker))
    return [pid for pid in pids if parent_of(pid) in pids and parent_of(parent_of(pid)) in pids]


def wait_for_env_processes(marker: str, count: int, timeout: float = 60) -> None:
    """Returns as soon as ``count`` env processes exist: they are still starting up then."""
    deadline = time.monotonic() + timeout
    while len(env_processes(marker)) < count:
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the env processes to start")
        time.sleep(0.005)


def survivors(marker: str, timeout: float = 10) -> list[str]:
    """What is still running ``timeout`` seconds from now (or nothing, as soon as it is so)."""
    deadline = time.monotonic() + timeout
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{pid}: {command_line(pid)}" for pid in pids]


def sigkill(process: subprocess.Popen) -> None:
    """SIGKILL for the entry point alone, not its process group: no chance to clean up."""
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def start_marked(tmp_path):
    """Starts a module with a fresh marker in its own process group; at the end, kills
    what is left of the group (orphans keep their dead parent's group)."""
    started: list[subprocess.Popen] = []

    def start(module: str, *args: str) -> tuple[subprocess.Popen, str]:
        marker = uuid.uuid4().hex
        process = spawn(module, *args, log=tmp_path / f"{module}.log", env={MARKER: marker})
        started.append(process)
        return process, marker

    yield start
    for process in started:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def polybeast_env_args(mode: str, sockets: str) -> list[str]:
    if mode == "connect":  # nothing listens there: the clients would redial forever
        return [*ENV, "--connect", f"unix:{sockets}/learner", "--num_servers", "2"]
    return [*ENV, "--pipes_basename", f"unix:{sockets}/env", "--num_servers", "2"]


# Killed 0 or 0.1 s after its env processes started, the parent may die before they can
# ask to die with it; 0.5 s later they are importing their modules.
@pytest.mark.parametrize(
    ("mode", "after_s"), [("connect", 0.0), ("connect", 0.1), ("connect", 0.5), ("serve", 0.5)]
)
def test_env_processes_die_when_polybeast_env_is_killed_while_they_start(
    start_marked, sockets, mode, after_s
):
    process, marker = start_marked("torchbeast.polybeast_env", *polybeast_env_args(mode, sockets))
    wait_for_env_processes(marker, 2)
    time.sleep(after_s)
    sigkill(process)
    assert survivors(marker) == []


@pytest.mark.parametrize("delay_s", [0.0, 0.5, 1.0])
def test_env_processes_die_when_polybeast_env_is_killed_in_its_first_second(
    start_marked, sockets, delay_s
):
    process, marker = start_marked(
        "torchbeast.polybeast_env", *polybeast_env_args("connect", sockets)
    )
    time.sleep(delay_s)
    sigkill(process)
    assert survivors(marker) == []


def test_env_processes_die_when_polybeast_is_killed_while_they_start(
    start_marked, sockets, tmp_path
):
    process, marker = start_marked(
        "torchbeast.polybeast", *LEARNER, "--num_servers", "2",
        "--pipes_basename", f"unix:{sockets}/env", "--savedir", str(tmp_path),
    )  # fmt: skip
    wait_for_env_processes(marker, 2)
    time.sleep(0.5)
    sigkill(process)
    assert survivors(marker) == []


@pytest.mark.parametrize(
    "module", ["torchbeast.polybeast_env", "torchbeast.polybeast", "torchbeast.runtime.processes"]
)
def test_what_a_spawned_env_process_imports_first_imports_no_torch(module):
    # Spawn re-imports the entry point (__main__), then imports guarded_main's module.
    code = f"import sys, {module}; print([m for m in sys.modules if m.split('.')[0] == 'torch'])"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_running_env_processes_have_no_torch_loaded(start_marked, sockets, tmp_path):
    process, marker = start_marked(
        "torchbeast.polybeast_env", *polybeast_env_args("connect", sockets)
    )
    log = tmp_path / "torchbeast.polybeast_env.log"
    # A client says so once its environment exists and its first dial failed.
    wait_for(lambda: log.read_text().count("retrying") == 2, 60, "both clients to dial")
    pids = marked_processes(marker)
    assert len(env_processes(marker)) == 2
    for pid in pids:
        assert not torch_loaded(pid), f"{command_line(pid)} has torch loaded"
    assert process.poll() is None


def torch_loaded(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("/torch/" in line for line in f)


def start_training_polybeast(start_marked, sockets, tmp_path, num_servers: int):
    """``polybeast`` with ``num_servers`` env servers, once it trains; and its marker."""
    process, marker = start_marked(
        "torchbeast.polybeast", *LEARNER, "--num_servers", str(num_servers),
        "--num_actors", str(num_servers), "--pipes_basename", f"unix:{sockets}/env",
        "--savedir", str(tmp_path), "--xpid", "run", "--total_steps", "100000000",
    )  # fmt: skip
    log = tmp_path / "torchbeast.polybeast.log"
    wait_for(lambda: "Steps" in log.read_text(), 60, "training to start")
    return process, marker


def test_the_env_processes_of_polybeast_start_from_a_server_without_torch(
    start_marked, sockets, tmp_path
):
    # Its learner has torch loaded: a server forked from it would give them torch too.
    process, marker = start_training_polybeast(start_marked, sockets, tmp_path, 2)
    started = env_processes(marker)
    assert len(started) == 2
    for pid in [*started, parent_of(started[0])]:  # and their server
        assert not torch_loaded(pid), f"{command_line(pid)} has torch loaded"
    assert process.poll() is None


def test_polybeast_env_replaces_an_env_process_killed_by_a_signal(start_marked, sockets, tmp_path):
    # polybeast_env stopped its other processes and exited 1 without a word.
    process, marker = start_marked(
        "torchbeast.polybeast_env", *polybeast_env_args("connect", sockets)
    )
    log = tmp_path / "torchbeast.polybeast_env.log"
    wait_for(lambda: log.read_text().count("retrying") == 2, 60, "both clients to dial")
    victim = env_processes(marker)[0]
    os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer does
    try:
        wait_for(lambda: "starting a new one" in log.read_text(), 30, "the replacement")
    except AssertionError as error:  # seen once under load, with no log to read
        raise AssertionError(
            f"{error} of {command_line(victim)!r}; log:\n{log.read_text()}"
        ) from None
    assert re.search(
        rf"Env process [01] \(pid {victim}\) was killed by SIGKILL \(out of memory\?\); "
        r"starting a new one\.",
        log.read_text(),
    )
    wait_for(lambda: log.read_text().count("retrying") >= 3, 60, "the new client to dial")
    assert process.poll() is None and len(env_processes(marker)) == 2


def test_polybeast_replaces_an_env_process_killed_by_a_signal_and_trains_on(
    start_marked, sockets, tmp_path
):
    # It went on with fewer envs (with none, it stopped, pointing at errors "in the output
    # above" that no process wrote).
    process, marker = start_training_polybeast(start_marked, sockets, tmp_path, 1)
    log = tmp_path / "torchbeast.polybeast.log"
    (killed,) = env_processes(marker)
    os.kill(killed, signal.SIGKILL)  # as the kernel's OOM killer does
    wait_for(lambda: "starting a new one" in log.read_text(), 30, "the replacement")
    assert f"Env process 0 (pid {killed}) was killed by SIGKILL (out of memory?); starting" in (
        log.read_text()
    )
    rows = len(read_rows(tmp_path / "run" / "logs.csv"))
    wait_for_rows(tmp_path / "run" / "logs.csv", rows + 20)  # its streams dialled again
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    assert survivors(marker) == []

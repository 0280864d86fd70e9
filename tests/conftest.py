"""Fixtures shared by the PolyBeast tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from tests import warm_start

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A suite started in the background by a non-interactive shell (`nohup make test &`)
# inherits SIGINT ignored, and so would every run it starts: the tests of Ctrl-C would see
# runs that cannot be interrupted. Python's own handler here gives children the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def uses_ray(item: pytest.Item) -> bool:
    node = item.nodeid.lower()
    return (
        "raybeast" in node or "[ray]" in node or "ray_cluster" in getattr(item, "fixturenames", ())
    )


# Module-scoped fixtures that train or serve a run: the tests that use one go to one
# pytest-xdist worker (``--dist loadgroup``), so that it is made once, not once a worker.
SHARED_RUNS = ("trained_run", "cartpole_training", "pong_learner")


def pytest_collection_modifyitems(config, items):
    """Marks the tests that start Ray (``-m ray``): ``make test`` runs them one after
    another once the others have run in parallel workers, since some check that no Ray
    daemon outlives a run, and Ray's daemons miss their deadlines on a loaded machine.
    Groups the tests of each shared run on one worker."""
    for item in items:
        if uses_ray(item):
            item.add_marker(pytest.mark.ray)
        for name in SHARED_RUNS:
            if name in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(name))


@pytest.fixture
def sockets():
    """A short folder for Unix sockets (their paths are limited to ~100 characters)."""
    folder = tempfile.mkdtemp(prefix="pb", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def spawn(
    module: str, *args: str, log, env: dict | None = None
) -> subprocess.Popen | warm_start.Started:
    """``python -m module args`` in its own session and process group, output to ``log``;
    warm where ``warm_start.start`` can (``env`` adds to this process's environment)."""
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return warm_start.start(
            [sys.executable, "-m", module, *args],
            stdout=out.fileno(),
            env=None if env is None else {**os.environ, **env},
        )


def kill_groups(started: list[subprocess.Popen]) -> None:
    """Kills what is left of each process's group."""
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def processes():
    """Starts modules in their own process groups; kills what is left at the end."""
    started: list[subprocess.Popen] = []

    def start(module: str, *args: str, log: str, env: dict | None = None) -> subprocess.Popen:
        started.append(spawn(module, *args, log=log, env=env))
        return started[-1]

    yield start
    kill_groups(started)

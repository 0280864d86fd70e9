"""The supervision every runtime shares: restart budget, one-line failures, signal-masked
starts and deadline stops, on real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

from tests.test_monobeast import alive
from torchbeast.runtime.supervision import (
    RestartBudget,
    Supervised,
    join_or_kill,
    last_line,
    python_children_ignore,
    signals_blocked,
)


def test_restart_budget_allows_three_deaths_per_actor_per_minute():
    budget = RestartBudget(num_actors=2)
    assert all(budget.record_death() for _ in range(6))
    assert not budget.record_death()
    assert budget.deaths_text() == "7 in the last minute"


def test_restart_budget_forgets_deaths_older_than_a_minute(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    budget = RestartBudget(num_actors=1)
    assert all(budget.record_death() for _ in range(3))
    now[0] += 61
    assert budget.record_death()


def test_last_line_of_a_traceback_and_of_an_empty_error():
    assert last_line("Traceback:\n  File x\nValueError: bad env\n") == "ValueError: bad env"
    assert last_line(KeyError()) == "KeyError"


def test_the_first_failure_is_the_one_reported():
    pool = Supervised()
    pool.fail("actor 1 failed: boom")
    pool.fail("actors keep dying")
    assert pool.stopping.is_set()
    assert pool.error == "actor 1 failed: boom"


def sleep_through_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def test_join_or_kill_kills_what_outlives_the_deadline():
    context = mp.get_context("spawn")
    quick = context.Process(target=time.sleep, args=(0.1,))
    stubborn = context.Process(target=sleep_through_sigterm)
    quick.start()
    stubborn.start()
    started = time.monotonic()
    join_or_kill([quick, stubborn], timeout_s=2.0)
    assert time.monotonic() - started < 10
    assert quick.exitcode == 0
    assert stubborn.exitcode == -signal.SIGKILL


def report_blocked_signals(queue) -> None:
    queue.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, set())))


def test_a_child_started_with_stop_signals_blocked_inherits_the_mask():
    # Spawn, as the runtimes start their children: the mask survives the exec.
    context = mp.get_context("spawn")
    queue = context.Queue()
    with signals_blocked():
        child = context.Process(target=report_blocked_signals, args=(queue,))
        child.start()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert {signal.SIGINT, signal.SIGTERM} <= set(queue.get(timeout=60))
    child.join(30)


def test_a_stop_signal_waiting_as_children_start_ignoring_it_still_comes():
    # Setting SIG_IGN discards a signal that waits: a SIGTERM sent as a run started its
    # fork server was lost, and the run went on.
    caught = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: caught.append(number))
    try:
        with signals_blocked({signal.SIGTERM}):  # as if it came as the block began
            # To this thread: another one (of an earlier test) might take the process's.
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            with python_children_ignore((signal.SIGTERM,)):
                assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
                assert caught == []
        assert caught == [signal.SIGTERM]  # once, with its handler back
    finally:
        signal.signal(signal.SIGTERM, previous)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_SERVER_OF = """
import os, sys, threading, time
from torchbeast.runtime.supervision import forked_children


def parent_of(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def cmdline(pid):
    return open(f"/proc/{pid}/cmdline").read()


if __name__ == "__main__":  # the spawned server runs this file again
    how = sys.argv[1]
    if how == "beside a thread":
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    context = forked_children([], fork_here=how != "not allowed")
    queue = context.Queue()
    child = context.Process(target=queue.put, args=("started",))
    child.start()
    print(queue.get(timeout=60))
    child.join(timeout=60)
    children = [p for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == os.getpid()]
    (server,) = [p for p in children if "resource_tracker" not in cmdline(p)]
    forked = cmdline(server) == cmdline("self")
    print("forked" if forked else "spawned")
"""


def test_the_fork_server_is_this_process_forked_only_where_that_is_safe_and_allowed(tmp_path):
    # Forking a process that runs another Python thread may copy a lock that thread holds
    # (the import lock, a handler's), and no child forked from a process that started
    # CUDA's driver can use CUDA.
    script = tmp_path / "fork_server_of.py"
    script.write_text(FORK_SERVER_OF)
    for how, server in [("alone", "forked"), ("beside a thread", "spawned"),
                        ("not allowed", "spawned")]:  # fmt: skip
        result = subprocess.run(
            [sys.executable, str(script), how],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["started", server], how


# A fork server's child that waits forever without a word to its starter (as an actor
# waited for weights its learner was killed in the middle of writing); the starter prints
# the child's pid, then waits to be killed.
WAITS_FOREVER = """
import sys, time
from torchbeast.runtime.processes import die_with_parent
from torchbeast.runtime.supervision import forked_children


def wait_forever():
    die_with_parent()
    while True:
        time.sleep(0.001)


if __name__ == "__main__":
    child = forked_children([]).Process(target=wait_forever, daemon=True)
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)
"""


def test_a_fork_servers_child_dies_with_the_process_that_started_it(tmp_path):
    script = tmp_path / "waits_forever.py"
    script.write_text(WAITS_FOREVER)
    starter = subprocess.Popen(
        [sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = int(starter.stdout.readline())
        time.sleep(1)  # its guard is in place
        starter.kill()  # as the kernel's OOM killer does
        starter.wait(timeout=30)
        deadline = time.monotonic() + 20
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the child outlived the process that started it"
    finally:
        starter.kill()
        starter.stdout.close()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)

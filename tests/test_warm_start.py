"""The suite's warm starter (tests/warm_start.py) runs a command as a new process would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import warm_start
from tests.test_monobeast import children_of, wait_for

REPORT = [sys.executable, "-m", "tests.process_report"]


def report(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout)


def test_a_warm_started_command_is_a_main_module_of_its_own_with_its_exit_code():
    first, second = (warm_start.run([*REPORT, "3"], timeout=60) for _ in range(2))
    assert first.returncode == second.returncode == 3
    assert first.stderr == "to stderr\n"
    seen = report(first)
    assert seen["name"] == "__main__"
    assert seen["argv"] == [os.path.join(warm_start.REPO, "tests", "process_report.py"), "3"]
    assert seen["cwd"] == seen["path0"] == warm_start.REPO
    assert seen["parent"] != os.getpid()  # the warm server's child
    assert seen["draw"] != report(second)["draw"]  # numpy's generator is not the server's


def test_a_warm_started_command_says_what_a_cold_one_says():
    for args in (["--help"], ["--env", "Nope-v0"], ["--num_actors", "-3"]):
        command = [sys.executable, "-m", "torchbeast.monobeast", *args]
        cold = subprocess.run(
            command, cwd=warm_start.REPO, capture_output=True, text=True, timeout=60
        )
        warm = warm_start.run(command, timeout=60)
        assert (warm.returncode, warm.stdout, warm.stderr) == (
            cold.returncode,
            cold.stdout,
            cold.stderr,
        )


def test_another_environment_is_a_new_process_since_imports_read_it():
    result = warm_start.run(REPORT, timeout=60, env={**os.environ, "WARM_START_TEST": "1"})
    assert result.returncode == 0
    assert report(result)["variable"] == "1"
    assert report(result)["parent"] == os.getpid()


def test_a_command_past_its_timeout_is_killed_and_the_server_serves_on():
    server = report(warm_start.run(REPORT, timeout=60))["parent"]
    serving = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"]
    with pytest.raises(subprocess.TimeoutExpired):
        warm_start.run(serving, timeout=2)
    wait_for(lambda: not children_of(server), 10, "the command killed")
    again = warm_start.run(REPORT, timeout=60)
    assert again.returncode == 0 and report(again)["parent"] == server


def test_a_started_command_leads_its_own_session_and_its_exit_status_comes_back(tmp_path):
    with open(tmp_path / "out", "w") as out:
        process = warm_start.start([*REPORT, "4"], stdout=out.fileno())
    assert isinstance(process, warm_start.Started)  # warm, as the spawned runs are
    assert process.wait(timeout=60) == 4 and process.poll() == 4
    output = (tmp_path / "out").read_text()
    seen = json.loads(output.splitlines()[0])
    assert seen["group"] == seen["session"] == process.pid != os.getpgid(0)
    assert seen["parent"] != os.getpid()
    assert "to stderr" in output  # both streams to the one file


def test_a_started_commands_group_takes_a_signal_as_soon_as_it_is_started(tmp_path):
    serving = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"]
    with open(tmp_path / "out", "w") as out:
        process = warm_start.start(serving, stdout=out.fileno())
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.5)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert process.poll() == -signal.SIGTERM

"""A Ctrl-C while a command starts (its imports, its flags) ends it at once in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from torchbeast.entry import interrupt_quits, quit_now, work_begins


@pytest.mark.parametrize(
    "command, importing",
    [
        # Its flags import torch (is there a GPU?): Ctrl-C in the middle of that import
        # was a traceback, or a segmentation fault from torch's half-loaded extension.
        (["torchbeast.monobeast", "--env", "CartPole-v1", "--xpid", "r"], "torch."),
        (["torchbeast.polybeast_env", "--env", "CartPole-v1", "--num_servers", "1"], "grpc"),
    ],
    ids=["monobeast-importing-torch", "polybeast_env-importing-grpc"],
)
def test_ctrl_c_while_a_command_imports_is_one_line_and_leaves_nothing(
    tmp_path, sockets, command, importing
):
    command += ["--savedir", str(tmp_path)] if "monobeast" in command[0] else []
    command += ["--pipes_basename", f"unix:{sockets}/env"] if "env" in command[0] else []
    # -X importtime: a line on stderr as each module is imported, so the test knows it is
    # in the middle of the imports.
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", *command],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if importing in line:
                os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C sends it, to the group
                break
        lines += process.stderr.readlines()
        process.wait(timeout=60)
    finally:
        process.kill()
        process.stderr.close()
    stderr = "".join(lines)
    assert any(importing in line for line in lines[:-1]), stderr
    assert process.returncode == 130, stderr[-2000:]
    assert lines[-1] == "interrupted\n"
    assert "Traceback" not in stderr
    assert os.listdir(tmp_path) == []  # no run folder was made
    assert os.listdir(sockets) == []  # nor a socket served


def test_ctrl_c_quits_until_the_work_begins_then_raises_again():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupt_quits():
        assert signal.getsignal(signal.SIGINT) is quit_now
        work_begins()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_command_that_ignores_ctrl_c_keeps_ignoring_it():
    # As a command started in the background by a script does (`nohup ... &`).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt_quits():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            work_begins()
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)

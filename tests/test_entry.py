"""A Ctrl-C while a command starts (its imports, its flags) ends it at once in one line."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from torchbeast.entry import (
    TOOLS,
    interrupt_quits,
    quit_now,
    quit_while_a_tool_loads,
    work_begins,
)


def interrupt_while_importing(command: list[str], importing: str) -> tuple[int, list[str]]:
    """Runs ``python -m command`` and sends its group SIGINT, as Ctrl-C does, when it
    imports a module whose name has ``importing``; its exit code and its stderr's lines."""
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
                os.killpg(process.pid, signal.SIGINT)
                break
        lines += process.stderr.readlines()
        process.wait(timeout=60)
    finally:
        process.kill()
        process.stderr.close()
    assert any(importing in line for line in lines[:-1]), "".join(lines)
    return process.returncode, lines


def assert_one_line(returncode: int, lines: list[str]) -> None:
    stderr = "".join(lines)
    assert returncode == 130, stderr[-2000:]
    assert lines[-1] == "interrupted\n"
    assert "Traceback" not in stderr


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
    assert_one_line(*interrupt_while_importing(command, importing))
    assert os.listdir(tmp_path) == []  # no run folder was made
    assert os.listdir(sockets) == []  # nor a socket served


@pytest.mark.parametrize(
    "tool, importing",
    [
        ("bench", "torch."),
        ("scaling", "torch."),
        ("plot", "matplotlib"),
        ("study_plot", "matplotlib"),
        ("learncheck", "numpy"),
        ("study", "numpy"),
        ("lightlog", "numpy"),
    ],
)
def test_ctrl_c_while_a_tool_imports_is_one_line(tool, importing):
    # The tools import torch or matplotlib as their modules load, before any code of theirs.
    assert_one_line(*interrupt_while_importing([f"torchbeast.{tool}", "--help"], importing))


def test_every_tool_is_a_module_that_python_runs():
    # A name in TOOLS that no module has would leave a tool without the guard unnoticed.
    for module in TOOLS:
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("module", sorted(TOOLS))
def test_a_tool_gives_ctrl_c_back_to_its_work_as_it_begins(module, capsys):
    # Where a tool forgot, a Ctrl-C during its work would end it at once, its runs'
    # checkpoints and its table unwritten.
    main = importlib.import_module(module).main
    signal.signal(signal.SIGINT, quit_now)
    try:
        with contextlib.suppress(SystemExit):
            main(["--no_such_flag"])  # its parser refuses it, after the work has begun
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_only_a_tool_that_python_m_is_finding_quits_while_it_loads(monkeypatch):
    def handler_after(argv: list[str], orig_argv: list[str]) -> object:
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "orig_argv", orig_argv)
        try:
            quit_while_a_tool_loads()
            return signal.getsignal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    python = sys.executable
    assert handler_after(["-m"], [python, "-u", "-m", "torchbeast.bench", "-h"]) is quit_now
    # A training entry point guards its own imports, inside its main.
    assert handler_after(["-m"], [python, "-m", "torchbeast.monobeast"]) is not quit_now
    # Once the module is found (argv[0] its path), torchbeast imported by it is a library.
    assert handler_after(["bench.py"], [python, "-m", "torchbeast.bench"]) is not quit_now
    assert handler_after(["-c"], [python, "-c", "import torchbeast"]) is not quit_now


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

"""What the console shows: with --suppress_logs only progress lines and warnings, in every
runtime, from its first line; out.log in the run folder keeps every line."""

from __future__ import annotations

import re
import sys

import pytest

from tests import warm_start
from torchbeast.curves import read_logs

SMALL = ["--env", "CartPole-v1", "--batch_size", "2", "--unroll_length", "20"]
SMALL += ["--total_steps", "400", "--disable_cuda", "--xpid", "run"]


@pytest.mark.parametrize("entry_point", ["monobeast", "polybeast"])
def test_suppress_logs_keeps_the_console_to_progress_lines(tmp_path, sockets, entry_point):
    command = [sys.executable, "-m", f"torchbeast.{entry_point}", *SMALL]
    command += ["--num_actors", "2", "--savedir", str(tmp_path)]
    if entry_point == "polybeast":
        command += ["--num_servers", "2", "--pipes_basename", f"unix:{sockets}/env"]
    quiet = warm_start.run([*command, "--suppress_logs"], timeout=180)
    assert quiet.returncode == 0, quiet.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "Training run on CartPole-v1" in out_log  # the line is written, to the file only
    console = [line for line in quiet.stdout.splitlines() if line.startswith("[")]
    assert all("] Steps " in line or line.startswith("[WARNING") for line in console), console
    assert "[INFO" not in quiet.stderr, quiet.stderr  # nor the env processes' lines
    # A run shorter than the progress interval still ends with a line saying where it got:
    # its last step, once every learner thread is done.
    last = re.search(r"\] Steps (\d+) of 400 \(", console[-1] if console else "")
    final_step = int(read_logs(tmp_path / "run" / "logs.csv")["step"][-1])
    assert last and int(last.group(1)) == final_step >= 400, console
    if entry_point == "polybeast":
        return
    # Without the flag the same line shows.
    loud = warm_start.run([*command, "--savedir", str(tmp_path / "loud")], timeout=180)
    assert loud.returncode == 0, loud.stderr
    assert "Training run on CartPole-v1" in loud.stdout

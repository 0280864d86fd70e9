"""The benchmark command runs each runtime and prints its figures (the figures themselves
are checked by people, never by timed tests)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.test_polybeast import REPO

SMALL = ["--env", "CartPole-v1", "--batch_size", "8", "--unroll_length", "20"]
SMALL += ["--warmup_steps", "500", "--bench_steps", "2000"]


@pytest.mark.parametrize("runtime", ["mono", "poly"])  # ray: tests/test_raybeast.py
def test_bench_prints_sps_and_stage_costs(runtime):
    command = [sys.executable, "-m", "torchbeast.bench", "--runtime", runtime, *SMALL]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    sps = re.search(r"steady-state SPS: ([0-9.]+)\s+\(([0-9]+) steps", result.stdout)
    assert sps is not None, result.stdout
    assert float(sps.group(1)) > 0 and int(sps.group(2)) >= 2000
    # Each stage by name, as the runtime's trainer reports them, then the learner process.
    stages = {"mono": "env ", "poly": "env servers "}[runtime]
    assert re.search(
        rf"CPU ms per agent step: {stages}[0-9.]+.*, learner process [0-9.]+", result.stdout
    )
    layout = {"mono": "2 actors x 8 envs", "poly": "2 streams x 8 envs from 2 env servers"}
    assert layout[runtime] in result.stdout, result.stdout

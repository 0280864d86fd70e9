"""The benchmark command runs each runtime and prints its figures (the figures themselves
are checked by people, never by timed tests)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.test_polybeast import REPO
from torchbeast.bench import epochs_text
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_bench_parser

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


def test_bench_defaults_measure_the_data_path_with_one_step_per_batch():
    # The original's batch shape and one gradient step, so the figure compares with the
    # original's; training's defaults take two steps with PPO's clip.
    flags = parse_flags([], make_bench_parser(["mono"]))
    assert (flags.batch_size, flags.unroll_length, flags.epochs, flags.ppo_clip) == (4, 80, 1, 0)
    assert epochs_text(flags) == "1 epoch"
    recipe = parse_flags(["--epochs", "2", "--ppo_clip", "0.2"], make_bench_parser(["mono"]))
    assert epochs_text(recipe) == "2 epochs, PPO clip 0.2"

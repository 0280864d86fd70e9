"""The benchmark command runs each runtime and prints its figures (the figures themselves
are checked by people, never by timed tests)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.test_polybeast import REPO
from torchbeast.bench import bound_by, epochs_text
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
    busy = re.search(r"learner busy ([0-9]+)% of the time; bound by: (\w+)", result.stdout)
    assert busy is not None, result.stdout
    assert 0 < int(busy.group(1)) <= 100
    assert busy.group(2) in ("learner", "CPU", "actors")


def test_bench_defaults_measure_the_data_path_with_one_step_per_batch():
    # The original's batch shape and one gradient step, so the figure compares with the
    # original's; training's defaults take two steps with PPO's clip.
    flags = parse_flags([], make_bench_parser(["mono"]))
    assert (flags.batch_size, flags.unroll_length, flags.epochs, flags.ppo_clip) == (4, 80, 1, 0)
    assert epochs_text(flags) == "1 epoch"
    recipe = parse_flags(["--epochs", "2", "--ppo_clip", "0.2"], make_bench_parser(["mono"]))
    assert epochs_text(recipe) == "2 epochs, PPO clip 0.2"


def test_bench_writes_its_figures_as_json(tmp_path):
    path = tmp_path / "bench.json"
    command = [sys.executable, "-m", "torchbeast.bench", *SMALL, "--json", str(path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(path.read_text())
    printed = re.search(r"steady-state SPS: ([0-9.]+)", result.stdout)
    assert f"{figures['sps']:.1f}" == printed.group(1)
    assert set(figures["stages"]) == {"env", "inference", "actor other", "learner process"}
    assert figures["layout"] == "2 actors x 8 envs" and figures["device"] == "cpu"
    assert figures["torso_dtype"] == "fp32"  # CartPole's MLP torso: fp32 under --precision auto
    assert figures["gpu_utilization"] is None  # a CPU learner: no GPU figure
    assert figures["bound"] == bound_by(figures)


def figures(sps: float, stages: list[float], learner_busy: float, cores: int = 2) -> dict:
    names = ["env", "inference", "actor other", "learner process"]
    return dict(
        sps=sps,
        stages=dict(zip(names, stages, strict=True)),
        learner_busy=learner_busy,
        cores=cores,
        gpu_utilization=None,
    )


def test_a_learner_busy_all_the_time_bounds_the_run():
    assert bound_by(figures(4000, [0.5, 0.45, 0.1, 0.27], 0.97)) == "learner"
    on_gpu = figures(4000, [0.5, 0.45, 0.1, 0.27], 0.95, cores=16) | {"gpu_utilization": 60.0}
    assert bound_by(on_gpu) == "learner (GPU 60% busy)"


def test_busy_cores_bound_the_run_by_their_largest_stage():
    # 300 SPS x 6 CPU ms per step = 1.8 of 2 cores.
    assert bound_by(figures(300, [0.8, 0.9, 0.2, 4.1], 0.7)) == (
        "CPU (all cores busy; largest stage: learner process)"
    )


def test_idle_cores_and_a_waiting_learner_mean_too_few_actors():
    # 1,000 SPS x 1.3 CPU ms per step = 1.3 of 16 cores.
    assert bound_by(figures(1000, [0.5, 0.45, 0.1, 0.25], 0.3, cores=16)) == (
        "actors (cores idle, learner waiting)"
    )

"""The benchmark command runs each runtime and prints its figures (the figures themselves
are checked by people, never by timed tests)."""

from __future__ import annotations

import json
import re
import sys
import tempfile

import pytest
import torch

from tests import warm_start
from torchbeast.bench import (
    actor_time_shares,
    bound_by,
    central_inference_figures,
    epochs_text,
    in_folder,
    measure_sampling,
)
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_bench_parser
from torchbeast.config.settings import build_settings
from torchbeast.runtime.registry import RUNTIMES

SMALL = ["--env", "CartPole-v1", "--batch_size", "8", "--unroll_length", "20"]
SMALL += ["--warmup_steps", "500", "--bench_steps", "2000"]


@pytest.mark.parametrize("runtime", ["mono", "poly"])  # ray: tests/test_raybeast.py
def test_bench_prints_sps_and_stage_costs(runtime):
    command = [sys.executable, "-m", "torchbeast.bench", "--runtime", runtime, *SMALL]
    result = warm_start.run(command, timeout=300)
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
    result = warm_start.run(command, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(path.read_text())
    printed = re.search(r"steady-state SPS: ([0-9.]+)", result.stdout)
    assert f"{figures['sps']:.1f}" == printed.group(1)
    assert set(figures["stages"]) == {"env", "inference", "actor other", "learner process"}
    assert figures["layout"] == "2 actors x 8 envs" and figures["device"] == "cpu"
    assert figures["torso_dtype"] == "fp32"  # CartPole's MLP torso: fp32 under --precision auto
    assert figures["gpu_utilization"] is None  # a CPU learner: no GPU figure
    assert figures["bound"] == bound_by(figures)
    # Where the actors' wall-clock time went, in shares of it that add up to the whole.
    shares = figures["actor_time"]
    assert list(shares) == ["stepping envs", "choosing actions", "waiting for slots", "the rest"]
    assert all(0 <= share <= 1 for share in shares.values())
    assert shares["stepping envs"] > 0 and shares["choosing actions"] > 0
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    printed = " ".join(f"{name} {100 * share:.0f}%" for name, share in shares.items())
    assert printed.replace("% ", "%, ") in result.stdout.replace("\n", " ")


def test_the_actors_time_shares_are_those_of_the_window():
    before = {"stepping envs": 5.0, "choosing actions": 1.0, "waiting for slots": 0.0, "in all": 7}
    after = {"stepping envs": 9.0, "choosing actions": 4.0, "waiting for slots": 2.0, "in all": 17}
    assert actor_time_shares(before, after) == pytest.approx(
        {
            "stepping envs": 0.4,
            "choosing actions": 0.3,
            "waiting for slots": 0.2,
            "the rest": 0.1,
        }
    )
    assert actor_time_shares(before, before) == {}  # no time passed: no shares


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


def test_a_busy_central_inference_server_bounds_the_run():
    # The learner idles and half the cores too: the actors wait for their actions.
    waiting = figures(8000, [0.68, 0.05, 0.08, 0.16], 0.2, cores=16)
    busy = waiting | {"inference": dict(busy=0.95)}
    assert bound_by(busy) == "central inference (busy 95% of the time)"
    assert bound_by(waiting | {"inference": dict(busy=0.5)}) == (
        "actors (cores idle, learner waiting)"
    )


def test_central_inference_figures_are_those_of_the_window():
    before = dict(waiting=5.0, weights=0.2, gather=1.0, forward=2.0, answer=0.5, cpu=3.0)
    before |= {"passes": 100}
    before |= {"return": 1.0, "envs": 300}
    # 10 s later: 200 passes of 4 envs, 8 s of them busy, on 6 s of CPU.
    after = dict(waiting=7.0, weights=0.4, gather=2.0, forward=6.0, answer=1.0, cpu=9.0)
    after |= {"passes": 300}
    after |= {"return": 3.5, "envs": 1100}
    got = central_inference_figures(before, after, elapsed=10.0)
    assert got["busy"] == pytest.approx(0.82)
    assert got["cpu_cores"] == pytest.approx(0.6)
    assert got["envs_per_pass"] == pytest.approx(4.0)
    assert got["ms_per_pass"] == pytest.approx(
        {"weights": 1.0, "gather": 5.0, "forward": 20.0, "return": 12.5, "answer": 2.5}
    )


def test_bench_reports_what_the_central_inference_server_did(tmp_path):
    path = tmp_path / "bench.json"
    command = [sys.executable, "-m", "torchbeast.bench", *SMALL, "--central_inference"]
    command += ["--json", str(path)]
    result = warm_start.run(command, timeout=300)
    assert result.returncode == 0, result.stderr
    line = re.search(
        r"central inference: busy ([0-9]+)% of the time, ([0-9.]+) cores of CPU, ([0-9.]+) "
        r"envs per pass; ms per pass: weights ([0-9.]+), gather ([0-9.]+), forward "
        r"([0-9.]+), return ([0-9.]+), answer ([0-9.]+)",
        result.stdout,
    )
    assert line is not None, result.stdout
    stages = json.loads(path.read_text())["stages"]
    names = ["env", "inference", "actor other", "central inference", "learner process"]
    assert list(stages) == names
    assert stages["central inference"] > 0  # the inference process's CPU
    figures = json.loads(path.read_text())["inference"]
    assert 0 < figures["busy"] <= 1 and figures["cpu_cores"] > 0
    # 2 actors x 8 envs, each actor's in 2 groups of 4 that ask in turn
    assert 4 <= figures["envs_per_pass"] <= 16
    assert figures["ms_per_pass"]["forward"] > 0
    assert f"{100 * figures['busy']:.0f}" == line.group(1)


def test_sampling_alone_takes_batches_without_updating_the_model():
    """--sampling_only: the pool's batches are taken and dropped; the learner makes no
    update and publishes nothing, and the window still counts every step sampled."""
    argv = ["--env", "CartPole-v1", "--central_inference", "--sampling_only"]
    flags = parse_flags(argv, make_bench_parser(list(RUNTIMES)))
    with tempfile.TemporaryDirectory() as folder:
        settings = build_settings(in_folder(flags, folder), "mono")
        with RUNTIMES["mono"].load(settings).session(settings) as trainer:
            before = [p.detach().clone() for p in trainer.learner.model.parameters()]
            result: dict = {}
            measure_sampling(trainer, 1000, 5000, result)
            after = list(trainer.learner.model.parameters())
            rows = trainer.pool.inference.central.figures.passes.numel() - 1
    assert trainer.learner.step == 0
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
    assert result["steps"] >= 5000 and result["sps"] > 0 and result["learner_busy"] == 0
    assert set(result["stages"]) == {
        "env",
        "inference",
        "actor other",
        "central inference",
        "learner process",
    }
    # 2 actors x 8 envs, each actor's in 2 groups of 4 that ask in turn: 4 rows.
    assert rows == 4 and 4 <= result["inference"]["envs_per_pass"] <= 16


@pytest.mark.parametrize("runtime", ["mono", "poly"])
def test_bench_says_when_it_measured_sampling_alone(runtime, tmp_path):
    path = tmp_path / "bench.json"
    command = [sys.executable, "-m", "torchbeast.bench", "--runtime", runtime, *SMALL]
    command += ["--sampling_only", "--json", str(path)]
    result = warm_start.run(command, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "sampling alone (--sampling_only): each batch dropped as it filled, no update" in (
        result.stdout
    )
    figures = json.loads(path.read_text())
    assert figures["sampling_only"] is True and figures["steps"] >= 2000
    assert "learner busy 0% of the time" in result.stdout


def test_sampling_alone_says_in_one_line_why_the_actors_stopped(tmp_path):
    command = [sys.executable, "-m", "torchbeast.bench", *SMALL, "--sampling_only"]
    command += ["--env", "tests.envs_for_tests:SelfKilling-v0", "--num_actors", "1"]
    result = warm_start.run(command, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "actors keep dying" in last, result.stderr


def test_a_mode_other_than_training_is_refused(capsys):
    from torchbeast.bench import main

    # It trained and measured as ever, exit 0.
    with pytest.raises(SystemExit) as refused:
        main([*SMALL, "--mode", "test"])
    assert refused.value.code == 2
    assert "error: --mode test: the benchmark measures training; leave out --mode" in (
        capsys.readouterr().err
    )


def test_a_total_steps_that_ends_the_run_before_the_window_is_refused(capsys):
    from torchbeast.bench import main

    # It printed the SPS of what part of the window ran, with exit code 0.
    assert main([*SMALL, "--total_steps", "800"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --total_steps 800 ends the run before the measurement window does "
        "(--warmup_steps + --bench_steps = 2500): raise it, or leave it out"
    )

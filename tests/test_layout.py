"""How a run spreads over the machine: the actor layout it chooses, the learner's threads
per op, the actors' lower priority, and the log lines that say them."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.test_monobeast import (
    actor_pids,
    monobeast,
    read_rows,
    start_monobeast,
    wait_for_rows,
)
from torchbeast.config.flags import parse_flags, parse_flags_and_sources
from torchbeast.config.parsers import make_learner_parser, make_poly_parser
from torchbeast.config.resolvers import default_layout, grown_batch
from torchbeast.runtime.layout import (
    ACTOR_NICENESS,
    learner_cores,
    threads_per_op,
    torso_threads,
)


@pytest.mark.parametrize(
    "cores, layout", [(1, (1, 8)), (2, (2, 8)), (4, (2, 8)), (8, (4, 8)), (16, (8, 8))]
)
def test_the_default_layout_is_half_the_cores_with_8_envs_each(cores, layout):
    assert default_layout(cores) == layout


@pytest.mark.parametrize("cores", [2, 16])
def test_with_the_learner_on_a_gpu_the_layout_is_one_actor_per_core(monkeypatch, cores):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # no GPU here to ask
    flags = parse_flags([])
    assert (flags.num_actors, flags.envs_per_actor) == (cores, 8)
    assert flags.layout_source == f"chosen for {cores} cores and a GPU"
    on_cpu = parse_flags(["--disable_cuda"])  # the learner stays on the CPU
    assert (on_cpu.num_actors, on_cpu.layout_source) == (
        max(2, cores // 2),
        f"chosen for {cores} cores",
    )


def test_layout_flags_win_over_the_machines_layout():
    flags = parse_flags(["--num_actors", "3", "--envs_per_actor", "5"])
    assert (flags.num_actors, flags.envs_per_actor) == (3, 5)
    assert flags.layout_source == "--num_actors and --envs_per_actor"
    original = parse_flags(["--num_actors", "4"])  # the original's command lines
    assert (original.num_actors, original.envs_per_actor) == (4, 1)
    cores = len(os.sched_getaffinity(0))
    envs_only = parse_flags(["--envs_per_actor", "2"])
    assert (envs_only.num_actors, envs_only.envs_per_actor) == (default_layout(cores)[0], 2)


@pytest.mark.parametrize("cores", [2, 16])
def test_polybeast_learners_streams_have_the_env_sides_envs_unless_told(monkeypatch, cores):
    # polybeast_learner's streams come from polybeast_env (--envs_per_stream, default 1):
    # its batch is sized for those, where polybeast's own env side takes 8 envs a stream.
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    actors = default_layout(cores)[0]
    learner = parse_flags(["--disable_cuda"], make_learner_parser(""))
    assert (learner.num_actors, learner.envs_per_actor) == (actors, 1)
    assert (learner.batch_size, learner.layout_source) == (16, f"chosen for {cores} cores")
    assert learner.batch_size == grown_batch(actors)[0]
    both = parse_flags(["--disable_cuda"], make_poly_parser())
    assert (both.num_actors, both.envs_per_actor) == (actors, 8)
    assert both.batch_size == grown_batch(actors * 8)[0]
    told = parse_flags(["--disable_cuda", "--envs_per_actor", "8"], make_learner_parser(""))
    assert (told.envs_per_actor, told.batch_size) == (8, grown_batch(actors * 8)[0])
    assert told.layout_source == f"--envs_per_actor, actors chosen for {cores} cores"


@pytest.mark.parametrize(
    "envs, batch, learning_rate",
    [(1, 16, 0.0007), (16, 16, 0.0007), (24, 16, 0.0007), (32, 32, 0.00099), (48, 32, 0.00099)]
    + [(64, 32, 0.00099), (128, 32, 0.00099), (1024, 32, 0.00099)],
)
def test_the_batch_grows_with_the_envs_up_to_32_and_its_rate_with_the_square_root(
    envs, batch, learning_rate
):
    grown_size, grown_rate = grown_batch(envs)
    assert grown_size == batch
    assert grown_rate == learning_rate  # three significant digits


@pytest.mark.parametrize("cores, batch", [(2, 16), (4, 16), (8, 32), (16, 32)])
def test_the_machines_layout_takes_the_batch_grown_with_its_envs(monkeypatch, cores, batch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    flags, sources = parse_flags_and_sources([])
    assert flags.batch_size == batch
    assert flags.learning_rate == pytest.approx(0.0007 * (batch / 16) ** 0.5, rel=0.01)
    assert sources["batch_size"] == ("derived" if batch > 16 else "default")
    assert flags.num_buffers >= 2 * batch  # two rollouts per env, as before


@pytest.mark.parametrize(
    "given",
    [
        ["--batch_size", "16"],
        ["--learning_rate", "0.0007"],
        ["--unroll_length", "5"],
        ["--env", "RiverraidNoFrameskip-v4", "--fuel_multiplier", "1", "--move_penalty", "0"],
    ],
)
def test_a_batch_rate_or_unroll_given_anywhere_keeps_the_batch_as_given(monkeypatch, given):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    flags, sources = parse_flags_and_sources(given)
    preset = sources.get("batch_size") not in ("default", "command line")
    assert flags.batch_size == (4 if preset else 16)  # the survival proxy's preset: 4
    assert sources["batch_size"] != "derived" and sources["learning_rate"] != "derived"


def test_a_config_file_batch_is_kept_too(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    config = tmp_path / "run.toml"
    config.write_text("learning_rate = 0.0005\n")
    flags = parse_flags(["--config", str(config)])
    assert (flags.batch_size, flags.learning_rate) == (16, 0.0005)


def test_a_run_says_its_batch_grew_with_the_envs(tmp_path):
    args = ["--env", "CartPole-v1", "--total_steps", "1000", "--xpid", "run", "--disable_cuda"]
    result = monobeast(tmp_path, *args, "--num_actors", "2", "--envs_per_actor", "16")
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert (
        "Learner batch: 32 rollouts, learning rate 0.00099, grown with the envs "
        "(--batch_size and --learning_rate set your own)." in out_log
    )
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert int(rows[0]["step"]) == 32 * 5  # each update learnt from 32 rollouts of 5 steps
    decayed = 0.00099 * (1 - 32 * 5 / 1000)  # after one update of --total_steps 1000
    assert float(rows[0]["learning_rate"]) == pytest.approx(decayed, rel=1e-3)


@pytest.mark.parametrize(
    "cores, concurrent, threads", [(2, 1, 2), (2, 2, 1), (16, 1, 16), (1, 3, 1)]
)
def test_learner_ops_share_the_cores_between_threads_running_ops_at_once(
    cores, concurrent, threads
):
    assert threads_per_op(cores, concurrent) == threads


@pytest.mark.parametrize(
    "cores, concurrent, threads", [(1, 1, 1), (2, 1, 1), (4, 1, 2), (16, 1, 8), (16, 2, 4)]
)
def test_a_bf16_learner_takes_half_the_cores(cores, concurrent, threads):
    assert threads_per_op(cores, concurrent, bf16=True) == threads


def niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of stat: nice


@pytest.mark.parametrize(
    "run, lower",
    [
        (["--env", "CartPole-v1"], 0),  # fp32: the priority the defaults learned with
        (["--env", "PongNoFrameskip-v4", "--precision", "bf16"], ACTOR_NICENESS),
    ],
)
def test_actors_run_niced_beside_a_bf16_learner_so_that_it_goes_first(tmp_path, run, lower):
    args = [*run, "--total_steps", "10000000", "--xpid", "run", "--disable_cuda"]
    process = start_monobeast(tmp_path, *args, "--batch_size", "2", "--envs_per_actor", "2")
    try:
        # Niced actors beside the other test worker's processes get a sliver of a core:
        # minutes on a slow, loaded host (22 s on a fast one). The test checks priority.
        wait_for_rows(tmp_path / "run" / "logs.csv", 2, timeout=600)
        actors = actor_pids(process.pid)
        assert len(actors) == default_layout(len(os.sched_getaffinity(0)))[0]
        learner = niceness(process.pid)
        assert [niceness(pid) for pid in actors] == [min(19, learner + lower)] * len(actors)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_idle_openmp_threads_sleep_in_every_process_of_a_run():
    # Set by the package before PyTorch loads OpenMP; children inherit it.
    code = "import torchbeast, torch, os; print(os.environ['OMP_WAIT_POLICY'])"
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # a user's own choice wins
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "ACTIVE"


def test_a_run_says_which_layout_and_threads_it_chose(tmp_path):
    args = ["--env", "CartPole-v1", "--total_steps", "2000", "--xpid", "run", "--disable_cuda"]
    result = monobeast(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    cores = len(os.sched_getaffinity(0))
    actors, envs = default_layout(cores)
    assert f"Layout: {actors} actors x {envs} envs (chosen for {cores} cores)." in out_log
    threads = threads_per_op(cores, 1)
    assert f"PyTorch uses {threads} thread(s) per op in the learner process (" in out_log
    assert "split each batch" not in out_log  # an MLP's rows are not worth a thread


def test_a_bf16_run_says_so_and_saves_fp32_weights(tmp_path):
    args = ["--env", "PongNoFrameskip-v4", "--precision", "bf16", "--xpid", "run"]
    small = ["--num_actors", "1", "--envs_per_actor", "2", "--batch_size", "2"]
    result = monobeast(tmp_path, *args, *small, "--total_steps", "200", "--disable_cuda")
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "The torso computes in bf16 on the CPU (--precision bf16" in out_log
    cores = learner_cores()[0]
    split = torso_threads(cores, splittable=True)
    threads = threads_per_op(cores, 1, bf16=True, torso_threads=split)
    line = f"PyTorch uses {threads} thread(s) per op in the learner process"
    if split > 1:  # an Atari torso on the CPU splits each batch's rows over threads
        line += f", and its torso's passes split each batch over {split} threads"
    assert line in out_log
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    dtypes = {value.dtype for value in state["model_state_dict"].values()}
    assert dtypes == {torch.float32}  # a checkpoint plays and resumes in any precision
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert rows and all(math.isfinite(float(row["total_loss"])) for row in rows)


def test_omp_num_threads_bounds_the_learners_threads(monkeypatch):
    import torch

    from torchbeast.runtime.layout import limit_learner_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a study's cell of one CPU sets it so
        line = limit_learner_threads(1)
        assert torch.get_num_threads() == 1
        assert "PyTorch uses 1 thread(s) per op" in line
        if len(os.sched_getaffinity(0)) > 1:
            assert "of them 1 by OMP_NUM_THREADS" in line
        monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a count: the cores decide
        limit_learner_threads(1)
        assert torch.get_num_threads() == threads_per_op(len(os.sched_getaffinity(0)), 1)
    finally:
        torch.set_num_threads(before)

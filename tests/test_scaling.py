"""The scaling benchmark: the training recipe over actor layouts, one row per run (the
figures themselves are checked by people, never by timed tests)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
import torch

from tests import warm_start
from tests.test_polybeast import REPO
from torchbeast.config.parsers import make_mono_parser
from torchbeast.config.resolvers import default_layout
from torchbeast.scaling import (
    actor_time_table,
    default_layouts,
    inference_table,
    layout,
    recipe_arguments,
)

SMALL = ["--env", "CartPole-v1", "--warmup_steps", "500", "--bench_steps", "2000"]


def test_scaling_prints_one_row_per_layout_with_the_training_recipe(tmp_path):
    path = tmp_path / "rows.json"
    command = [sys.executable, "-m", "torchbeast.scaling", "--layouts", "1x2", "2x4", *SMALL]
    command += ["--devices", "cpu", "--json", str(path)]
    result = warm_start.run(command, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    main_table, actor_times = result.stdout.split("\n\n")  # two tables
    rows = [line for line in main_table.splitlines() if re.match(r"\| [0-9]+ x ", line)]
    assert [row.split(" | ")[0] for row in rows] == ["| 1 x 2", "| 2 x 4"], result.stdout
    assert actor_times.startswith("| actors x envs | actors' wall-clock time: stepping envs")
    assert len(actor_times.strip().splitlines()) == 4
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[1] == "16 (0.0007)"  # 2 and 8 envs: the recipe's own batch
        assert cells[2] == "cpu" and float(cells[3]) > 0
        assert cells[-1].split()[0] in ("learner", "CPU", "actors")
        assert cells[-2] == "fp32"  # CartPole's MLP torso: fp32 under --precision auto
    saved = json.loads(path.read_text())
    assert [r["layout"] for r in saved] == ["1 actors x 2 envs", "2 actors x 4 envs"]
    assert all(r["steps"] >= 2000 for r in saved)
    # Every run learned with the training defaults' recipe, not the one-step benchmark's.
    parser = make_mono_parser()
    for row in saved:
        for name in ("batch_size", "unroll_length", "epochs", "ppo_clip"):
            assert row["learner"][name] == parser.get_default(name)
        assert row["learner"]["learning_rate"] == parser.get_default("learning_rate")


def test_the_recipe_is_the_training_defaults():
    parser = make_mono_parser()
    expected = []
    for name in ("batch_size", "unroll_length", "epochs", "ppo_clip"):
        expected += [f"--{name}", str(parser.get_default(name))]
    assert recipe_arguments() == expected


def test_each_row_takes_the_batch_training_grows_with_its_envs_unless_flags_set_it():
    grown = recipe_arguments(64)
    assert grown[grown.index("--batch_size") + 1] == "32"
    assert grown[grown.index("--learning_rate") + 1] == "0.00099"
    for given in (["--batch_size", "8"], ["--unroll_length=20"], ["--learning_rate", "1e-3"]):
        kept = recipe_arguments(64, given)
        assert "--learning_rate" not in kept, given  # the recipe's own rate, or the given
        if given[0] == "--batch_size":
            assert "--batch_size" not in kept  # the run takes the given one
        else:
            assert kept[kept.index("--batch_size") + 1] == "16", given


def test_rows_keep_the_learner_an_envs_presets_set_as_training_does():
    # SpaceInvaders' preset sets the learning rate: the batch stays 16, and the rate is
    # left to the preset (on the command line, the recipe's would win over it).
    minatar = recipe_arguments(64, ["--env", "MinAtar/SpaceInvaders-v1"])
    assert "--learning_rate" not in minatar
    assert minatar[minatar.index("--batch_size") + 1] == "16"
    # Riverraid's survival proxy sets the batch and unroll length: neither is passed.
    survival = ["--env", "RiverraidNoFrameskip-v4", "--fuel_multiplier", "1"]
    survival += ["--move_penalty", "0"]
    riverraid = recipe_arguments(64, survival)
    assert not {"--batch_size", "--unroll_length", "--learning_rate"} & set(riverraid)
    assert riverraid == recipe_arguments(passed=survival)  # epochs and clip: training's
    # --no_presets: the recipe whole, grown with the envs.
    assert recipe_arguments(64, ["--env", "MinAtar/SpaceInvaders-v1", "--no_presets"]) == (
        recipe_arguments(64)
    )


def test_default_layouts_run_up_to_the_cores_and_include_the_machines_own():
    assert default_layouts(2) == [(1, 8), (2, 8)]
    assert default_layouts(16) == [(1, 8), (2, 8), (4, 8), (8, 8), (16, 8)]
    assert default_layout(12) in default_layouts(12) and (12, 8) in default_layouts(12)


def test_a_layout_is_actors_x_envs():
    assert layout("4x8") == (4, 8)
    for text in ("4", "0x8", "ax8", "4x"):
        with pytest.raises(Exception, match="ACTORSxENVS"):
            layout(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_one_clear_error():
    command = [sys.executable, "-m", "torchbeast.scaling", "--devices", "cuda", *SMALL]
    result = warm_start.run(command, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --devices cuda, but PyTorch sees no CUDA device: use --devices cpu"
    ]


def test_a_layout_flag_is_refused_for_the_rows_set_their_own():
    # The header said every row ran with --num_actors 7; the rows ran their layouts.
    command = [sys.executable, "-m", "torchbeast.scaling", *SMALL, "--num_actors", "7"]
    result = warm_start.run(command, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --num_actors is each row's own: give the rows with --layouts ACTORSxENVS,... "
        "(and --devices)"
    ]


@pytest.mark.parametrize("entry_point", ["scaling", "bench"])
def test_a_json_path_that_cannot_be_written_is_refused_before_measuring(tmp_path, entry_point):
    for path, said in [
        (tmp_path / "no" / "rows.json", "no folder"),
        (tmp_path, "is a folder"),
    ]:
        command = [sys.executable, "-m", f"torchbeast.{entry_point}", *SMALL, "--json", str(path)]
        result = warm_start.run(command, timeout=120)
        assert result.returncode == 2, result.stdout[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --json") and said in lines[0]
        assert "steady-state SPS" not in result.stdout  # nothing was measured


def test_rows_with_central_inference_get_a_table_of_what_its_thread_did():
    ms = {"gather": 0.4, "forward": 1.25, "return": 3.0, "answer": 0.1}
    central = dict(busy=0.97, cpu_cores=0.81, envs_per_pass=7.94, ms_per_pass=ms)
    rows = [dict(actors=16, envs=8), dict(actors=32, envs=8, inference=central)]
    assert inference_table(rows).splitlines() == [
        "| actors x envs | central inference busy | its CPU (cores) | envs per pass "
        "| ms per pass: gather / forward / return / answer |",
        "|---|---|---|---|---|",
        "| 32 x 8 | 97% | 0.81 | 7.9 | 0.40 / 1.25 / 3.00 / 0.10 |",
    ]
    assert inference_table(rows[:1]) == ""


def test_rows_that_counted_their_actors_time_get_a_table_of_it():
    shares = {"stepping envs": 0.55, "choosing actions": 0.3, "waiting for slots": 0.1}
    rows = [dict(actors=16, envs=8, actor_time=shares | {"the rest": 0.05}), dict(actors=2)]
    assert actor_time_table(rows).splitlines() == [
        "| actors x envs | actors' wall-clock time: stepping envs / choosing actions / "
        "waiting for slots / the rest |",
        "|---|---|",
        "| 16 x 8 | 55% / 30% / 10% / 5% |",
    ]
    assert actor_time_table(rows[1:]) == ""


def test_a_stopped_scaling_benchmark_keeps_the_rows_it_measured(tmp_path):
    path = tmp_path / "rows.json"
    command = [sys.executable, "-m", "torchbeast.scaling", "--layouts", "1x2", "2x2", *SMALL]
    command += ["--devices", "cpu", "--json", str(path), "--total_steps", "10000000"]
    scaling = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in scaling.stdout:  # until the first row
            if line.startswith("| 1 x 2"):
                break
    finally:
        scaling.send_signal(signal.SIGTERM)  # it died, its measured rows lost (--json unwritten)
        _, stderr = scaling.communicate(timeout=120)
    assert scaling.returncode == 130
    assert stderr.strip().splitlines()[-1] == f"interrupted after 1 rows, written to {path}"
    assert [row["layout"] for row in json.loads(path.read_text())] == ["1 actors x 2 envs"]

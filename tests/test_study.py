"""Studies: a grid of real CartPole runs, trained, evaluated and gathered into one table;
interrupted and started again; with a cell that fails."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests import warm_start
from tests.test_monobeast import REPO, wait_for

SMALL = """
runtime = "mono"
[flags]
env = "CartPole-v1"
num_actors = 1
envs_per_actor = 2
batch_size = 2
unroll_length = 20
total_steps = 800
disable_cuda = true
savedir = "{savedir}"
[axes]
{axes}
[eval]
num_episodes = 2
"""


def write_study(tmp_path, axes: str, name: str = "grid") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(SMALL.format(savedir=tmp_path / "runs", axes=axes))
    return str(path)


def edit_study(path: str, old: str, new: str) -> None:
    text = open(path).read()
    assert old in text
    open(path, "w").write(text.replace(old, new))


def study_command(path: str) -> list[str]:
    return [sys.executable, "-m", "torchbeast.study", path, "--parallel", "1"]


def run_study(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        study_command(path), cwd=REPO, capture_output=True, text=True, timeout=600
    )


def table(tmp_path, name: str = "grid") -> list[dict[str, str]]:
    with open(tmp_path / "runs" / name / "study.csv") as f:
        return list(csv.DictReader(f))


def runs_training(run_dir) -> list[int]:
    """Live processes whose command line trains in ``run_dir`` (its study's folder and its
    name: other tests' cells of one name train beside it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                words = f.read().split("\0")
        except OSError:
            continue
        named = "--xpid" in words and words[words.index("--xpid") + 1] == run_dir.name
        if named and str(run_dir.parent) in words:
            found.append(int(pid))
    return found


def test_a_study_trains_evaluates_and_tabulates_every_cell_once(tmp_path):
    done = run_study(write_study(tmp_path, "hidden_size = [16, 32]"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(tmp_path)
    assert [row["cell"] for row in rows] == ["hidden_size-16", "hidden_size-32"]
    assert all(row["status"] == "finished" for row in rows)
    # Each cell is its own run, with the axis' value: the wider model has more parameters.
    small, wide = (int(row["parameters"]) for row in rows)
    assert small < wide
    for row in rows:
        run = tmp_path / "runs" / "grid" / row["cell"]
        flags = json.loads((run / "meta.json").read_text())["flags"]
        assert flags["hidden_size"] == int(row["hidden_size"])
        assert int(row["steps"]) >= 800
        report = json.loads((run / "eval.json").read_text())
        assert float(row["eval_return"]) == report["return"]["mean"]
        assert report["num_episodes"] == 2
        # The random policy's level, with the cell's own env and reward settings.
        random = json.loads((run / "eval_random.json").read_text())
        assert random["policy"] == "random" and "parameters" not in random
        assert float(row["random_return"]) == random["return"]["mean"]
    spec = json.loads((tmp_path / "runs" / "grid" / "study.json").read_text())
    assert [cell["cell"] for cell in spec["cells"]] == ["hidden_size-16", "hidden_size-32"]
    # Its figures: the capacity figure and one learning-curve panel per cell.
    drawn = warm_start.run(
        [sys.executable, "-m", "torchbeast.study_plot", str(tmp_path / "runs" / "grid")],
        timeout=120,
    )
    assert drawn.returncode == 0, drawn.stderr
    for name in ("capacity.png", "curves.png"):
        assert (tmp_path / "runs" / "grid" / name).read_bytes().startswith(b"\x89PNG")


def test_a_study_stopped_midway_goes_on_from_where_it_was(tmp_path):
    path = write_study(tmp_path, "seed = [1, 2]")
    first = subprocess.Popen(
        study_command(path),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    folder = tmp_path / "runs" / "grid"
    try:
        wait_for(lambda: (folder / "seed-1" / "eval.json").exists(), 300, "the first cell")
        wait_for(lambda: (folder / "seed-2" / "logs.csv").exists(), 120, "the second cell")
        # The table shows each cell as it starts and ends, not only when the study does
        # (the second said "not run" while it trained).
        assert [row["status"] for row in table(tmp_path)] == ["finished", "running"]
    finally:
        os.kill(first.pid, signal.SIGTERM)  # the study alone: it stops the run it trains
        first.wait(timeout=60)
    assert first.returncode == 130
    assert not runs_training(folder / "seed-2")  # stopped with the study, not orphaned
    again = run_study(path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "seed-1: finished before, skipped" in again.stdout
    rows = table(tmp_path)
    assert [row["cell"] for row in rows] == ["seed-1", "seed-2"]
    assert all(row["status"] == "finished" for row in rows)


def test_a_second_signal_waits_for_the_runs_checkpoints(tmp_path):
    # As `timeout` stops a study (SIGTERM to it, then to its group), or Ctrl-C twice: the
    # study left at the second, its run died mid-checkpoint, and no record was written.
    path = write_study(tmp_path, "seed = [1]")
    edit_study(path, "total_steps = 800", "total_steps = 1000000")
    study = subprocess.Popen(
        study_command(path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    run = tmp_path / "runs" / "grid" / "seed-1"
    try:
        wait_for(lambda: (run / "logs.csv").exists(), 120, "the cell's run")
        time.sleep(2)
        os.kill(study.pid, signal.SIGTERM)
        time.sleep(0.1)
        os.killpg(study.pid, signal.SIGTERM)
        _, stderr = study.communicate(timeout=120)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 130, stderr
    assert "stopping: the runs are writing their checkpoints" in stderr
    state = json.loads((run / "study_cell.json").read_text())
    assert state["status"] == "stopped" and state["seconds"] > 2
    assert "stopped by SIGTERM at step" in (run / "study.log").read_text()  # the run's line
    assert (run / "model.tar").exists() and not runs_training(run)


def test_a_study_killed_outright_takes_the_run_it_trains_along(tmp_path):
    path = write_study(tmp_path, "seed = [1]")
    text = open(path).read().replace("total_steps = 800", "total_steps = 1000000")
    open(path, "w").write(text)
    study = subprocess.Popen(
        study_command(path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run = tmp_path / "runs" / "grid" / "seed-1"
    try:
        wait_for(lambda: (run / "logs.csv").exists(), 120, "the cell's run")
    finally:
        study.kill()  # SIGKILL: no handler of the study's runs
        study.wait(timeout=60)
    wait_for(lambda: not runs_training(run), 30, "the run to die with the study")


def test_a_cell_that_fails_is_recorded_and_the_others_go_on(tmp_path):
    path = write_study(tmp_path, 'env = ["tests.envs_for_tests:Raising-v0", "CartPole-v1"]')
    edit_study(path, 'env = "CartPole-v1"\n', "")  # the first raises in its step 50
    done = run_study(path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 2 cells failed: env-tests.envs_for_tests_Raising-v0")
    failed, finished = table(tmp_path)
    assert failed["status"] == "failed"
    assert "the emulator crashed" in failed["error"]
    assert finished["status"] == "finished" and finished["eval_return"]


@pytest.mark.parametrize(
    "change, said",
    [
        # Each trained whole, then failed its evaluation; the fixed file was another study.
        (("num_episodes = 2", "num_epsiodes = 2"), "cell hidden_size-16's evaluation: "
         "unrecognized arguments: --num_epsiodes=2 (did you mean --num_episodes?)"),
        (("hidden_size = [16, 32]", "hidden_size = [16, 0]"), "cell hidden_size-0's "
         "training: hidden_size = 0: must be a positive integer, got 0"),
        (("hidden_size = [16, 32]", "hidden_size = [16, [32]]"), "hidden_size = [32]: not a "
         "flag value: use a string, a number or true/false"),
        (("num_episodes = 2", "num_episodes = 2\nrandom_policy = false"), "[eval] sets "
         "random_policy, but the study evaluates a random policy of its own"),
        (("num_episodes = 2", "num_episodes = 2\ndisable_cuda = false"), "[eval] "
         "disable_cuda = false cannot turn off the training's disable_cuda = true"),
        (('runtime = "mono"', 'runtime = "mono"\nresources = 2'), "resources must be a "
         "table: [resources], then name = value lines"),
        # Dropped without a word: each cell is named for its values.
        (("total_steps = 800", 'total_steps = 800\nxpid = "mine"'), "the cells' "
         "training sets xpid = \"mine\", but each cell's name is its folder's: leave it out"),
        # Taken, and written into study.json as NaN, which is no JSON.
        (("hidden_size = [16, 32]", "hidden_size = [16, 32]\n[resources]\ngpus = nan"),
         "[resources] gpus must be a number of at least 0"),
        (("hidden_size = [16, 32]", "hidden_size = [16, 32]\n[resources]\ngpus = inf"),
         "[resources] gpus must be a number of at least 0"),
        (("hidden_size = [16, 32]", 'hidden_size = [16, 32]\nr = [{name = "w", hidden_size'
          " = 64}]"), "the set 'w' of axis r sets hidden_size, which is also an axis of the "
         "study: keep one"),
        (("num_episodes = 2", 'num_episodes = 2\nvideo = "play.mp4"'), "cell hidden_size-16's "
         "evaluation: --video "),  # a check of the command's mode, not of its parser
        (("num_episodes = 2", 'num_episodes = 2\nvideo = "/tmp/play.gif"'), "[eval] video = "
         "'/tmp/play.gif': each cell records its own, in its folder"),  # all in one file
        # Each cell trained whole, then failed its evaluation for want of a checkpoint.
        (("total_steps = 800", 'total_steps = 800\nmode = "eval"'), "the cells' training "
         'sets mode = "eval", but each cell trains (--mode train), then is evaluated'),
        (("hidden_size = [16, 32]", "hidden_size = [16, 32]\ndisable_checkpoint = [true]"),
         "the cells' training sets disable_checkpoint = true, but each cell's evaluation "
         "plays"),
        # A dash, as the flags file takes it: it got past the checks of the underscore.
        (("hidden_size = [16, 32]", 'hidden_size = [16, 32]\nr = [{name = "a", '
          "disable-checkpoint = true}]"), "the cells' training sets disable_checkpoint = "
         "true, but each cell's evaluation plays"),
        (("hidden_size = [16, 32]", 'hidden_size = [16, 32]\nr = [{name = "a", '
          "batch-size = 4, batch_size = 8}]"), "the set 'a' of axis r sets batch-size and "
         "batch_size, one flag: keep one"),
        (("total_steps = 800", "total_steps = 800\nbatch-size = 4"), "[flags] sets "
         "batch_size and batch-size, one flag: keep one"),
        # Its rows' "steps" column overwrote the set's name, so no plot found the cells.
        (("hidden_size = [16, 32]", 'hidden_size = [16, 32]\nsteps = [{name = "short", '
          "total_steps = 400}]"), "axis steps: the study's table (study.csv) has a column of "
         "its own by that name"),
        (("hidden_size = [16, 32]", "hidden_size = [16, 32]\neval_x = [1]"), "axis eval_x: "
         "the study's table"),
        # Its help went to the console and the line after it was a traceback.
        (("num_episodes = 2", "num_episodes = 2\nhelp = true"), "help = True: a cell's run "
         "would print its help and end"),
        (("num_episodes = 2", 'num_episodes = 2\nconfig = "my.toml"'), "config = 'my.toml': "
         "the study writes each cell's flags file itself"),
        # The folder a Ray cluster copies the cell a-b back into, which it deleted.
        (("hidden_size = [16, 32]", 'hidden_size = [16, 32]\na = ["b", "b.incoming"]'),
         "the cell hidden_size-16_a-b.incoming's folder name ends as the folders a Ray "
         "cluster copies cells back into"),
    ],
)  # fmt: skip
def test_what_no_cell_could_take_is_one_line_before_anything_runs(tmp_path, change, said):
    from torchbeast import study

    path = write_study(tmp_path, "hidden_size = [16, 32]")
    edit_study(path, *change)
    # In this process: main's way from a StudyError to one line is the other tests'.
    with pytest.raises(study.StudyError) as refused:
        study.run_study(study.make_parser().parse_args([path, "--parallel", "1"]))
    assert str(refused.value).startswith(f"{path}: {said}") and "\n" not in str(refused.value)
    assert not (tmp_path / "runs" / "grid").exists()  # nothing trained, nothing claimed


def test_a_study_refused_before_it_runs_says_so_in_one_line(tmp_path):
    path = write_study(tmp_path, "hidden_size = [16, 0]")
    done = run_study(path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: cell hidden_size-0's training: hidden_size = 0: must be a positive "
        "integer, got 0"
    ]


def test_a_study_with_its_axes_in_another_order_keeps_its_cells(tmp_path):
    path = write_study(tmp_path, "hidden_size = [16]\nseed = [1]")
    assert run_study(path).returncode == 0
    edit_study(path, "hidden_size = [16]\nseed = [1]", "seed = [1]\nhidden_size = [16]")
    again = run_study(path)  # it trained seed-1_hidden_size-16 anew, beside the old cell
    assert again.returncode == 0, again.stderr
    assert "hidden_size-16_seed-1: finished before, skipped" in again.stdout
    assert [row["cell"] for row in table(tmp_path)] == ["hidden_size-16_seed-1"]


def test_the_table_tells_a_running_cell_from_a_stopped_one(tmp_path):
    from torchbeast.study import Progress, cell_row, claim_folder, read_study

    cell = claim_folder(read_study(write_study(tmp_path, "seed = [1]"))).cells()[0]
    assert cell_row(cell)["status"] == "not run"
    cell.folder.mkdir()
    (cell.folder / "logs.csv").write_text("# _tick,_time,step\n0,0.0,40\n")  # trained some
    # Cells still training beside the one that ended were listed as "stopped".
    assert cell_row(cell, Progress(running={cell.name}))["status"] == "running"
    assert cell_row(cell)["status"] == "stopped"  # no record, and no command runs it


def test_a_study_runs_once_at_a_time(tmp_path):
    from torchbeast.study import StudyError, claim_folder, only_run_of, read_study

    study = claim_folder(read_study(write_study(tmp_path, "seed = [1]")))
    with only_run_of(study):  # the same study started again meanwhile trained the same cells
        with pytest.raises(StudyError, match="is running already .* wait for it to end"):
            with only_run_of(study):
                pass
    with only_run_of(study):  # once it ended
        pass
    assert claim_folder(read_study(write_study(tmp_path, "seed = [1]"))) == study


def test_each_evaluation_records_its_video_in_the_cells_folder(tmp_path):
    from torchbeast.study import read_study

    path = write_study(tmp_path, "seed = [1, 2]")
    edit_study(path, "num_episodes = 2", 'num_episodes = 2\nvideo = "play.gif"')
    videos = []
    for cell in read_study(path).cells():  # all four wrote ./play.gif, each over the last
        for words in cell.job().evaluations():
            videos += [word.partition("=")[2] for word in words if word.startswith("--video=")]
    folder = tmp_path / "runs" / "grid"
    assert videos == [
        str(folder / "seed-1" / "play.gif"), str(folder / "seed-1" / "play_random.gif"),
        str(folder / "seed-2" / "play.gif"), str(folder / "seed-2" / "play_random.gif"),
    ]  # fmt: skip


def test_polybeast_cells_side_by_side_serve_their_envs_apart(tmp_path):
    path = write_study(tmp_path, 'env = ["CartPole-v1", "Acrobot-v1"]')
    edit_study(path, 'env = "CartPole-v1"\n', "")
    edit_study(path, 'runtime = "mono"', 'runtime = "poly"')
    edit_study(path, "total_steps = 800", "total_steps = 400")
    # Both served on unix:/tmp/polybeast.N and dialled each other's env servers.
    done = warm_start.run(
        [sys.executable, "-m", "torchbeast.study", path, "--parallel", "2"],
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(tmp_path)
    assert [row["status"] for row in rows] == ["finished", "finished"]
    for row in rows:
        meta = json.loads((tmp_path / "runs" / "grid" / row["cell"] / "meta.json").read_text())
        assert meta["flags"]["env"] == row["env"]


def test_a_study_never_writes_into_another_studys_folder(tmp_path):
    assert run_study(write_study(tmp_path, "hidden_size = [16]")).returncode == 0
    other = run_study(write_study(tmp_path, "hidden_size = [32]"))  # same name, other grid
    assert other.returncode == 1
    assert other.stderr.startswith("error: ")
    assert "holds another study (its study.json has other axes)" in other.stderr
    assert [row["cell"] for row in table(tmp_path)] == ["hidden_size-16"]


def test_a_study_whose_evaluation_changed_evaluates_its_finished_cells_again(tmp_path):
    # "holds another study (its study.json has other flags or axes)", of flags and axes
    # that had not changed: the cells could only be trained anew elsewhere.
    path = write_study(tmp_path, "seed = [1, 2]")
    assert run_study(path).returncode == 0
    cell = tmp_path / "runs" / "grid" / "seed-1"
    steps = json.loads((cell / "eval.json").read_text())["step"]
    edit_study(path, "num_episodes = 2", "num_episodes = 3")
    edit_study(path, "seed = [1, 2]", "seed = [2, 1]")  # an axis's values in another order
    again = run_study(path)
    assert again.returncode == 0, again.stderr
    assert "finished before" not in again.stdout
    report = json.loads((cell / "eval.json").read_text())
    assert report["num_episodes"] == 3 and report["step"] == steps  # played, not trained
    assert all(row["status"] == "finished" for row in table(tmp_path))
    assert "finished before, skipped" in run_study(path).stdout  # and once is enough


def finish_by_hand(cell, random_return: float | None = None) -> None:
    """Leaves ``cell`` as a study leaves one that trained and was evaluated: its flags,
    its record, its eval.json (and eval_random.json)."""
    from torchbeast.study import write_state

    cell.write_flags()
    record = {"status": "finished", "seconds": 1.0, "evaluated": cell.job().evaluation_record()}
    write_state(cell.folder, record)
    (cell.folder / "eval.json").write_text(json.dumps({"step": 800, "return": {"mean": 9.0}}))
    if random_return is not None:
        report = {"return": {"mean": random_return}}
        (cell.folder / "eval_random.json").write_text(json.dumps(report))


def test_a_study_moved_or_its_savedir_spelled_another_way_keeps_its_cells(tmp_path):
    # Its savedir was part of what the study is: "runs/" for "runs", or the study moved to
    # another disk, was "another study", and the line said to move its folder away.
    from torchbeast.study import StudyError, claim_folder, read_study, write_table

    path = write_study(tmp_path, "seed = [1, 2]")
    grid = claim_folder(read_study(path))
    finish_by_hand(grid.cells()[0])
    write_table(grid, grid.cells())
    (tmp_path / "disk").mkdir()
    shutil.move(tmp_path / "runs", tmp_path / "disk" / "runs")
    old = f'savedir = "{tmp_path / "runs"}"'
    for savedir in (f"{tmp_path}/disk/runs/", f"{tmp_path}/disk/./runs"):
        edit_study(path, old, f'savedir = "{savedir}"')
        old = f'savedir = "{savedir}"'
        moved = claim_folder(read_study(path))
        assert moved.folder == tmp_path / "disk" / "runs" / "grid"
        assert [cell.finished() for cell in moved.cells()] == [True, False]
        write_table(moved, moved.cells())
    edit_study(path, "total_steps = 800", "total_steps = 900")  # this is another study
    with pytest.raises(StudyError, match="holds another study .its study.json has other flags"):
        claim_folder(read_study(path))


def test_the_table_is_strict_json_and_shows_only_the_evaluations_the_study_makes(tmp_path):
    from torchbeast.study import (
        FIGURE_PREFIXES,
        SPEC_NAME,
        TABLE_COLUMNS,
        claim_folder,
        read_study,
        write_table,
    )

    path = write_study(tmp_path, "seed = [1, 2]")
    grid = claim_folder(read_study(path))
    finish_by_hand(grid.cells()[0], random_return=2.0)
    first, _ = write_table(grid, grid.cells())
    assert first["eval_return"] == 9.0 and first["random_return"] == 2.0
    # The columns no axis may take are every column the table has but the axes'.
    own = [column for column in first if column not in grid.axes]
    assert all(column in TABLE_COLUMNS or column.startswith(FIGURE_PREFIXES) for column in own)

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is no JSON")

    # A cell not run yet took NaN seconds, which jq and JavaScript refuse.
    spec = json.loads((grid.folder / SPEC_NAME).read_text(), parse_constant=no_constants)
    not_run = spec["cells"][1]
    assert not_run["status"] == "not run" and not_run["seconds"] is None
    assert table(tmp_path)[1]["seconds"] == "nan"
    # Turned off, the random policy's figures of earlier evaluations are left out.
    edit_study(path, 'runtime = "mono"', 'random_policy = false\nruntime = "mono"')
    grid = claim_folder(read_study(path))
    rows = write_table(grid, grid.cells())
    assert rows[0]["eval_return"] == 9.0
    assert not [column for row in rows for column in row if column.startswith("random_")]


def test_a_cell_folder_a_crash_left_mid_replacement_is_whole_again(tmp_path):
    # A Ray cluster's copy of a cell coming back: the old folder renamed out of the way,
    # then the new one into its place. A crash between the two left neither in place, and
    # the next command trained the cell anew and deleted the copy that held its work.
    from torchbeast.study import claim_folder, read_study, write_table

    path = write_study(tmp_path, "seed = [1, 2]")
    grid = claim_folder(read_study(path))
    for cell in grid.cells():
        finish_by_hand(cell)
    write_table(grid, grid.cells())
    folder = grid.cells()[0].folder
    shutil.copytree(folder, folder.with_name(folder.name + ".outgoing"))  # the old one
    (folder / "new").write_text("trained on the node")
    folder.rename(folder.with_name(folder.name + ".incoming"))  # the new one, not in place
    done = warm_start.run(study_command(path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("finished before, skipped") == 2
    assert (folder / "new").read_text() == "trained on the node"
    assert sorted(path.name for path in folder.parent.iterdir()) == [
        ".study.lock", "seed-1", "seed-2", "study.csv", "study.json"
    ]  # fmt: skip


def test_a_table_that_cannot_be_written_as_a_cell_ends_costs_no_other_cell(tmp_path):
    # A full disk as the first cell ended: the error left the cell's thread, and the study
    # stopped every cell it ran.
    from torchbeast.study import Progress, Runner, claim_folder, read_study, write_state

    grid = claim_folder(read_study(write_study(tmp_path, "seed = [1, 2, 3]")))

    class Recording:  # cells that end at once, as they would after training
        parallel, where, starting = 1, "here", "training"

        def run(self, cell, started):
            started()
            write_state(cell.folder, {"status": "finished"})
            return {"status": "finished"}

        def stop(self) -> None:
            raise AssertionError("the study stopped its cells")

    writes = []

    def table_on_a_full_disk(progress: Progress) -> None:
        writes.append(set(progress.running))
        if len(writes) == 2:  # as the first cell ends
            raise OSError(28, "No space left on device")

    Runner(Recording(), table_on_a_full_disk).run(grid.cells())
    assert [cell.state()["status"] for cell in grid.cells()] == ["finished"] * 3
    assert len(writes) == 6


def test_a_damaged_study_json_is_one_line_and_is_left_as_it_is(tmp_path):
    from torchbeast.study import SPEC_NAME, StudyError, claim_folder, read_study

    study = read_study(write_study(tmp_path, "seed = [1]"))
    study.folder.mkdir(parents=True)
    for damaged in ("", "{not json", "[1, 2]"):
        (study.folder / SPEC_NAME).write_text(damaged)
        with pytest.raises(StudyError, match=f"{SPEC_NAME} is damaged, so which study"):
            claim_folder(study)
        assert (study.folder / SPEC_NAME).read_text() == damaged


# Two Ray nodes on this machine, as Ray's own tests start clusters; this program prints
# the head's address, and shuts the cluster down when its stdin closes.
TWO_NODE_CLUSTER = """
import sys
import time
from ray.cluster_utils import Cluster
node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
cluster = Cluster(initialize_head=True, head_node_args=node | {"include_dashboard": False})
cluster.add_node(**node)
cluster.wait_for_nodes()
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


@pytest.mark.ray
def test_a_study_on_a_two_node_ray_cluster_runs_cells_on_both_nodes(tmp_path):
    """A head and a worker node of one CPU each, token authentication on; cells of one
    CPU, their folders copied to their node and back (--files copy, as where nodes share
    no storage)."""
    environment = os.environ | {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # a single-machine cluster, on 127.0.0.1
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    cluster = subprocess.Popen(
        [sys.executable, "-c", TWO_NODE_CLUSTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        address = cluster.stdout.readline().strip()
        assert address, "the cluster did not start"
        # A cell no node could hold is refused, where Ray would queue it forever.
        too_big = write_study(tmp_path, "seed = [1]\n[resources]\ncpus = 2", name="big")
        refused = warm_start.run(
            [sys.executable, "-m", "torchbeast.study", too_big, "--ray_address", address],
            timeout=120, env=environment,
        )  # fmt: skip
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == (
            "error: a cell asks for 2 CPUs ([resources] cpus) but the largest node of the "
            "Ray cluster has 1: lower cpus, or add a node with them"
        )
        path = write_study(tmp_path, "seed = [1, 2, 3, 4]\n[resources]\ncpus = 1")
        command = [sys.executable, "-m", "torchbeast.study", path]
        command += ["--ray_address", address, "--files", "copy"]
        done = warm_start.run(command, timeout=600, env=environment)
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on the Ray cluster's 2 node(s)" in done.stdout
    rows = table(tmp_path)
    assert [row["status"] for row in rows] == ["finished"] * 4
    folder = tmp_path / "runs" / "grid"
    states = [json.loads((folder / row["cell"] / "study_cell.json").read_text()) for row in rows]
    assert len({state["node_id"] for state in states}) == 2  # both nodes ran cells
    for row in rows:  # each cell's folder came back whole
        run = folder / row["cell"]
        assert (run / "model.tar").exists() and (run / "eval.json").exists()
        assert "of them 1 by OMP_NUM_THREADS" in (run / "out.log").read_text()
        assert int(row["steps"]) >= 800


def test_a_cell_folder_sent_back_replaces_the_old_one_but_keeps_the_replay(tmp_path):
    from torchbeast.study_cluster import pack, replace_folder

    sent = tmp_path / "sent"
    sent.mkdir()
    (sent / "model.tar").write_bytes(b"new checkpoint")
    (sent / "replay.tar").write_bytes(b"the node's replay")  # left behind: not packed
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "model.tar").write_bytes(b"old checkpoint")
    (cell / "stale.txt").write_text("gone")
    (cell / "replay.tar").write_bytes(b"the study's replay")
    replace_folder(cell, pack(sent))
    assert sorted(p.name for p in cell.iterdir()) == ["model.tar", "replay.tar"]
    assert (cell / "model.tar").read_bytes() == b"new checkpoint"
    assert (cell / "replay.tar").read_bytes() == b"the study's replay"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell", "sent"]  # nothing aside


@pytest.mark.parametrize("cut_off", [".incoming", ".outgoing"])
def test_a_replacement_cut_off_at_any_rename_is_finished_with_the_new_files(
    tmp_path, monkeypatch, cut_off
):
    from torchbeast import study_cluster
    from torchbeast.study import finish_replacing

    sent = tmp_path / "sent"
    sent.mkdir()
    (sent / "model.tar").write_bytes(b"new checkpoint")
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "model.tar").write_bytes(b"old checkpoint")
    real_replace = os.replace

    def crash_at_the_rename(source, target) -> None:  # the head killed at that point
        if str(target).endswith(cut_off) or str(source).endswith(cut_off):
            raise KeyboardInterrupt
        real_replace(source, target)

    monkeypatch.setattr(study_cluster.os, "replace", crash_at_the_rename)
    with pytest.raises(KeyboardInterrupt):
        study_cluster.replace_folder(cell, study_cluster.pack(sent))
    monkeypatch.undo()
    finish_replacing(cell)
    whole = b"old checkpoint" if cut_off == ".outgoing" else b"new checkpoint"
    assert (cell / "model.tar").read_bytes() == whole  # the old folder, or the new one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell", "sent"]


def test_a_node_sees_a_shared_study_folder_by_its_token(tmp_path):
    from torchbeast.study import read_study
    from torchbeast.study_cluster import CellWorker, study_token

    study = read_study(write_study(tmp_path, "seed = [1]"))
    study.folder.mkdir(parents=True)
    token = study_token(study)
    assert study_token(study) == token  # written once
    worker = CellWorker()
    assert worker.sees(str(study.folder), token)
    assert not worker.sees(str(study.folder), "another study's token")
    assert not worker.sees(str(tmp_path / "elsewhere"), token)


def test_an_axis_of_named_flag_sets_gives_each_cell_all_of_its_flags(tmp_path):
    from torchbeast.study import StudyError, read_study

    axes = 'reward = [{ name = "score" }, { name = "centre", move_penalty = -1.0, seed = 4 }]'
    study = read_study(write_study(tmp_path, axes))
    score, centre = study.cells()
    assert (score.name, centre.name) == ("reward-score", "reward-centre")
    assert "move_penalty" not in score.flags()  # no proxy flag at all: the game score
    assert centre.flags()["move_penalty"] == -1.0 and centre.flags()["seed"] == 4
    assert centre.labels == {"reward": "centre"}
    unnamed = write_study(tmp_path, "reward = [{ move_penalty = -1.0 }]", name="unnamed")
    with pytest.raises(StudyError, match="a set of flags needs a name"):
        read_study(unnamed)


def test_a_study_folder_expands_environment_variables_as_its_runs_savedir_does(
    tmp_path, monkeypatch
):
    from torchbeast.study import StudyError, read_study

    monkeypatch.setenv("STUDY_ROOT", str(tmp_path / "root"))
    path = write_study(tmp_path, "seed = [1]")
    edit_study(path, str(tmp_path / "runs"), "$STUDY_ROOT/logs")
    assert read_study(path).folder == tmp_path / "root" / "logs" / "grid"
    monkeypatch.delenv("STUDY_ROOT")  # a folder named "$STUDY_ROOT" in the working one
    with pytest.raises(StudyError, match=r"savedir names \$STUDY_ROOT, which is not set"):
        read_study(path)


def test_a_cell_without_num_actors_gets_the_actors_of_its_cpus_and_keeps_its_envs(tmp_path):
    from torchbeast.study import read_study

    path = write_study(tmp_path, "envs_per_actor = [4, 16]\n[resources]\ncpus = 6")
    edit_study(path, "num_actors = 1\nenvs_per_actor = 2\n", "")
    cells = read_study(path).cells()
    layouts = [(cell.flags()["num_actors"], cell.flags()["envs_per_actor"]) for cell in cells]
    assert layouts == [(3, 4), (3, 16)]  # half of 6 cores, whatever this machine has


@pytest.mark.parametrize(
    "axes, clash",
    [
        ("seed = [1, 2, 1]", "the cells seed = 1 and seed = 1 would share the folder seed-1"),
        (
            'reward = [{ name = "fuel 5" }, { name = "fuel_5" }]',
            "the cells reward = 'fuel 5' and reward = 'fuel_5' would share the folder "
            "reward-fuel_5",
        ),
        (
            'reward = [{ name = "a", seed = 1 }, { name = "a", seed = 2 }]',
            "the cells reward = 'a' and reward = 'a' would share the folder reward-a",
        ),
    ],
)
def test_a_grid_with_two_cells_of_one_folder_name_is_refused_in_one_line(tmp_path, axes, clash):
    from torchbeast.study import StudyError, read_study

    path = write_study(tmp_path, axes)
    with pytest.raises(StudyError) as refused:
        read_study(path)
    assert str(refused.value).startswith(f"{path}: {clash}: give each axis distinct values")
    assert "\n" not in str(refused.value)


def test_a_cell_name_is_an_ascii_folder_name_as_xpid_takes(tmp_path):
    from torchbeast.study import read_study

    study = read_study(write_study(tmp_path, 'reward = [{ name = "café" }, { name = "π" }]'))
    assert [cell.name for cell in study.cells()] == ["reward-caf_", "reward-_"]


def test_a_savedir_under_a_regular_file_is_one_error_line(tmp_path):
    path = write_study(tmp_path, "seed = [1]")
    (tmp_path / "file").write_text("not a folder")
    edit_study(path, str(tmp_path / "runs"), str(tmp_path / "file"))
    done = run_study(path)
    assert done.returncode == 1
    folder = tmp_path / "file" / "grid"
    assert done.stderr.startswith(f"error: Not a directory: {folder}. Check that path: --savedir")
    assert len(done.stderr.splitlines()) == 1


def test_a_cell_whose_folder_cannot_be_written_fails_and_the_others_go_on(tmp_path):
    from torchbeast.study import claim_folder, read_study, write_table

    path = write_study(tmp_path, "seed = [1, 2]")
    study = read_study(path)
    claim_folder(study)
    write_table(study, study.cells())
    for cell in study.cells():  # a file where each cell's folder would be
        cell.folder.write_text("not a folder")
    done = run_study(path)
    assert f"seed-1: failed ([Errno 17] File exists: '{study.folder / 'seed-1'}')" in done.stdout
    assert "seed-2: failed ([Errno 17] File exists" in done.stdout
    assert done.returncode == 1
    assert done.stderr.startswith("error: 2 of 2 cells failed: seed-1, seed-2 ")


def test_a_console_that_goes_away_costs_no_cell(tmp_path):
    # `study ... | head -1`: the next cell "failed" with "[Errno 32] Broken pipe" (it never
    # ran), and the study stopped with the rest not run.
    path = write_study(tmp_path, "seed = [1, 2]")
    study = subprocess.Popen(
        study_command(path), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert study.stdout.readline().startswith("Study grid: 2 cells")
    study.stdout.close()  # as head does once it has its lines
    _, stderr = study.communicate(timeout=300)
    assert study.returncode == 0, stderr
    assert [row["status"] for row in table(tmp_path)] == ["finished", "finished"]
    assert "Broken pipe" not in stderr


def test_a_finished_cell_of_an_earlier_release_is_evaluated_again_after_eval_changed(tmp_path):
    # Its record names no evaluations: it was taken as evaluated as the file now says.
    path = write_study(tmp_path, "seed = [1]")
    assert run_study(path).returncode == 0
    record = tmp_path / "runs" / "grid" / "seed-1" / "study_cell.json"
    state = json.loads(record.read_text())
    del state["evaluated"]
    record.write_text(json.dumps(state))
    edit_study(path, "num_episodes = 2", "num_episodes = 3")
    assert run_study(path).returncode == 0
    report = json.loads((record.parent / "eval.json").read_text())
    assert report["num_episodes"] == 3


@pytest.mark.parametrize("random_policy", [True, False])
def test_a_study_folder_of_the_first_releases_is_the_same_study(tmp_path, random_policy):
    # Their study.json had no [resources] (refused as "other [resources]") and no
    # random_policy (taken as evaluated with a random policy, which they had not).
    from torchbeast.study import (
        SPEC_NAME,
        claim_folder,
        only_run_of,
        read_study,
        record_earlier_evaluations,
        write_state,
        write_table,
    )

    path = write_study(tmp_path, "seed = [1]")
    grid = claim_folder(read_study(path))
    cell = grid.cells()[0]
    finish_by_hand(cell)
    write_state(cell.folder, {"status": "finished", "seconds": 1.0})  # no evaluations named
    write_table(grid, grid.cells())
    spec = json.loads((grid.folder / SPEC_NAME).read_text())
    del spec["study"]["resources"], spec["study"]["random_policy"]
    (grid.folder / SPEC_NAME).write_text(json.dumps(spec))
    if not random_policy:
        edit_study(path, 'runtime = "mono"', 'random_policy = false\nruntime = "mono"')
    study = claim_folder(read_study(path))
    with only_run_of(study):  # another command runs it: this one rewrites no record
        refused = run_study(path)
    assert refused.returncode != 0 and "is running already" in refused.stderr
    assert "evaluated" not in json.loads((cell.folder / "study_cell.json").read_text())
    with only_run_of(study):
        record_earlier_evaluations(study)
    (cell,) = study.cells()
    assert cell.finished() is not random_policy  # a random policy to evaluate, or none


def test_legitimate_values_of_the_studys_own_flags_and_a_video_folder_are_taken(tmp_path):
    from torchbeast.study import claim_folder, read_study

    # Refused by name: "the cells' training sets disable_checkpoint", of false.
    path = write_study(tmp_path, "disable_checkpoint = [false]")
    edit_study(path, "total_steps = 800", 'total_steps = 800\nmode = "train"')
    edit_study(path, "num_episodes = 2", 'num_episodes = 2\nvideo = "clips/../clips/play.gif"')
    cell = claim_folder(read_study(path)).cells()[0]
    cell.write_flags()  # its video's folder too: the evaluation failed after training
    assert (cell.folder / "clips").is_dir()


def test_a_cell_whose_folder_cannot_hold_its_record_is_failed_in_the_table(tmp_path):
    # A file where the cell's folder goes: "failed" on the console, "not run" in the
    # table, and the last line said its error was in the table.
    path = write_study(tmp_path, "seed = [1, 2]")
    assert run_study(path).returncode == 0
    cell = tmp_path / "runs" / "grid" / "seed-1"
    shutil.rmtree(cell)
    cell.write_text("not a folder")
    done = run_study(path)
    assert done.returncode == 1
    assert "seed-1 (their last error line is in the table" in done.stderr
    first, second = table(tmp_path)
    assert first["status"] == "failed" and "File exists" in first["error"]
    assert second["status"] == "finished"


def test_a_cell_whose_cpus_and_gpus_no_one_node_has_is_refused_not_queued_forever():
    # 8 CPUs and a GPU passed: the largest node had 16 CPUs, another had the GPU.
    from torchbeast.study import Resources, StudyError
    from torchbeast.study_cluster import check_fits

    def node(cpus: float, gpus: float = 0.0) -> dict:  # as ray.nodes() says it
        return {"Alive": True, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}

    nodes = [node(16), node(4, 1)]
    with pytest.raises(StudyError) as error:
        check_fits(Resources(cpus=8, gpus=1), nodes)
    assert str(error.value) == (
        "a cell asks for 8 CPUs and 1 GPUs on one node ([resources] cpus, gpus) but no node "
        "of the Ray cluster has both (its nodes: 16 CPUs and 0 GPUs, 4 CPUs and 1 GPUs): "
        "lower them, or add a node with them"
    )
    check_fits(Resources(cpus=4, gpus=1), nodes)
    check_fits(Resources(cpus=16), nodes)
    with pytest.raises(StudyError, match="asks for 2 GPUs .* the largest node .* has 1:"):
        check_fits(Resources(cpus=1, gpus=2), nodes)


def test_files_without_a_cluster_is_one_line(tmp_path):
    from torchbeast import study

    path = write_study(tmp_path, "seed = [1]")
    with pytest.raises(study.StudyError, match="^--files copy says where a Ray cluster's"):
        study.run_study(study.make_parser().parse_args([path, "--files", "copy"]))


@pytest.mark.parametrize(
    "text, file_name, said",
    [  # a traceback; an empty file trained Pong for 5M steps; "name 'my study'", unasked
        (b'name = "caf\xe9"\n', "latin1.toml", "is not a study file: TOML is UTF-8 text"),
        (b"", "empty.toml", "has no [flags] and no [axes]: nothing to study"),
        (b"[flags]\nseed = 1\n", "my study.toml", "a study is named for its file, and 'my "
         'study\' is no folder name (letters, digits, . _ -): rename the file, or give it name'),
        (b'name = ".."\n[flags]\nseed = 1\n', "up.toml", "name '..' must be a folder name"),
        # JSON's NaN in the cell's flags file: "not valid TOML", of a file the user never saw
        (b"[axes]\nlearning_rate = [nan]\n", "nan.toml", "cell learning_rate-nan's training: "
         "learning_rate = nan: must be a finite number > 0"),
    ],
)  # fmt: skip
def test_a_study_file_no_study_can_come_from_is_one_line(tmp_path, text, file_name, said):
    from torchbeast import study

    path = tmp_path / file_name
    path.write_bytes(text)
    with pytest.raises(study.StudyError) as refused:
        study.run_study(study.make_parser().parse_args([str(path), "--parallel", "1"]))
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_video_of_an_env_that_cannot_draw_is_refused_before_anything_trains(tmp_path):
    # Every cell trained whole, then failed its evaluation on the video.
    from torchbeast import study

    path = write_study(tmp_path, "seed = [1, 2]")
    edit_study(path, 'env = "CartPole-v1"', 'env = "torchbeast/PixelCue-v0"')
    edit_study(path, "num_episodes = 2", 'num_episodes = 2\nvideo = "play.gif"')
    with pytest.raises(study.StudyError) as refused:
        study.run_study(study.make_parser().parse_args([path, "--parallel", "1"]))
    assert str(refused.value) == (
        f"{path}: cell seed-1's evaluation: [eval] video: torchbeast/PixelCue-v0 cannot draw "
        "itself (its render modes are []): --video and --mode test_render need an env that "
        "renders; play it with --mode test or eval without them"
    )
    assert not (tmp_path / "runs" / "grid").exists()


def test_a_cells_video_is_recorded_in_its_folder_wherever_that_runs(tmp_path, monkeypatch):
    # Copied to a node (--files copy), a cell recorded its video at the head's path, and
    # its folder came back without it; a relative savedir was the node's own directory's.
    from torchbeast.study import claim_folder, read_study

    monkeypatch.chdir(tmp_path)
    path = write_study(tmp_path, "seed = [1]")
    edit_study(path, f'savedir = "{tmp_path / "runs"}"', 'savedir = "runs"')
    edit_study(path, "num_episodes = 2", 'num_episodes = 2\nvideo = "clips/play.gif"')
    study = claim_folder(read_study(path))
    assert study.folder == tmp_path / "runs" / "grid"  # absolute, sent to any node as it is
    job = study.cells()[0].job()
    copied = dataclasses.replace(job, savedir="/tmp/node-copy")
    trained, random = copied.evaluations()
    assert trained[-1] == "--video=/tmp/node-copy/seed-1/clips/play.gif"
    assert random[-1] == "--video=/tmp/node-copy/seed-1/clips/play_random.gif"
    # The record a copied cell brings back is the one the head compares with.
    assert copied.evaluation_record() == job.evaluation_record()


def test_a_failure_here_is_not_recorded_as_an_earlier_nodes():
    from torchbeast.study import earlier_record
    from torchbeast.study_cluster import plain

    class Cell:
        def state(self):
            return {"status": "finished", "seconds": 5.0, "node": "192.0.2.2", "node_id": "x"}

    assert earlier_record(Cell()) == {"status": "finished", "seconds": 5.0}
    assert (
        plain("\x1b[36mray::CellWorker.run()\x1b[39m (pid=8067)")
        == "ray::CellWorker.run() (pid=8067)"
    )


def test_a_study_a_cluster_refused_leaves_no_folder_behind(tmp_path):
    # It left the study's folder holding only its lock, as if the study were there.
    from torchbeast import study

    path = write_study(tmp_path, "seed = [1]")
    args = study.make_parser().parse_args([path, "--ray_address", "127.0.0.1:1"])
    with pytest.raises(study.StudyError, match="cannot reach a Ray cluster at"):
        study.run_study(args)
    assert not (tmp_path / "runs" / "grid").exists()

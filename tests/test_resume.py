"""A run killed, preempted or stopped twice comes back with its own command: real training
processes, real signals (SIGKILL as the kernel's OOM killer sends it, SIGTERM as a
scheduler does before it takes the machine)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from tests import warm_start
from tests.test_monobeast import (
    SMALL_RUN,
    STOPPED_BY_SIGTERM,
    actor_pids,
    alive,
    assert_one_error_line,
    monobeast,
    read_rows,
    wait_for,
    wait_for_rows,
)
from tests.test_polybeast import LEARNER, text

LASER = ["--replay_size", "2000", "--learn_start", "200"]


def start_run(tmp_path, *args: str, log: str = "run.log") -> subprocess.Popen:
    """MonoBeast in its own process group, as under a job scheduler (warm)."""
    command = [sys.executable, "-m", "torchbeast.monobeast", "--savedir", str(tmp_path), *args]
    with open(tmp_path / log, "w") as output:
        return warm_start.start(command, stdout=output.fileno())


def lines_with(path, fragment: str) -> list[str]:
    """The lines of the file at ``path`` that hold ``fragment`` (none before it exists)."""
    if not os.path.exists(path):
        return []
    return [line for line in text(path).splitlines() if fragment in line]


def summary(line: str, prefix: str) -> str:
    """The figures a checkpoint line carries: what follows ``prefix`` in parentheses."""
    return re.search(re.escape(prefix) + r"\S+ \((.*)\)\.$", line).group(1)


def checkpoint_files(run_dir) -> list[str]:
    """Half-written checkpoints (temp files) in the run's folder."""
    return glob.glob(os.path.join(run_dir, ".model.*.tmp"))


def test_a_killed_run_resumes_with_the_figures_of_its_last_checkpoint(tmp_path):
    run = [*SMALL_RUN, *LASER, "--total_steps", "10000000", "--xpid", "r"]
    run += ["--checkpoint_interval", "2", "--seed", "3"]
    out_log = tmp_path / "r" / "out.log"
    first = start_run(tmp_path, *run)
    try:
        wait_for_rows(out_log.parent / "logs.csv", 15)  # a replay past --learn_start
        saves = len(lines_with(out_log, "Saved LASER's replay beside it"))
        wait_for(
            lambda: len(lines_with(out_log, "Saved LASER's replay beside it")) > saves,
            60,
            "a checkpoint with a replay",
        )

        def learned_since_checkpoint() -> bool:
            saved = lines_with(out_log, "Saving checkpoint to")[-1]
            step = int(re.search(r"\(step (\d+),", saved).group(1))
            return int(read_rows(out_log.parent / "logs.csv")[-1]["step"]) > step

        # A loaded machine may take a while to the next update.
        wait_for(learned_since_checkpoint, 60, "an update after the checkpoint")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # no handler runs: what is on disk is all
        first.wait(timeout=30)
    saved_line = lines_with(out_log, "Saving checkpoint to")[-1]
    saved_replay = lines_with(out_log, "Saved LASER's replay beside it")[-1]
    saved_step = int(re.search(r"\(step (\d+),", saved_line).group(1))
    assert saved_step > 0

    logs = out_log.parent / "logs.csv"
    killed_steps = [int(row["step"]) for row in read_rows(logs)]
    assert killed_steps[-1] > saved_step  # it learned on after its last checkpoint

    second = start_run(tmp_path, *run, log="resumed.log")
    resumed_step = saved_step + 4 * 20  # one update of B=4 rollouts of T=20 steps
    try:
        wait_for(lambda: lines_with(out_log, "Resuming from"), 120, "the resume")
        wait_for(
            lambda: resumed_step in [int(row["step"]) for row in read_rows(logs)],
            60,
            "the resumed run's first update",
        )
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        assert second.wait(timeout=60) == STOPPED_BY_SIGTERM
    (resumed_line,) = lines_with(out_log, "Resuming from")
    # The step, the 100-episode window and the learning rate go on from the checkpoint.
    assert summary(resumed_line, "Resuming from ") == summary(saved_line, "Saving checkpoint to ")
    count = int(re.search(r": (\d+) of its", saved_replay).group(1))
    assert count > 0
    (restored,) = lines_with(out_log, "Restored LASER's replay")
    assert restored.endswith(f": {count} transitions.")
    # The resumed run's rows follow the checkpoint's; the killed run's rows of the steps
    # it learns again are cut, from logs.csv as from TensorBoard.
    steps = [int(row["step"]) for row in read_rows(logs)]
    assert steps == sorted(steps)
    assert steps[: steps.index(resumed_step)] == [s for s in killed_steps if s <= saved_step]
    (cut,) = lines_with(out_log, "which the checkpoint does not hold")
    assert f"held {len(killed_steps) - killed_steps.index(saved_step) - 1} rows" in cut


def test_a_damaged_logs_csv_is_one_line_and_the_finished_runs_record_stays(tmp_path):
    run = [*SMALL_RUN, "--total_steps", "400", "--xpid", "r"]
    assert monobeast(tmp_path, *run).returncode == 0
    logs, meta = tmp_path / "r" / "logs.csv", tmp_path / "r" / "meta.json"
    with open(logs, "ab") as f:
        f.write(b"\xff\xfe not text\n")
    damaged, record = logs.read_bytes(), meta.read_text()
    again = monobeast(tmp_path, *run, "--total_steps", "800")  # a traceback before
    assert_one_error_line(again, f"{logs} is not text (damaged): restore it", "move it away")
    assert logs.read_bytes() == damaged
    assert meta.read_text() == record  # it said successful: false, with no end date
    assert json.loads(record)["successful"] is True
    logs.rename(tmp_path / "damaged-logs.csv")  # as the line says: the run goes on
    moved = monobeast(tmp_path, *run, "--total_steps", "800")
    assert moved.returncode == 0, moved.stderr
    steps = [int(row["step"]) for row in read_rows(logs)]
    assert steps[0] > 400 and steps[-1] >= 800  # from the checkpoint on


def test_a_logs_csv_or_meta_json_that_is_no_file_is_one_line_and_the_run_goes_on_once_moved(
    tmp_path,
):
    # A link to /dev/full was read until memory ran out (MemoryError).
    run = [*SMALL_RUN, "--total_steps", "400", "--xpid", "r"]
    assert monobeast(tmp_path, *run).returncode == 0
    logs = tmp_path / "r" / "logs.csv"
    for name in ("meta.json", "logs.csv"):
        path = tmp_path / "r" / name
        path.rename(tmp_path / name)
        path.symlink_to("/dev/full")
        again = monobeast(tmp_path, *run, "--total_steps", "800")
        assert_one_error_line(again, f"{path} is no regular file", "away, and the run goes on")
        assert f"its checkpoint with a new {name}" in again.stderr
        assert path.is_symlink() and os.readlink(path) == "/dev/full"  # left as it was
        path.unlink()
    moved = monobeast(tmp_path, *run, "--total_steps", "800")
    assert moved.returncode == 0, moved.stderr
    assert int(read_rows(logs)[0]["step"]) > 400


def test_a_checkpoint_field_of_another_type_or_missing_is_one_line_in_every_mode(tmp_path):
    # Each was a traceback where the field was first used (flags in test mode, progress or
    # starts at resume), or blamed the model (a missing step).
    run = [*SMALL_RUN, "--total_steps", "200", "--xpid", "r"]
    assert monobeast(tmp_path, *run).returncode == 0
    path = tmp_path / "r" / "model.tar"
    trained = torch.load(path, weights_only=True)
    for key, value, mode in [
        ("progress", 5, "train"), ("starts", None, "train"), ("value_scale", None, "train"),
        ("flags", ["x"], "train"), ("flags", None, "test"), ("step", None, "train"),
    ]:  # fmt: skip
        damaged = dict(trained)
        if value is None and key == "step":
            del damaged[key]
            what = "it has no step"
        else:
            damaged[key] = value
            what = f"its {key} is {type(value).__name__}, not "
        torch.save(damaged, path)
        written = path.read_bytes()
        result = monobeast(tmp_path, *run, "--total_steps", "400", "--mode", mode)
        assert_one_error_line(result, f"{path} is damaged: {what}", "restore it from a copy")
        assert path.read_bytes() == written  # left as it was


def test_sigterm_during_a_checkpoint_write_leaves_a_whole_checkpoint(tmp_path):
    # A model of ~5M parameters: each write takes long enough to be caught in the act.
    run = [*SMALL_RUN, "--hidden_size", "1500", "--num_layers", "3", "--total_steps", "10000000"]
    run += ["--checkpoint_interval", "0.5", "--xpid", "r"]
    process = start_run(tmp_path, *run)
    run_dir = tmp_path / "r"
    try:
        wait_for_rows(run_dir / "logs.csv", 1)
        wait_for(lambda: checkpoint_files(run_dir), 60, "a checkpoint being written")
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == STOPPED_BY_SIGTERM, text(tmp_path / "run.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert_stopped_whole(tmp_path, run_dir)


def test_sigterm_twice_in_a_row_stops_once_with_a_whole_checkpoint(tmp_path):
    run = [*SMALL_RUN, "--total_steps", "10000000", "--xpid", "r"]
    process = start_run(tmp_path, *run)
    run_dir = tmp_path / "r"
    try:
        wait_for_rows(run_dir / "logs.csv", 3)
        actors = actor_pids(process.pid)
        assert actors
        os.killpg(process.pid, signal.SIGTERM)  # the whole group, as schedulers send it
        os.killpg(process.pid, signal.SIGTERM)  # and again, before the first is handled
        assert process.wait(timeout=60) == STOPPED_BY_SIGTERM, text(tmp_path / "run.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert_stopped_whole(tmp_path, run_dir)
    wait_for(lambda: not any(alive(pid) for pid in actors), 10, "actors to exit")
    # The same command is the way back.
    again = start_run(tmp_path, *run[:-4], "--total_steps", "1", "--xpid", "r", log="again.log")
    assert again.wait(timeout=120) == 0, text(tmp_path / "again.log")
    assert "Already trained to" in text(tmp_path / "again.log")


def test_a_sigterm_that_comes_while_the_first_is_handled_changes_nothing():
    # A burst of them re-entered the first's stop, inside the lock of the Event it sets:
    # the run hung for good without a checkpoint, or ended in a RecursionError.
    from torchbeast.runtime.supervision import Sigterm

    sigterm, stops = Sigterm(), []

    def stop() -> None:
        stops.append(len(stops))
        sigterm(signal.SIGTERM, None)  # the next one, delivered inside the first's stop

    sigterm.stop = stop
    sigterm(signal.SIGTERM, None)
    assert stops == [0]


def test_a_sigterm_while_torch_loads_is_the_stop_line_and_code(monkeypatch, capsys):
    # torch loaded outside the try of the one-line errors: a SIGTERM in the first second
    # of a start was a traceback and exit code 1, which a requeue loop reads as a failure.
    import builtins

    from torchbeast import cli
    from torchbeast.runtime.supervision import STOPPED_WHILE_STARTING, Stopped

    real_import = builtins.__import__

    def signalled_while_loading(name, *args, **kwargs):
        if name == "torch":
            raise Stopped(signal.SIGTERM, STOPPED_WHILE_STARTING)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", signalled_while_loading)
    assert cli.report_errors(lambda: None) == STOPPED_BY_SIGTERM
    assert capsys.readouterr().err == STOPPED_WHILE_STARTING + "\n"


def test_a_burst_of_sigterms_stops_the_run_once_with_a_whole_checkpoint(tmp_path):
    process = start_run(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "r")
    try:
        wait_for_rows(tmp_path / "r" / "logs.csv", 3)
        for _ in range(2000):  # as fast as they can go: some come while one is handled
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == STOPPED_BY_SIGTERM, text(tmp_path / "run.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert_stopped_whole(tmp_path, tmp_path / "r")


@pytest.mark.parametrize("target", ["process", "group"])
def test_a_burst_of_ctrl_cs_stops_the_run_once_with_a_whole_checkpoint(tmp_path, target):
    # Raised as KeyboardInterrupt, the later ones broke the stop of the first (in a log
    # line, in a join): the run died of SIGINT without its checkpoint, in 1 start of 4.
    # ("group": as a terminal's Ctrl-C, which reaches the actors too.)
    process = start_run(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "r")
    send = os.killpg if target == "group" else os.kill
    try:
        wait_for_rows(tmp_path / "r" / "logs.csv", 3)
        for _ in range(2000):
            with contextlib.suppress(ProcessLookupError):
                send(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 128 + signal.SIGINT, text(tmp_path / "run.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert_stopped_whole(tmp_path, tmp_path / "r", by="SIGINT")


def test_a_signal_that_comes_while_the_first_stops_the_run_changes_nothing():
    from torchbeast.runtime.supervision import FirstSignal

    stops: list[int] = []

    def stop() -> None:
        stops.append(len(stops))
        handler(signal.SIGINT, None)  # the next one, delivered inside the first's stop

    handler = FirstSignal(stop)
    handler(signal.SIGINT, None)
    handler(signal.SIGINT, None)
    assert stops == [0] and handler.received


def test_a_damaged_meta_json_is_said_and_written_anew_as_the_run_resumes(tmp_path):
    # Valid JSON of another shape ([1], "str", {"seeds": 5}) was a traceback at every
    # start: the run could not be resumed without removing the file by hand.
    run = [*SMALL_RUN, "--xpid", "r", "--seed", "3"]
    assert monobeast(tmp_path, *run, "--total_steps", "200").returncode == 0
    meta = tmp_path / "r" / "meta.json"
    date_start = json.loads(meta.read_text())["date_start"]
    for steps, damaged, said in [
        ("400", "[1]", "is damaged (not a JSON object): it is written anew."),
        ("600", json.dumps({"seeds": 5, "date_start": date_start}), "is damaged (its seeds)"),
    ]:
        meta.write_text(damaged)
        resumed = monobeast(tmp_path, *run, "--total_steps", steps)
        assert resumed.returncode == 0, resumed.stderr
        assert f"{meta} {said}" in (tmp_path / "r" / "out.log").read_text()
        record = json.loads(meta.read_text())
        assert record["successful"] and record["flags"]["total_steps"] == int(steps)
    assert record["date_start"] == date_start  # the fields that were whole are kept
    assert record["seeds"] == [None, 3]  # an earlier start's, unknown; this one's


def test_a_lock_that_is_a_folder_is_one_line_not_an_unguarded_run(tmp_path):
    (tmp_path / "r" / ".lock").mkdir(parents=True)
    result = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "200", "--xpid", "r")
    assert_one_error_line(
        result, f"{tmp_path / 'r' / '.lock'} is a folder, not the lock file", "move it away"
    )
    assert os.listdir(tmp_path / "r") == [".lock"]


def test_a_latest_that_is_no_link_is_left_as_it_is_and_said(tmp_path):
    (tmp_path / "latest").write_text("my notes\n")  # it was not updated, without a word
    assert monobeast(tmp_path, *SMALL_RUN, "--total_steps", "200", "--xpid", "r").returncode == 0
    assert (tmp_path / "latest").read_text() == "my notes\n"
    assert f"{tmp_path / 'latest'} is no link but a file or folder of its own" in text(
        tmp_path / "r" / "out.log"
    )


def test_a_second_command_on_a_run_being_trained_is_refused_and_takes_nothing(tmp_path):
    # It set the first's logs aside, and its checkpoint at its stop replaced the first's
    # (a finished run's 40080 steps became 17200).
    run = [*SMALL_RUN, "--total_steps", "10000000", "--xpid", "r"]
    first = start_run(tmp_path, *run)
    try:
        wait_for_rows(tmp_path / "r" / "logs.csv", 3)
        second = start_run(tmp_path, *run, log="second.log")
        assert second.wait(timeout=120) == 1
        assert text(tmp_path / "second.log").strip().splitlines()[-1] == (
            f"error: run r is being trained by another command (process {first.pid}) in "
            f"{tmp_path / 'r'}: wait for it to end, stop it, or give this one another --xpid"
        )
        assert not (tmp_path / "r" / "earlier").exists()  # the first's logs stay
        os.killpg(first.pid, signal.SIGTERM)
        assert first.wait(timeout=60) == STOPPED_BY_SIGTERM, text(tmp_path / "run.log")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert_stopped_whole(tmp_path, tmp_path / "r")
    again = start_run(tmp_path, *run[:-4], "--total_steps", "1", "--xpid", "r", log="again.log")
    assert again.wait(timeout=120) == 0, text(tmp_path / "again.log")  # free once it ended


def test_a_saved_replay_keeps_to_its_size_and_a_start_without_one_removes_it(tmp_path):
    # CartPole's replay.tar took 9 times --replay_checkpoint_gib (torch.save's bytes for each
    # tensor were not counted); a start without LASER left it, and a later start with LASER
    # restored its rollouts of long before, at the later step.
    cap = 100_000 / 2**30
    run = [*SMALL_RUN, "--xpid", "r"]
    laser = [*LASER, "--replay_size", "20000", "--replay_checkpoint_gib", f"{cap:.10f}"]
    assert monobeast(tmp_path, *run, *laser, "--total_steps", "6000").returncode == 0
    replay = tmp_path / "r" / "replay.tar"
    assert 0 < replay.stat().st_size <= 100_000
    plain = monobeast(tmp_path, *run, "--total_steps", "8000")
    assert plain.returncode == 0, plain.stderr
    assert not replay.exists()
    again = monobeast(tmp_path, *run, *laser, "--total_steps", "9000")
    assert again.returncode == 0, again.stderr
    assert "LASER's replay starts empty" in again.stdout
    assert "no replay.tar beside the checkpoint" in again.stdout


def assert_stopped_whole(tmp_path, run_dir, by: str = "SIGTERM") -> None:
    """The run said once where it stopped, and its checkpoint holds its last logged step."""
    output = text(tmp_path / "run.log")
    assert output.count("Stopped at step") == 1, output
    last_line = output.strip().splitlines()[-1]
    assert last_line.startswith(f"stopped by {by} at step ") and "resume" in last_line
    assert "Traceback" not in output
    state = torch.load(run_dir / "model.tar", weights_only=True)
    assert state["step"] == int(read_rows(run_dir / "logs.csv")[-1]["step"])
    assert not checkpoint_files(run_dir)


def test_sigterm_while_a_learner_waits_for_its_first_environment_stops_it(
    tmp_path, processes, sockets
):
    # A learner scheduled before its env clients: it may be taken away while it waits.
    learner_log = tmp_path / "learner.log"
    learner = processes(  # not told the env: it waits for the first to say what it is
        "torchbeast.polybeast_learner", *LEARNER[2:], "--serve", f"unix:{sockets}/learner",
        "--total_steps", "100000", "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    wait_for(lambda: "Waiting for the first environment" in text(learner_log), 60, "waiting")
    os.kill(learner.pid, signal.SIGTERM)
    assert learner.wait(timeout=30) == STOPPED_BY_SIGTERM, text(learner_log)
    lines = text(learner_log).strip().splitlines()
    assert lines[-1].startswith("stopped by SIGTERM before training began; nothing was lost")
    assert "Traceback" not in text(learner_log)
    assert not os.path.exists(tmp_path / "r" / "model.tar")  # nothing to save, none written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_resumes_from_its_checkpoint(tmp_path):
    # The checkpoint is loaded onto the learner's device, random states too, which
    # PyTorch takes from the CPU only: resuming on a GPU once failed with a traceback.
    on_cuda = [flag for flag in SMALL_RUN if flag != "--disable_cuda"]
    first = monobeast(tmp_path, *on_cuda, "--total_steps", "2000", "--xpid", "run")
    assert first.returncode == 0, first.stderr
    assert "learner on cuda" in first.stdout
    second = monobeast(tmp_path, *on_cuda, "--total_steps", "4000", "--xpid", "run")
    assert second.returncode == 0, second.stderr
    assert "Resuming from" in second.stdout

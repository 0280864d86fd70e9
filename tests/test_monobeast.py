"""MonoBeast end to end: real actor processes, real environments, real files."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests import warm_start

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A run a signal stopped before its end exits as the signal ended it, so that a scheduler
# restarts it (and the same command resumes it).
STOPPED_BY_SIGTERM = 128 + signal.SIGTERM

SMALL_RUN = [
    "--env",
    "CartPole-v1",
    "--num_actors",
    "2",
    "--envs_per_actor",
    "4",
    "--batch_size",
    "4",
    "--unroll_length",
    "20",
    "--disable_cuda",
]


def monobeast(tmp_path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torchbeast.monobeast", "--savedir", str(tmp_path), *args]
    return warm_start.run(command, timeout=timeout)


def start_monobeast(tmp_path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "torchbeast.monobeast", "--savedir", str(tmp_path), *args]
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def assert_one_error_line(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """The run failed with exit code 1 and exactly one stderr line naming ``fragments``."""
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(fragment in lines[0] for fragment in fragments), lines[0]


def read_rows(path) -> list[dict[str, str]]:
    with open(path) as f:
        lines = f.read().splitlines()
    rows, fields = [], None
    for line in lines:
        if line.startswith("# "):
            fields = line[2:].split(",")
        else:
            rows.append(dict(zip(fields, next(csv.reader([line])), strict=True)))
    return rows


def live_processes(field: int, value: int) -> list[int]:
    """Live processes whose /proc stat ``field`` (after the name) equals ``value``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[field]) == value and fields[0] != "Z":
            found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid``, from /proc."""
    return live_processes(1, pid)  # field 1: the parent's pid


def processes_in_group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``, from /proc."""
    return live_processes(2, pgid)  # field 2: the process group


def cmdline_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def is_fork_server(child: int, pid: int) -> bool:
    """Whether ``child`` of ``pid`` is the server its actors fork from: ``pid`` forked
    (whose command line it keeps), or one multiprocessing spawned."""
    cmdline = cmdline_of(child)
    return "forkserver" in cmdline or cmdline == cmdline_of(pid)


def forkserver_pid(pid: int) -> int | None:
    """The server that the run ``pid`` forks its actors from, if it is running."""
    servers = [child for child in children_of(pid) if is_fork_server(child, pid)]
    return servers[0] if servers else None


def actor_pids(pid: int) -> list[int]:
    """The processes that ``pid`` started with multiprocessing: spawned, or forked by its
    fork server (whose children they are)."""
    pids = []
    for child in children_of(pid):
        cmdline = cmdline_of(child)
        if is_fork_server(child, pid):
            pids.extend(children_of(child))
        elif "multiprocessing" in cmdline and "resource_tracker" not in cmdline:
            pids.append(child)
    return pids


def inference_pid(out_log) -> int:
    """The central inference process's pid, as the run's log says it."""
    found = re.search(r"Central inference runs in process ([0-9]+)", out_log.read_text())
    assert found is not None, out_log.read_text()
    return int(found.group(1))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def status_lines(pid: int, *names: str) -> list[str]:
    """The lines of /proc/PID/status named ``names``, and the threads' kernel waits."""
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = [line.strip() for line in f if line.split(":")[0] in names]
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/wchan") as f:
                lines.append(f"{thread} waits in {f.read() or '-'}")
        return lines
    except OSError as error:
        return [str(error)]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_rows(path, count: int, timeout: float = 60) -> None:
    wait_for(lambda: os.path.exists(path) and len(read_rows(path)) >= count, timeout, "log rows")


def test_training_writes_the_torchbeast_run_folder(tmp_path):
    result = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "4000", "--xpid", "run")
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    assert os.readlink(tmp_path / "latest") == "run"
    with open(run / "logs.csv") as f:
        header = f.readline().strip()
    assert header.startswith(
        "# _tick,_time,step,total_loss,mean_episode_return,pg_loss,baseline_loss,entropy_loss"
    )
    rows = read_rows(run / "logs.csv")
    assert int(rows[-1]["step"]) >= 4000
    assert [int(r["step"]) for r in rows] == sorted(int(r["step"]) for r in rows)
    assert (run / "fields.csv").read_text().strip() == header[2:]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["flags"]["env"] == "CartPole-v1" and meta["successful"] is True
    assert meta["date_end"] and meta["versions"]["torch"]
    assert "env" not in meta and "PATH" not in json.dumps(meta)
    assert "Learning finished" in (run / "out.log").read_text()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(run))
    state = torch.load(run / "model.tar", weights_only=True)
    assert state["step"] == int(rows[-1]["step"])
    assert {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict", "flags"} <= set(
        state
    )


def test_training_again_resumes_from_the_checkpoint(tmp_path):
    first = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "2000", "--xpid", "run")
    assert first.returncode == 0, first.stderr
    steps_before = torch.load(tmp_path / "run" / "model.tar", weights_only=True)["step"]

    second = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "5000", "--xpid", "run")
    assert second.returncode == 0, second.stderr
    assert f"Resuming from {tmp_path / 'run' / 'model.tar'} (step {steps_before}," in second.stdout
    rows = read_rows(tmp_path / "run" / "logs.csv")
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] >= 5000
    # The first update after resuming continues the count instead of starting again.
    assert steps_before + 80 in steps
    ticks = [int(r["_tick"]) for r in rows]
    assert ticks == list(range(len(rows)))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert len(meta["dates_resumed"]) == 1 and meta["date_start"] < meta["dates_resumed"][0]
    # Each start drew its own seed; meta.json keeps both, in order (the flags: this one's).
    first_seed = re.search(r"Seed: (\d+) \(drawn", first.stdout).group(1)
    assert meta["seeds"] == [int(first_seed), meta["flags"]["seed"]]

    # The same xpid with another environment: one line, and the checkpoint is kept.
    saved = (tmp_path / "run" / "model.tar").read_bytes()
    other = monobeast(tmp_path, *SMALL_RUN, "--env", "Acrobot-v1", "--xpid", "run")
    assert_one_error_line(other, "trained on CartPole-v1, not Acrobot-v1", "--env CartPole-v1")
    assert (tmp_path / "run" / "model.tar").read_bytes() == saved


def test_test_mode_plays_whole_episodes_greedily(tmp_path):
    trained = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "2000", "--xpid", "run")
    assert trained.returncode == 0, trained.stderr
    result = monobeast(
        tmp_path, "--env", "CartPole-v1", "--mode", "test", "--xpid", "run", "--num_episodes", "3"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Episode ") == 3
    assert "Average returns over 3 episodes" in result.stdout


def test_test_mode_without_a_checkpoint_is_one_clear_error(tmp_path):
    result = monobeast(tmp_path, "--env", "CartPole-v1", "--mode", "test", "--xpid", "missing")
    assert_one_error_line(result, "no checkpoint at", "missing")


def test_test_mode_with_another_model_is_one_clear_error(tmp_path):
    trained = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "1000", "--xpid", "run")
    assert trained.returncode == 0, trained.stderr
    result = monobeast(
        tmp_path, "--env", "CartPole-v1", "--mode", "test", "--xpid", "run", "--use_lstm"
    )
    assert_one_error_line(result, "use_lstm")


def test_a_savedir_that_is_a_file_is_one_line_naming_the_flag(tmp_path):
    (tmp_path / "afile").write_text("")
    result = monobeast(tmp_path / "afile", *SMALL_RUN, "--total_steps", "200", "--xpid", "r")
    assert_one_error_line(result, "Not a directory", "--savedir (a study's savedir) must be a")


def test_unknown_env_is_one_clear_error(tmp_path):
    result = monobeast(tmp_path, "--env", "NoSuchGame-v9", "--xpid", "run")
    assert_one_error_line(result, "NoSuchGame-v9", "python -m torchbeast.envs")


@pytest.mark.parametrize("inference", [[], ["--central_inference"]], ids=["actors", "central"])
def test_killed_actor_is_replaced_and_training_goes_on(tmp_path, inference):
    # With central inference the replacement is served through a pipe of its own.
    args = [*SMALL_RUN, *inference, "--total_steps", "10000000", "--xpid", "run"]
    process = start_monobeast(tmp_path, *args)
    try:
        logs = tmp_path / "run" / "logs.csv"
        wait_for_rows(logs, 3)
        server = inference_pid(tmp_path / "run" / "out.log") if inference else None

        def actors() -> list[int]:
            return [pid for pid in actor_pids(process.pid) if pid != server]

        victims = actors()
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        wait_for(
            lambda: len(actors()) == 2 and victims[0] not in actors(),
            30,
            "a new actor",
        )
        rows_after_kill = len(read_rows(logs))
        wait_for_rows(logs, rows_after_kill + 20)
        assert "died (exit code -9)" in (tmp_path / "run" / "out.log").read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM


def test_sigterm_saves_a_checkpoint_and_leaves_no_process(tmp_path):
    process = start_monobeast(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "run")
    logs = tmp_path / "run" / "logs.csv"
    try:
        wait_for_rows(logs, 3)
        actors = actor_pids(process.pid)
        assert actors
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["step"] == int(read_rows(logs)[-1]["step"])
    wait_for(lambda: not any(alive(pid) for pid in actors), 10, "actors to exit")


def signals_of(pid: int, which: str) -> set[int]:
    """The signals that process ``pid`` ignores (``which`` "SigIgn") or blocks ("SigBlk"),
    from /proc."""
    with open(f"/proc/{pid}/status") as f:
        (mask,) = [line.split()[1] for line in f if line.startswith(f"{which}:")]
    return {number for number in range(1, 65) if int(mask, 16) >> (number - 1) & 1}


def test_actors_fork_from_a_server_that_imported_torch_and_goes_with_the_run(tmp_path):
    # Each spawned actor imported torch anew (~1.5 s of CPU), and began with Ctrl-C's
    # KeyboardInterrupt until it set its handlers; one restarted by the dispatcher thread
    # could not be started otherwise.
    process = start_monobeast(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "r")
    try:
        wait_for_rows(tmp_path / "r" / "logs.csv", 3)
        server = forkserver_pid(process.pid)
        assert server is not None and set(actor_pids(process.pid)) == set(children_of(server))
        assert len(children_of(server)) == 2
        with open(f"/proc/{server}/maps") as f:
            assert "libtorch_cpu" in f.read()  # the actors fork with torch imported
        # A stop signal to the process group is the learner's to act on, never the server's.
        assert {signal.SIGINT, signal.SIGTERM} <= signals_of(server, "SigIgn")
        victim = children_of(server)[0]
        os.kill(victim, signal.SIGKILL)  # its replacement forks from the server too
        wait_for(lambda: len(children_of(server)) == 2 and victim not in children_of(server),
                 30, "a new actor")  # fmt: skip
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    wait_for(lambda: not alive(server), 10, "the fork server to exit with the run")


def test_the_fork_server_is_the_run_forked_and_a_run_killed_outright_takes_it_along(tmp_path):
    # The server was a new interpreter that imported torch again: ~1.8 s of CPU a run.
    process = start_monobeast(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "r")
    try:
        wait_for_rows(tmp_path / "r" / "logs.csv", 3)
        server = forkserver_pid(process.pid)
        assert server is not None
        assert cmdline_of(server) == cmdline_of(process.pid)  # forked, never exec'd
        assert not {signal.SIGINT, signal.SIGTERM} & signals_of(server, "SigBlk")  # as if spawned
        actors = children_of(server)
        assert len(actors) == 2
        # Nothing of the run's is held open by them: its lock file stayed locked by them.
        for pid in (server, *actors):
            held = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert not [path for path in held if path.startswith(str(tmp_path))], held
    finally:
        process.kill()  # no handler runs: only the pipe that says the run lives closes
        process.wait(timeout=60)
    wait_for(lambda: not alive(server) and not any(alive(pid) for pid in actors), 15,
             "the fork server and its actors to exit with the run")  # fmt: skip


def test_where_no_fork_server_can_start_the_actors_are_spawned_and_it_is_said(tmp_path):
    # A fork server listens on a Unix socket in $TMPDIR, whose path is at most 107 bytes.
    long_tmpdir = tmp_path / ("t" * 110)
    long_tmpdir.mkdir()
    command = [sys.executable, "-m", "torchbeast.monobeast", "--savedir", str(tmp_path)]
    command += [*SMALL_RUN, "--total_steps", "400", "--xpid", "r"]
    env = {**os.environ, "TMPDIR": str(long_tmpdir)}
    result = warm_start.run(command, env=env, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "Children are spawned, each importing torch anew: no fork server could start " in (
        result.stdout
    )
    assert int(read_rows(tmp_path / "r" / "logs.csv")[-1]["step"]) >= 400


def test_a_batch_larger_than_the_whole_run_is_said_and_the_run_ends_after_one_update(tmp_path):
    # Silent before: a mistyped --batch_size waited for hours on its first batch.
    run = [*SMALL_RUN, "--total_steps", "40", "--num_learner_threads", "1", "--xpid", "run"]
    result = monobeast(tmp_path, *run)
    assert result.returncode == 0, result.stderr
    assert (
        "One update learns from --batch_size 4 x --unroll_length 20 = 80 steps, more than "
        "--total_steps 40: the run ends after one update per learner thread." in result.stdout
    )
    assert [row["step"] for row in read_rows(tmp_path / "run" / "logs.csv")] == ["80"]


def test_a_run_without_checkpoints_stopped_by_sigterm_says_the_command_starts_again(tmp_path):
    run = [*SMALL_RUN, "--total_steps", "10000000", "--disable_checkpoint", "--xpid", "run"]
    process = start_monobeast(tmp_path, *run)
    try:
        wait_for_rows(tmp_path / "run" / "logs.csv", 3)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    # It said "run the same command to resume", which started from step 0.
    assert "no checkpoint (--disable_checkpoint): run the same command to start again" in output
    # Resumed with --disable_checkpoint, it said "no checkpoint (--disable_checkpoint): run
    # the same command to resume", of the checkpoint it resumed from, which it kept as it was.
    assert monobeast(tmp_path, *SMALL_RUN, "--total_steps", "80", "--xpid", "saved").returncode == 0
    rows = len(read_rows(tmp_path / "saved" / "logs.csv"))
    step = torch.load(tmp_path / "saved" / "model.tar", weights_only=True)["step"]
    process = start_monobeast(tmp_path, *run[:-1], "saved")
    try:
        wait_for_rows(tmp_path / "saved" / "logs.csv", rows + 2)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    assert (
        f"the checkpoint {tmp_path / 'saved' / 'model.tar'} holds step {step}, where this run "
        "resumed (--disable_checkpoint saved nothing since): run the same command to resume"
    ) in output


def test_a_run_named_for_its_start_time_says_which_xpid_resumes_it(tmp_path):
    # "run the same command to resume": the same command drew a new name and began anew.
    process = start_monobeast(tmp_path, *SMALL_RUN, "--total_steps", "10000000")
    try:
        wait_for(lambda: os.path.islink(tmp_path / "latest"), 60, "the run's folder")
        wait_for_rows(tmp_path / os.readlink(tmp_path / "latest") / "logs.csv", 3)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    xpid = os.readlink(tmp_path / "latest")
    assert re.fullmatch(r"torchbeast-\d{8}-\d{6}", xpid)
    assert f"run it again with --xpid {xpid} (or --xpid latest) to resume" in output
    again = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "100", "--xpid", "latest")
    assert (
        again.returncode == 0 and f"Resuming from {tmp_path / xpid / 'model.tar'}" in again.stdout
    )


def test_killed_learner_leaves_no_orphan_actor(tmp_path):
    process = start_monobeast(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "run")
    try:
        wait_for_rows(tmp_path / "run" / "logs.csv", 3)
        actors = actor_pids(process.pid)
        assert actors
    finally:
        process.kill()
        process.wait(timeout=30)
    try:
        wait_for(lambda: not any(alive(pid) for pid in actors), 20, "orphan actors to exit")
    except AssertionError as error:  # seen once under load: say what they were doing
        left = {pid: status_lines(pid, "State", "PPid") for pid in actors if alive(pid)}
        raise AssertionError(f"{error}: {left}") from None


def test_non_finite_loss_stops_training_and_keeps_good_weights(tmp_path):
    result = monobeast(
        tmp_path,
        *SMALL_RUN,
        "--env",
        "tests.envs_for_tests:OverflowReward-v0",
        "--reward_clipping",
        "none",
        "--total_steps",
        "1000000",
        "--xpid",
        "run",
    )
    assert_one_error_line(result, "loss became inf")
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["step"] > 0
    assert all(torch.isfinite(t).all() for t in state["model_state_dict"].values())


def test_an_environment_that_observes_nan_is_named_as_the_cause(tmp_path):
    # The line blamed the learning rate ("its weights broke ... lower --learning_rate").
    result = monobeast(
        tmp_path, *SMALL_RUN, "--env", "tests.envs_for_tests:NanObservation-v0",
        "--total_steps", "1000000", "--xpid", "run",
    )  # fmt: skip
    assert_one_error_line(result, "the environment's observations hold NaN or inf")


def test_a_run_stopped_by_a_non_finite_loss_saves_no_replay_of_what_broke_it(tmp_path):
    # Else the same command, once the env is mended, would replay those rollouts and stop.
    # One learner thread: with two, the other's batch (of the other 4 of the 8 envs) may
    # break an update too as the run stops, and each forgets all it stored of its culprits'
    # envs, leaving nothing to check here (1 run in 5).
    result = monobeast(
        tmp_path, *SMALL_RUN, "--env", "tests.envs_for_tests:OverflowReward-v0",
        "--reward_clipping", "none", "--total_steps", "1000000", "--xpid", "run",
        "--replay_size", "20000", "--learn_start", "400", "--num_learner_threads", "1",
    )  # fmt: skip
    assert_one_error_line(result, "loss became inf")
    replay = torch.load(tmp_path / "run" / "replay.tar", weights_only=True)
    rewards = torch.cat([segment["steps"]["reward"] for segment in replay["segments"]])
    assert len(rewards) > 400 and rewards.abs().max() < 1e29


def test_laser_replay_adds_replayed_rollouts_and_counts_online_steps_only(tmp_path):
    # Whether it learns is `make learn`'s cartpole-laser check; this is what it logs.
    result = monobeast(
        tmp_path,
        *("--replay_size", "5000", "--replay_ratio", "1", "--learn_start", "1000"),
        *("--env", "CartPole-v1", "--num_actors", "2", "--envs_per_actor", "4"),
        *("--batch_size", "4", "--unroll_length", "20", "--total_steps", "4000"),
        *("--disable_cuda", "--xpid", "laser"),
    )
    assert result.returncode == 0, result.stderr
    rows = read_rows(tmp_path / "laser" / "logs.csv")
    assert int(rows[0]["replayed_columns"]) == 0  # nothing to replay before --learn_start
    assert int(rows[-1]["replayed_columns"]) == 4  # B * replay_ratio
    steps = [int(row["step"]) for row in rows]
    assert {b - a for a, b in zip(steps, steps[1:], strict=False)} == {4 * 20}  # online only


def test_a_replay_smaller_than_a_rollout_is_one_clear_error(tmp_path):
    # It counts transitions: a user who counted rollouts got a replay that never held one.
    result = monobeast(tmp_path, *SMALL_RUN, "--replay_size", "19", "--xpid", "run")
    assert_one_error_line(
        result,
        "--replay_size 19 counts transitions (steps), fewer than one rollout of "
        "--unroll_length 20: it would never hold one; give at least 20",
    )
    assert not (tmp_path / "run").exists()


def test_laser_flags_without_a_replay_are_said_to_do_nothing(tmp_path):
    result = monobeast(
        tmp_path, *SMALL_RUN, "--replay_ratio", "7", "--learn_start", "100", "--total_steps",
        "200", "--xpid", "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        "--replay_ratio 7 --learn_start 100: LASER's replay is off (--replay_size 0), so they "
        "do nothing; give --replay_size N (transitions) to turn it on." in result.stdout
    )
    plain = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "200", "--xpid", "plain")
    assert "LASER" not in plain.stdout


def test_a_replay_too_large_for_this_machine_is_one_clear_error(tmp_path):
    result = monobeast(tmp_path, "--replay_size", str(10**9), "--xpid", "run")
    assert_one_error_line(result, "--replay_size 1000000000 needs about", "use --replay_size")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_rollouts_too_large_for_this_machine_are_one_clear_error(tmp_path):
    # They were allocated until the kernel killed the run, with no word (exit 137).
    result = monobeast(tmp_path, *SMALL_RUN, "--unroll_length", str(10**8), "--xpid", "run")
    assert_one_error_line(
        result, "rollouts of --unroll_length 100000000", "give a shorter --unroll_length"
    )


def test_rollouts_of_too_many_envs_for_this_machine_name_the_envs_not_the_batch(tmp_path):
    # The line said to lower --unroll_length or --batch_size, which could not help.
    result = monobeast(
        tmp_path, "--env", "PongNoFrameskip-v4", "--num_actors", "8", "--envs_per_actor",
        str(10**7), "--batch_size", "16", "--unroll_length", "5", "--xpid", "run",
    )  # fmt: skip
    assert_one_error_line(
        result,
        "(--num_buffers, derived from --num_actors 8, --envs_per_actor 10000000 and "
        "--batch_size 16) need about",
        "envs in all (--num_actors x --envs_per_actor)",
    )


@pytest.mark.parametrize(
    "env, model_flags",
    [
        ("PongNoFrameskip-v4", ["--use_lstm"]),
        ("PongNoFrameskip-v4", ["--use_resnet"]),
        ("MinAtar/Breakout-v1", []),
    ],
)
def test_trains_and_tests_briefly(tmp_path, env, model_flags):
    short = ["--env", env, *model_flags, "--xpid", "run", "--disable_cuda"]
    trained = monobeast(
        tmp_path,
        *short,
        "--num_actors",
        "2",
        "--envs_per_actor",
        "2",
        "--batch_size",
        "2",
        "--unroll_length",
        "20",
        "--total_steps",
        "200",
    )
    assert trained.returncode == 0, trained.stderr
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert int(rows[-1]["step"]) >= 200
    assert all(float(row["total_loss"]) == float(row["total_loss"]) for row in rows)
    if env.startswith("MinAtar"):  # Atari games are too long to play in a test
        tested = monobeast(tmp_path, *short, "--mode", "test", "--num_episodes", "2")
        assert tested.returncode == 0, tested.stderr
        assert "Average returns over 2 episodes" in tested.stdout


def test_test_mode_works_with_lstm(tmp_path):
    lstm_run = [*SMALL_RUN, "--use_lstm", "--xpid", "run"]
    trained = monobeast(tmp_path, *lstm_run, "--total_steps", "1000")
    assert trained.returncode == 0, trained.stderr
    tested = monobeast(tmp_path, *lstm_run, "--mode", "test", "--num_episodes", "2")
    assert tested.returncode == 0, tested.stderr
    assert "Average returns over 2 episodes" in tested.stdout


def test_float64_observations_are_learned_from_as_float32(tmp_path):
    result = monobeast(
        tmp_path,
        *SMALL_RUN,
        "--env",
        "tests.envs_for_tests:Float64Observation-v0",
        "--total_steps",
        "500",
        "--xpid",
        "run",
    )
    assert result.returncode == 0, result.stderr


def test_an_envs_episode_extras_reach_logs_csv_and_eval_json_by_name(tmp_path):
    coins = "tests.envs_for_tests:Coins-v0"  # 2 coins a step, episodes of 10 steps
    result = monobeast(
        tmp_path, *SMALL_RUN, "--env", coins, "--total_steps", "800", "--xpid", "run"
    )
    assert result.returncode == 0, result.stderr
    rows = [row for row in read_rows(tmp_path / "run" / "logs.csv") if row["episodes"] != "0"]
    assert rows and all(float(row["mean_episode_coins"]) == 20.0 for row in rows)
    evaluated = monobeast(
        tmp_path, "--env", coins, "--mode", "eval", "--xpid", "run", "--num_episodes", "2"
    )
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["coins"] == {"mean": 20.0, "std": 0.0}
    assert [episode["coins"] for episode in report["episodes"]] == [20.0, 20.0]
    assert "coins_per_step" not in report  # returns only (*_return) are also given per step


def test_actors_that_keep_dying_stop_training_with_one_line(tmp_path):
    result = monobeast(
        tmp_path,
        *SMALL_RUN,
        "--env",
        "tests.envs_for_tests:SelfKilling-v0",
        "--num_actors",
        "1",  # the budget is per actor: one actor's 3 deaths a minute end the run soonest
        "--total_steps",
        "1000000",
        "--xpid",
        "run",
    )
    assert_one_error_line(result, "actors keep dying")


def test_sigterm_to_the_process_group_stops_without_restarting_actors(tmp_path):
    command = [sys.executable, "-m", "torchbeast.monobeast", "--savedir", str(tmp_path)]
    process = subprocess.Popen(
        [*command, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "run"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as under a job scheduler
    )
    try:
        wait_for_rows(tmp_path / "run" / "logs.csv", 3)
        actors = actor_pids(process.pid)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == STOPPED_BY_SIGTERM
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "died" not in out_log and "Stopped at step" in out_log
    assert (tmp_path / "run" / "model.tar").exists()
    wait_for(lambda: not any(alive(pid) for pid in actors), 10, "actors to exit")


def test_resuming_with_another_optimizer_is_one_clear_error(tmp_path):
    first = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "160", "--xpid", "run")
    assert first.returncode == 0, first.stderr
    again = [*SMALL_RUN, "--total_steps", "320", "--xpid", "run", "--optimizer", "adam"]
    assert_one_error_line(monobeast(tmp_path, *again), "--optimizer rmsprop, not adam")


# MonoBeast's main, then what of the run is still there: its child processes (the fork
# server the actors start from would be one) and whether its learner was built (the first
# optimizer imports torch's compiler).
REFUSED_RUN = """
import os, sys
from tests.test_monobeast import children_of
from torchbeast import monobeast
code = monobeast.main(sys.argv[1:])
print(code, len(children_of(os.getpid())), "torch._dynamo" in sys.modules)
"""


def test_a_checkpoint_the_run_refuses_stops_it_before_it_builds_or_starts_anything(tmp_path):
    # It was refused once the learner was built and the actors' fork server had started
    # (4.7 s of CPU here for one line, against 1.9 s now).
    first = monobeast(tmp_path, *SMALL_RUN, "--total_steps", "160", "--xpid", "run")
    assert first.returncode == 0, first.stderr
    again = [*SMALL_RUN, "--savedir", str(tmp_path), "--xpid", "run", "--optimizer", "adam"]
    result = subprocess.run(
        [sys.executable, "-c", REFUSED_RUN, *again],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "--optimizer rmsprop, not adam" in result.stderr
    assert result.stdout.split() == ["1", "0", "False"], result.stderr


def test_monobeast_loads_neither_grpc_nor_ray():
    # Errors a user can fix share one base class, so the CLI needs no runtime's module.
    code = "import sys, torchbeast.monobeast; print(sorted({'grpc', 'ray'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_model_too_large_for_the_machine_is_one_line_before_it_is_built(tmp_path):
    # --hidden_size 100000 (a typo for 1000): an allocation's traceback of 40 GB.
    result = monobeast(tmp_path, "--env", "CartPole-v1", "--hidden_size", "100000", "--xpid", "r")
    assert_one_error_line(
        result,
        "the mlp model (--hidden_size 100000, --num_layers 2) has 10,000,900,012 parameters",
        "give a smaller --hidden_size (or --num_layers)",
    )
    assert not (tmp_path / "r").exists()

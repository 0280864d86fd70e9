"""Learning checks that run in CI: PixelCue, a synthetic pixel task, learned through the
conv torso and each runtime's data path (MonoBeast, PolyBeast, RayBeast) in a minute.

A uniform policy scores 0.25 per episode; every runtime must reach 0.8 over its last 100
episodes. A pipeline that lines actions up with the wrong frames stays near 0.25.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import warm_start
from tests.test_monobeast import alive, children_of, wait_for
from torchbeast import learncheck
from torchbeast.config.flags import parse_flags
from torchbeast.curves import read_logs
from torchbeast.envs import create_env
from torchbeast.envs.cue import ENV_ID

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAR = 0.8
PIXELCUE = learncheck.CHECKS["pixelcue"]
# The learning check's run, for every runtime.
RUN = ["--env", ENV_ID, "--total_steps", str(PIXELCUE.steps), "--seed", "1", *PIXELCUE.flags]
RUN += ["--disable_cuda"]
DIAGNOSTICS = (
    "policy_entropy",
    "policy_kl",
    "clipped_rho_fraction",
    "explained_variance",
    "policy_lag",
    "grad_norm",
)


def play(policy, episodes: int = 200, seed: int = 0) -> float:
    """Mean return of ``policy(frame, previous_frame) -> action`` over PixelCue episodes."""
    env = create_env(ENV_ID)
    output = env.reset(seed=seed)
    previous = output["frame"].copy()
    returns = []
    try:
        while len(returns) < episodes:
            frame = output["frame"]
            output = env.step(np.array([policy(frame[0], previous[0])]))
            previous = frame.copy()
            if output["episode_end"][0]:
                returns.append(float(output["episode_return"][0]))
    finally:
        env.close()
    return float(np.mean(returns))


def lit_quadrant(frame: np.ndarray) -> int:
    """The number of the lit quadrant of a [4, 84, 84] frame."""
    top, left = frame[0, :42].any(), frame[0, :, :42].any()
    return (0 if top else 2) + (0 if left else 1)


def test_pixel_cue_pays_a_perfect_policy_1_and_a_uniform_one_a_quarter():
    rng = np.random.default_rng(0)
    assert play(lambda frame, _: lit_quadrant(frame)) == 1.0
    assert play(lambda *_: int(rng.integers(4))) == pytest.approx(0.25, abs=0.05)


def test_pixel_cue_gives_nothing_for_answering_the_previous_frame():
    # What a pipeline that shifts actions by one step would learn at best.
    assert play(lambda _, previous: lit_quadrant(previous)) == pytest.approx(0.25, abs=0.05)


def check_learned(run_dir: str) -> None:
    logs = read_logs(run_dir)
    assert np.nansum(logs["episodes"]) >= 100
    assert learncheck.mean_of_last_episodes(logs) >= BAR
    for name in DIAGNOSTICS:
        assert np.isfinite(logs[name]).all(), name
    entropy = logs["policy_entropy"]
    assert entropy[0] > 1.2 and entropy[-1] < 0.5  # from near uniform (ln 4) to decided
    # The actors' weights follow the learner's: a few updates behind, not all of them.
    assert 0 <= np.mean(logs["policy_lag"]) <= 15
    assert logs["policy_lag"][-1] < len(logs["step"]) / 2


def run(module: str, tmp_path, *args: str, timeout: float = 300) -> str:
    command = [sys.executable, "-m", module, *RUN, "--savedir", str(tmp_path), *args]
    result = warm_start.run(command, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return os.path.join(tmp_path, "run")


def test_monobeast_learns_pixel_cue_through_the_learning_check_command(tmp_path, capsys):
    # Any other flag goes to the run: here one whose effect shows in the logs.
    assert learncheck.main(["pixelcue", "--savedir", str(tmp_path), "--normalize_values"]) == 0
    assert "pixelcue: " in capsys.readouterr().out
    run_dir = os.path.join(tmp_path, "learncheck-pixelcue")
    check_learned(run_dir)
    with open(os.path.join(run_dir, "meta.json")) as f:
        assert json.load(f)["flags"]["normalize_values"] is True
    # PixelCue's returns are at most 1: the baseline's scale stays at its floor.
    assert (read_logs(run_dir)["value_scale"] == 1.0).all()


def test_learning_check_takes_the_mean_of_the_last_100_episodes():
    logs = {
        "episodes": np.array([50.0, 0.0, 60.0, 40.0]),
        "mean_episode_return": np.array([9.0, np.nan, 1.0, 2.0]),
    }
    # The last 100: 40 at 2.0 and 60 at 1.0 (the first row is older).
    assert learncheck.mean_of_last_episodes(logs) == pytest.approx(1.4)
    assert np.isnan(learncheck.mean_of_last_episodes({"episodes": np.zeros(2)}))


def test_a_best_check_takes_the_best_100_episode_mean_the_run_reached():
    logs = {
        "episodes": np.array([60.0, 40.0, 0.0, 50.0, 50.0, 100.0]),
        "mean_episode_return": np.array([1.0, 3.0, np.nan, 9.0, 0.0, 0.0]),
    }
    # The last 100 episodes (whole rows) after each row: 1.8 after row 1, 4.2 after row 3
    # (150 episodes back to row 0), 4.5 after row 4 (50 at 0 and 50 at 9), 0 after row 5.
    assert learncheck.best_mean_of_episodes(logs) == pytest.approx(4.5)
    assert learncheck.mean_of_last_episodes(logs) == pytest.approx(0.0)
    assert np.isnan(learncheck.best_mean_of_episodes({"episodes": np.array([30.0, 20.0])}))


def test_learning_checks_run_on_the_layout_their_bands_were_set_with(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    command = learncheck.CHECKS["cartpole"].command("runs", "check")
    flags = parse_flags(command[command.index("--env") :])
    assert (flags.num_actors, flags.envs_per_actor, flags.batch_size) == (2, 8, 16)


def test_learning_check_refuses_an_unknown_check(capsys):
    with pytest.raises(SystemExit):
        learncheck.main(["nosuchcheck"])
    assert "unknown check 'nosuchcheck'" in capsys.readouterr().err


@pytest.mark.parametrize("runtime", ["mono", "poly", "ray"])
def test_a_flag_passed_on_that_the_runs_refuse_is_one_line_before_any_run(capsys, runtime):
    # Each check's run failed on its own, one stdout line per check, exit 1.
    for check in learncheck.CHECKS:  # every check's own command parses as its run's
        learncheck.check_flags([check], "/tmp/unused", (), runtime)
    with pytest.raises(SystemExit) as stopped:
        learncheck.main(["--runtime", runtime, "--learning_rate=-1"])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error: argument --learning_rate: must be a finite number > 0" in captured.err


@pytest.mark.parametrize(
    "passed, refusal",
    [  # each ran every check to its failure, or ended in a traceback (--xpid), or printed
        # one check's settings and exited 0, "every check passed" (--print_settings)
        (["--xpid", "mine"], "--xpid cannot be passed on to the checks: each check names"),
        (["--env=CartPole-v1"], "--env cannot be passed on to the checks"),
        (["--print_settings"], "--print_settings cannot be passed on to the checks"),
        (["--num_episodes", "3"], "--num_episodes counts the games of --mode test and eval"),
        (["--video", "play.gif"], "--video records the games of --mode test and eval"),
        (["--random_policy"], "--random_policy plays in --mode test and eval"),
    ],
)
def test_a_flag_the_checks_cannot_take_is_one_line_before_any_run(capsys, passed, refusal):
    with pytest.raises(SystemExit) as stopped:
        learncheck.main(["pixelcue", "cartpole", *passed])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and refusal in captured.err


def test_the_savedir_is_expanded_as_the_runs_expand_it(tmp_path, monkeypatch, capsys):
    # The run wrote into $LCDIR expanded; learncheck looked in '$LCDIR/...' and failed.
    monkeypatch.setenv("LCDIR", str(tmp_path))
    checked = learncheck.main(["pixelcue", "--savedir", "$LCDIR/checks", "--total_steps", "80"])
    assert (tmp_path / "checks" / "learncheck-pixelcue" / "logs.csv").exists()
    assert checked == 1 and "pixelcue: " in capsys.readouterr().out  # 80 steps learn nothing
    monkeypatch.delenv("LCDIR")
    with pytest.raises(SystemExit):
        learncheck.main(["pixelcue", "--savedir", "$LCDIR/checks"])
    assert "--savedir $LCDIR/checks names $LCDIR, which is not set" in capsys.readouterr().err


def test_a_flag_passed_on_takes_its_value_in_any_order_with_the_checks(capsys):
    split = learncheck.split_passed_flags
    # The value went to the checks: "error: unknown check '0.001'".
    assert split(["--learning_rate", "0.001"]) == ([], ["--learning_rate", "0.001"])
    assert split(["--entropy_cost", "0.02", "cartpole"]) == (
        ["cartpole"], ["--entropy_cost", "0.02"]
    )  # fmt: skip
    words = ["--normalize_values", "pixelcue", "--savedir", "/x", "--entropy_cost", "-0.5"]
    assert split(words) == (["pixelcue", "--savedir", "/x"], words[:1] + words[4:])
    with pytest.raises(SystemExit) as stopped:  # refused as the runs would, before any
        learncheck.main(["--learning_rate", "-1", "pixelcue"])
    assert stopped.value.code == 2
    assert "argument --learning_rate: must be a finite number > 0" in capsys.readouterr().err


def test_polybeast_learns_pixel_cue(tmp_path):
    sockets = f"unix:/tmp/cue{os.getpid()}"
    args = ["--xpid", "run", "--num_servers", "2", "--pipes_basename", sockets]
    check_learned(run("torchbeast.polybeast", tmp_path, *args))


def test_raybeast_learns_pixel_cue_through_the_learning_check_command(tmp_path, capsys):
    argv = ["pixelcue", "--runtime", "ray", "--savedir", str(tmp_path), "--disable_cuda"]
    assert learncheck.main(argv) == 0
    assert "pixelcue (ray): " in capsys.readouterr().out
    run_dir = os.path.join(tmp_path, "learncheck-pixelcue-ray")
    check_learned(run_dir)
    with open(os.path.join(run_dir, "meta.json")) as f:
        assert json.load(f)["command"][0].endswith("raybeast.py")  # trained by RayBeast


def test_last_logged_step_reads_the_last_whole_row(tmp_path):
    logs = tmp_path / "logs.csv"
    assert learncheck.last_logged_step(str(logs)) == 0  # not written yet
    logs.write_text("# _tick,step,total_loss\n0,80,1.5\n1,160,1.2\n2,24")  # last row half written
    assert learncheck.last_logged_step(str(logs)) == 160
    logs.write_text("# _tick,step,total_loss\n0,80,1.5\n1,160,1.2\n")
    assert learncheck.last_logged_step(str(logs)) == 160


def test_a_check_stops_its_run_at_its_budget_with_the_default_schedule(tmp_path):
    # The defaults train for 5M steps; the check stops the run (SIGTERM: checkpoint, exit 143)
    # soon after its 3K steps, before the learning rate has decayed noticeably.
    check = learncheck.Check("CartPole-v1", 3_000, 0.0, ("--disable_cuda",), "")
    returncode, _ = learncheck.train(check, str(tmp_path), "run")
    assert returncode == 0
    logs = read_logs(tmp_path / "run")
    assert 3_000 <= logs["step"][-1] < 100_000
    assert logs["learning_rate"][-1] > 0.99 * 0.0007
    assert (tmp_path / "run" / "model.tar").exists()


def test_a_stopped_learning_check_stops_its_run(tmp_path):
    command = [sys.executable, "-m", "torchbeast.learncheck", "cartpole"]
    check = subprocess.Popen(
        [*command, "--savedir", str(tmp_path)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    logs = tmp_path / "learncheck-cartpole" / "logs.csv"
    try:
        wait_for(lambda: logs.exists() and logs.stat().st_size > 200, 120, "the check's run")
        run = children_of(check.pid)
        assert run
    finally:
        check.send_signal(signal.SIGTERM)  # it died at once, its run training on, orphaned
        _, stderr = check.communicate(timeout=60)
    assert check.returncode == 130 and stderr.strip().splitlines()[-1] == "interrupted"
    wait_for(lambda: not any(alive(pid) for pid in run), 30, "the check's run to stop")

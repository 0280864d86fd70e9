"""The console's progress line: steps of the total, time left, SPS (and, from the
trainer, the mean return and the policy entropy)."""

import math

import pytest

from torchbeast.runtime.progress import format_duration, progress_text


def test_progress_says_steps_of_the_total_percentage_speed_and_time_left():
    text = progress_text(1_234_560, 5_000_000, 1150.0)
    assert text == "Steps 1234560 of 5000000 (24.7%) @ 1150 SPS, 55 min left"


def test_progress_without_speed_or_at_the_end_gives_no_time_left():
    assert progress_text(0, 100, 0.0) == "Steps 0 of 100 (0.0%) @ 0 SPS"
    assert progress_text(100, 100, 50.0) == "Steps 100 of 100 (100.0%) @ 50 SPS"


@pytest.mark.parametrize(
    "seconds, text",
    [(42, "42 s"), (61, "1 min"), (3599, "1 h 00 min"), (3 * 3600 + 300, "3 h 05 min")],
)
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert format_duration(seconds) == text


def trainer(*argv: str, tmp_path):
    from torchbeast.config.flags import parse_flags
    from torchbeast.config.settings import build_settings
    from torchbeast.envs import env_spec
    from torchbeast.runtime.training import Trainer

    flags = parse_flags(["--env", "CartPole-v1", "--savedir", str(tmp_path), *argv])
    settings = build_settings(flags, "mono")
    return Trainer(settings, env_spec(settings.env))


def test_mean_return_is_over_the_last_100_episodes_on_every_line(tmp_path):
    run = trainer(tmp_path=tmp_path)
    assert run.progress.mean_return_text() == " Mean return (last 0 episodes) n/a."
    run.progress.record({}, [float(r) for r in range(150)])
    assert run.progress.mean_return_text() == " Mean return (last 100 episodes) 99.5."
    assert run.progress.mean_return_text() == " Mean return (last 100 episodes) 99.5."


def test_episodes_for_avg_prints_each_episode_once_when_enough_have_ended(tmp_path):
    # The LASER fork's --episodes_for_avg, in every runtime: the Trainer is shared.
    run = trainer("--episodes_for_avg", "3", tmp_path=tmp_path)
    run.progress.record({}, [1.0, 2.0])
    assert run.progress.mean_return_text() == ""
    run.progress.record({}, [3.0, 6.0])
    assert run.progress.mean_return_text() == " Mean return (last 4 episodes) 3.0."
    assert run.progress.mean_return_text() == ""


def test_the_best_100_episode_mean_is_kept_from_full_windows_and_saved(tmp_path):
    run = trainer(tmp_path=tmp_path)
    run.progress.record({"step": 80}, [50.0] * 60)  # 60 episodes: no full window yet
    assert run.progress.best_text() == ""
    run.progress.record({"step": 160}, [10.0] * 40)
    run.progress.record({"step": 240}, [90.0] * 50)
    run.progress.record({"step": 320}, [0.0] * 100)
    # Windows after each: 34.0 (60 x 50, 40 x 10), then 54.0 (10 x 50, 40 x 10, 50 x 90).
    assert run.progress.best_text() == ", best 54.0 at step 240"
    assert run.progress.figures()["mean_return_last_100"] == 0.0
    resumed = trainer(tmp_path=tmp_path)
    resumed.progress.load_state_dict(run.progress.state_dict())
    assert resumed.progress.best_text() == ", best 54.0 at step 240"


def test_the_logged_figures_are_the_progress_lines(tmp_path):
    run = trainer(tmp_path=tmp_path)
    figures = run.progress.figures()
    assert math.isnan(figures["mean_return_last_100"]) and math.isnan(figures["sps"])
    run.progress.record({"step": 80, "policy_entropy": 0.69}, [1.0, 2.0])
    run.progress.print(80, 1234.5)
    assert run.progress.figures() == {"mean_return_last_100": 1.5, "sps": 1234.5}

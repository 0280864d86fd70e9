"""The console's progress line: steps of the total, time left, SPS (and, from the
trainer, the mean return and the policy entropy)."""

import pytest

from torchbeast.runtime.training import format_duration, progress_text


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

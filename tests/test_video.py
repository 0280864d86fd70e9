"""Test and eval modes record the games they play as a GIF of what the env draws."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

from tests.test_monobeast import assert_one_error_line, monobeast
from torchbeast import video
from torchbeast.envs import EnvError, create_env

TRAIN = ["--num_actors", "1", "--envs_per_actor", "2", "--batch_size", "2"]
TRAIN += ["--unroll_length", "20", "--total_steps", "80", "--disable_cuda", "--xpid", "run"]


def frames_of(path) -> list[Image.Image]:
    """The GIF's pictures, each as often as it shows (GIF merges repeated pictures into
    one that shows longer: Pong's first pictures are alike)."""
    with Image.open(path) as gif:
        frames = []
        for index in range(gif.n_frames):
            gif.seek(index)
            shows = round(gif.info["duration"] / 70)  # ms: Atari's 15 a second, in hundredths
            frames += [gif.convert("RGB")] * shows
        return frames


@pytest.mark.parametrize(
    "env, steps, size",
    [("PongNoFrameskip-v4", 25, (160, 210)), ("MinAtar/Breakout-v1", 5, (160, 160))],
    ids=["atari-screen", "minatar-grid-scaled-up"],
)
def test_test_mode_records_the_first_steps_as_the_env_draws_them(tmp_path, env, steps, size):
    # (A MinAtar Breakout game of an untrained agent may last only a few steps.)
    assert monobeast(tmp_path, "--env", env, *TRAIN).returncode == 0
    out = tmp_path / "play.gif"
    played = monobeast(
        tmp_path, "--env", env, "--xpid", "run", "--mode", "test", "--num_episodes", "1",
        "--video", str(out), "--video_steps", str(steps),
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    assert f"Recorded {steps} steps of play in {out}" in played.stdout
    frames = frames_of(out)
    # The env's own picture (Atari's 210x160 screen; MinAtar's 10x10 grid, 16x), not the
    # agent's 84x84 input; and the game moves.
    assert len(frames) == steps and all(frame.size == size for frame in frames)
    assert any(frames[0].tobytes() != frame.tobytes() for frame in frames[1:])


def test_video_is_refused_in_one_line_where_it_cannot_be_written(tmp_path):
    trained = monobeast(tmp_path, "--env", "CartPole-v1", *TRAIN, "--video", "x.gif")
    assert trained.returncode == 2
    assert "--video records the games of --mode test and eval, not train" in trained.stderr
    tested = monobeast(
        tmp_path, "--env", "CartPole-v1", "--mode", "test", "--xpid", "run", "--video", "x.mp4"
    )
    assert tested.returncode == 2
    assert "--video x.mp4 must end in .gif" in tested.stderr


def test_an_env_that_cannot_draw_itself_is_refused_in_one_line(tmp_path, monkeypatch):
    # PixelCue declares no render mode; before, --video ended in a TypeError's traceback.
    monkeypatch.setenv("DISPLAY", ":99")  # test_render asks for one first (none is opened)
    for mode in (["--mode", "test", "--video", "cue.gif"], ["--mode", "test_render"]):
        played = monobeast(
            tmp_path, "--env", "torchbeast/PixelCue-v0", "--random_policy", "--xpid", "cue", *mode
        )
        assert played.returncode == 1, played.stderr
        assert played.stderr.strip().splitlines() == [
            "error: torchbeast/PixelCue-v0 cannot draw itself (its render modes are []): "
            "--video and --mode test_render need an env that renders; play it with --mode "
            "test or eval without them"
        ]
    assert not (tmp_path / "cue.gif").exists()


class DrawsNothing(gym.Env):
    """Says it renders rgb_array, and returns None."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}

    def render(self):
        return None


def test_an_env_whose_render_returns_nothing_is_one_error_not_a_crash():
    gym.register("tests/DrawsNothing-v0", entry_point=DrawsNothing)
    env = create_env("tests/DrawsNothing-v0", render="rgb_array")
    try:
        env.reset(seed=0)
        with pytest.raises(EnvError, match=r"^tests/DrawsNothing-v0 cannot draw itself \(its"):
            env.frame()
    finally:
        env.close()


def test_small_pictures_are_scaled_up_in_blocks_and_floats_become_bytes():
    grid = np.zeros((10, 10, 3))
    grid[0, 0] = [1.0, 0.5, 0.0]
    picture = video.as_picture(grid)
    assert picture.shape == (160, 160, 3) and picture.dtype == np.uint8
    assert (picture[:16, :16] == [255, 128, 0]).all() and (picture[16:, :] == 0).all()
    screen = np.full((210, 160, 3), 7, dtype=np.uint8)
    assert video.as_picture(screen) is not None and video.as_picture(screen).shape == screen.shape


def test_pictures_of_integers_keep_their_levels_and_others_are_refused():
    # int64 RGB became white (taken for floats in [0, 1]); a [1, 1, 5] picture was PIL's
    # TypeError after every game, eval.json unwritten.
    screen = np.full((160, 160, 3), 7, dtype=np.int64)
    assert (video.as_picture(screen) == 7).all() and video.as_picture(screen).dtype == np.uint8
    for shape in [(2, 2, 5), (4,), (2, 2, 3, 1), (0, 4, 3)]:
        with pytest.raises(video.VideoError, match=r"--video records \[H, W, 3\] \(RGB\)"):
            video.as_picture(np.zeros(shape, np.uint8))


def test_a_picture_no_video_holds_is_one_line_before_any_game(tmp_path, monkeypatch):
    monkeypatch.setenv("TB_TEST_PICTURE", "five-colours")
    played = monobeast(
        tmp_path, "--mode", "eval", "--random_policy", "--env", "tests.envs_for_tests:Drawing-v0",
        "--xpid", "a", "--num_episodes", "2", "--video", str(tmp_path / "play.gif"),
    )  # fmt: skip
    assert_one_error_line(played, "the env draws pictures of shape [2, 2, 5]: --video records")
    assert "Episode 1 ended" not in played.stdout


def test_a_render_that_raises_is_one_line_with_its_traceback_above(tmp_path, monkeypatch):
    monkeypatch.setenv("TB_TEST_PICTURE", "raise")
    played = monobeast(
        tmp_path, "--mode", "test", "--random_policy", "--env", "tests.envs_for_tests:Drawing-v0",
        "--xpid", "a", "--video", str(tmp_path / "play.gif"),
    )  # fmt: skip
    assert_one_error_line(
        played, "the environment failed: RuntimeError: the renderer lost its display"
    )
    assert "raise RuntimeError" in played.stdout


def test_a_video_is_written_at_atari_speed_as_near_as_a_gif_holds_it(tmp_path):
    recorder = video.Recorder(str(tmp_path / "play.gif"), steps=3)
    for level in (0, 100, 200):
        recorder.add(np.full((4, 4, 3), level, np.uint8))
    assert recorder.save() == 3 and recorder.seconds == pytest.approx(0.21)
    with Image.open(tmp_path / "play.gif") as gif:
        assert gif.n_frames == 3 and gif.info["duration"] == 70  # 15 a second is 66.7 ms


def test_a_video_path_from_a_config_file_has_its_home_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "play.toml"
    config.write_text('video = "~/play.gif"\nvideo_steps = 2\n')
    played = monobeast(
        tmp_path, "--mode", "test", "--random_policy", "--env", "tests.envs_for_tests:Drawing-v0",
        "--xpid", "a", "--num_episodes", "1", "--config", str(config),
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    assert (tmp_path / "play.gif").exists()

"""Specification of create_env: Atari preprocessing, episodic life, same-step autoreset
and episode bookkeeping, on the real games (ale-py's ROMs), CartPole and MinAtar."""

import itertools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from tests.envs_for_tests import CoinsEnv
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_learner_parser
from torchbeast.config.poly import PolyEnvSettings
from torchbeast.config.settings import build_settings, env_side_of
from torchbeast.core.spec import EnvSpec
from torchbeast.envs import BatchedEnv, EnvError, create_env, env_spec, make_single_atari
from torchbeast.envs.settings import EnvSettings

MAX_STEPS = 3000  # every episode played here ends well before this


@pytest.fixture
def make_env():
    """create_env, closing every env the test made."""
    envs = []

    def make(env_id, num_envs=1):
        env = create_env(env_id, num_envs=num_envs)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def random_actions(env, seed=0):
    rng = np.random.default_rng(seed)
    while True:
        yield rng.integers(0, env.spec.num_actions, size=env.num_envs)


# Atari: DeepMind preprocessing on ale-py's vector env.


def test_pong_gives_stacked_84x84_uint8_frames_and_6_actions(make_env):
    env = make_env("PongNoFrameskip-v4", num_envs=2)
    frame = env.reset(seed=0)["frame"]
    assert env.spec == EnvSpec("PongNoFrameskip-v4", (4, 84, 84), np.dtype(np.uint8), 6)
    assert (frame.shape, frame.dtype) == ((2, 4, 84, 84), np.uint8)
    frame = env.step(np.array([0, 1]))["frame"]
    assert (frame.shape, frame.dtype) == ((2, 4, 84, 84), np.uint8)


def test_ale_v5_pong_gives_the_same_frames_and_actions(make_env):
    env = make_env("ALE/Pong-v5", num_envs=2)
    env.reset(seed=0)
    frame = env.step(np.array([2, 3]))["frame"]
    assert env.spec == EnvSpec("ALE/Pong-v5", (4, 84, 84), np.dtype(np.uint8), 6)
    assert (frame.shape, frame.dtype) == ((2, 4, 84, 84), np.uint8)


def test_atari_frames_show_the_screen(make_env):
    env = make_env("PongNoFrameskip-v4")
    frame = env.reset(seed=0)["frame"]
    # Pong's screen has a dark field and light walls: not a blank image.
    assert frame.min() < 100 < frame.max()


def test_reset_starts_an_episode_with_zero_reward(make_env):
    env = make_env("PongNoFrameskip-v4", num_envs=2)
    output = env.reset(seed=0)
    assert output["done"].tolist() == [True, True]
    assert output["reward"].tolist() == [0.0, 0.0]
    assert output["episode_return"].tolist() == [0.0, 0.0]
    assert output["episode_step"].tolist() == [0, 0]
    assert output["episode_end"].tolist() == [False, False]


def test_step_reports_the_actions_taken_as_last_action(make_env):
    env = make_env("PongNoFrameskip-v4", num_envs=2)
    env.reset(seed=0)
    assert env.step(np.array([4, 5]))["last_action"].tolist() == [4, 5]


def play_breakout_game(env):
    """Plays one game of Breakout with random actions.

    Returns every step's output, with the lives left after it and the sum of the game's
    rewards up to it.
    """
    env.reset(seed=0)
    game_reward = 0.0
    outputs = []
    for actions in itertools.islice(random_actions(env), MAX_STEPS):
        output = env.step(actions)
        game_reward += float(output["reward"][0])
        outputs.append(dict(output, lives=env.lives.copy(), game_reward=game_reward))
        if output["episode_end"][0]:
            return outputs
    raise AssertionError(f"a random game of Breakout did not end in {MAX_STEPS} steps")


@pytest.fixture(scope="module")
def breakout_game():
    env = create_env("BreakoutNoFrameskip-v4")
    try:
        return play_breakout_game(env)
    finally:
        env.close()


@pytest.mark.parametrize("render", [None, "rgb_array"], ids=["vector-env", "python-wrappers"])
def test_each_episode_starts_its_frame_stack_with_its_first_frame(render):
    # As the original's FrameStack, reset at every new game and every lost life: the stack
    # holds no blank padding and no frame of the life before, in the 3 steps after either.
    env = create_env("BreakoutNoFrameskip-v4", render=render)
    try:
        stacks = [env.reset(seed=0)["frame"][0]]
        starts = [0]  # the steps where an episode (a game or a life) begins
        for t, actions in enumerate(itertools.islice(random_actions(env), MAX_STEPS), 1):
            output = env.step(actions)
            stacks.append(output["frame"][0])
            if output["done"][0]:
                starts.append(t)
            if output["episode_end"][0]:
                break
    finally:
        env.close()
    assert len(starts) == 6  # the reset, 4 lost lives, the last (a new game)
    for start in starts:
        first = stacks[start][-1]
        for since in range(min(4, len(stacks) - start)):
            stack = stacks[start + since]
            assert all((stack[k] == first).all() for k in range(4 - since)), (start, since)
    assert any((stack[0] != stack[-1]).any() for stack in stacks)  # frames do differ


def test_breakout_lost_life_is_done_but_not_the_end_of_the_game(breakout_game):
    life_losses = [out for out in breakout_game if out["done"][0] and not out["episode_end"][0]]
    # Breakout starts with 5 lives: 4 are lost before the game-ending fifth.
    assert [int(out["lives"][0]) for out in life_losses] == [4, 3, 2, 1]


def test_breakout_game_goes_on_after_a_lost_life(breakout_game):
    steps = [int(out["episode_step"][0]) for out in breakout_game]
    # The episode counter never restarts within the game: the lost lives do not reset it.
    assert steps == list(range(1, len(breakout_game) + 1))


def test_breakout_episode_ends_only_when_the_game_is_over(breakout_game):
    ends = [i for i, out in enumerate(breakout_game) if out["episode_end"][0]]
    assert ends == [len(breakout_game) - 1]
    assert breakout_game[-1]["done"][0]


def test_breakout_episode_return_is_the_unclipped_score_of_the_whole_game(breakout_game):
    last = breakout_game[-1]
    assert last["episode_return"][0] == last["game_reward"] > 0


def play_noop_breakout(env, max_steps):
    """Plays NOOP only; returns the lives left at each done, and whether the game ended."""
    env.reset(seed=0)
    lives_at_done = []
    for _ in range(max_steps):
        output = env.step(np.zeros(env.num_envs, dtype=np.int64))
        if output["done"][0]:
            lives_at_done.append(int(env.lives[0]))
        if output["episode_end"][0]:
            return lives_at_done, True
    return lives_at_done, False


def wrapped_breakout(**flags):
    """Breakout on Gymnasium's Python Atari wrappers (the Riverraid proxies' path)."""
    vector_env = gym.vector.SyncVectorEnv(
        [lambda: make_single_atari("BreakoutNoFrameskip-v4")],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return BatchedEnv(vector_env, "BreakoutNoFrameskip-v4", track_lives=True, **flags)


def test_fire_is_pressed_after_every_lost_life_so_a_noop_agent_loses_the_game(make_env):
    # Breakout waits for FIRE to serve: only the FIRE after each lost life ends the game.
    lives_at_done, ended = play_noop_breakout(make_env("BreakoutNoFrameskip-v4"), MAX_STEPS)
    assert ended
    assert lives_at_done == [4, 3, 2, 1, 5]  # the last done resets the game


def test_no_fire_on_life_loss_leaves_a_noop_agent_waiting_after_its_first_lost_life(make_env):
    env = create_env(EnvSettings("BreakoutNoFrameskip-v4", options={"no_fire_on_life_loss": True}))
    try:
        lives_at_done, ended = play_noop_breakout(env, 1000)
    finally:
        env.close()
    assert (lives_at_done, ended) == ([4], False)


def test_python_wrapper_path_presses_fire_after_a_lost_life_too():
    env = wrapped_breakout(fire_action=1)
    try:
        lives_at_done, ended = play_noop_breakout(env, MAX_STEPS)
    finally:
        env.close()
    assert ended and lives_at_done == [4, 3, 2, 1, 5]


def test_fire_replaces_only_the_action_right_after_a_lost_life(make_env):
    env = make_env("BreakoutNoFrameskip-v4")
    pressed = []
    original_step = env.env.step
    env.env.step = lambda actions: pressed.append(actions.tolist()) or original_step(actions)
    play_noop_breakout(env, MAX_STEPS)
    fire_steps = [i for i, actions in enumerate(pressed) if actions == [1]]
    assert len(fire_steps) == 4  # one per lost life; the game's own reset fires by itself
    assert all(actions == [0] for i, actions in enumerate(pressed) if i not in fire_steps)


def test_fire_on_life_loss_is_the_default_and_can_be_turned_off():
    assert parse_flags(["--xpid", "x"]).no_fire_on_life_loss is False
    assert parse_flags(["--xpid", "x", "--no_fire_on_life_loss"]).no_fire_on_life_loss


def test_polybeast_env_processes_get_no_fire_on_life_loss_from_the_learner():
    def env_side(*argv: str) -> PolyEnvSettings:
        flags = parse_flags(["--xpid", "x", *argv], make_learner_parser("test"))
        return env_side_of(build_settings(flags, "poly"))

    assert env_side("--no_fire_on_life_loss").env.option("no_fire_on_life_loss")
    assert not env_side().env.option("no_fire_on_life_loss")


def test_atari_rewards_are_the_game_score_unclipped(make_env):
    env = make_env("SpaceInvadersNoFrameskip-v4")
    env.reset(seed=0)
    for actions in itertools.islice(random_actions(env), MAX_STEPS):
        reward = float(env.step(actions)["reward"][0])
        if reward:
            break
    # The aliens of the bottom row are worth 5 points; the learner, not the env, clips.
    assert reward == 5.0


def test_breakout_new_game_restores_the_lives(breakout_game):
    assert int(breakout_game[-1]["lives"][0]) == 5


# Other Gymnasium ids: SyncVectorEnv with same-step autoreset.


def test_cartpole_gives_float32_vectors_and_2_actions(make_env):
    env = make_env("CartPole-v1", num_envs=3)
    frame = env.reset(seed=0)["frame"]
    assert env.spec == EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2)
    assert (frame.shape, frame.dtype) == ((3, 4), np.float32)


def play_until_first_episode_end(env):
    env.reset(seed=0)
    rewards = []
    actions = random_actions(env)
    for _ in range(MAX_STEPS):
        output = env.step(next(actions))
        rewards.append(float(output["reward"][0]))
        if output["episode_end"][0]:
            return output, rewards, env.step(next(actions))
        assert not output["done"][0]
    raise AssertionError(f"no episode ended in {MAX_STEPS} steps")


def test_cartpole_step_that_ends_the_episode_reports_it(make_env):
    end, rewards, _ = play_until_first_episode_end(make_env("CartPole-v1"))
    assert end["done"][0] and end["episode_end"][0]
    assert end["episode_return"][0] == sum(rewards) == len(rewards)
    assert end["episode_step"][0] == len(rewards)


def test_cartpole_resets_in_the_step_that_ends_the_episode(make_env):
    end, _, _ = play_until_first_episode_end(make_env("CartPole-v1"))
    # The frame returned with done is the next episode's first: CartPole starts within 0.05.
    assert np.abs(end["frame"]).max() <= 0.05


def test_cartpole_episode_return_restarts_after_the_end(make_env):
    _, _, after = play_until_first_episode_end(make_env("CartPole-v1"))
    assert not after["done"][0]
    assert after["episode_return"][0] == 1.0
    assert after["episode_step"][0] == 1


def test_cartpole_reset_is_reproducible_with_a_seed(make_env):
    first = make_env("CartPole-v1", num_envs=2).reset(seed=3)["frame"]
    second = make_env("CartPole-v1", num_envs=2).reset(seed=3)["frame"]
    np.testing.assert_array_equal(first, second)


def test_minatar_breakout_gives_10x10x4_frames_and_3_actions(make_env):
    pytest.importorskip("minatar")
    env = make_env("MinAtar/Breakout-v1", num_envs=2)
    env.reset(seed=0)
    frame = env.step(np.array([0, 2]))["frame"]
    assert env.spec.observation_shape == (10, 10, 4)
    assert env.spec.num_actions == 3
    assert frame.shape == (2, 10, 10, 4)


def test_minatar_episode_return_is_the_sum_of_its_rewards(make_env):
    pytest.importorskip("minatar")
    end, rewards, _ = play_until_first_episode_end(make_env("MinAtar/Breakout-v1"))
    assert end["episode_return"][0] == sum(rewards)
    assert end["episode_step"][0] == len(rewards)


def test_env_spec_describes_the_env_without_keeping_it():
    assert env_spec("CartPole-v1") == EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2)


# Episode extras: figures an env reports besides its return, declared in its metadata.

COINS = "tests.envs_for_tests:Coins-v0"


def test_an_env_names_its_episode_extras_in_its_spec():
    assert env_spec(COINS).episode_extras == ("coins",)
    assert env_spec("CartPole-v1").episode_extras == ()


def test_an_episode_extra_adds_up_its_steps_info_and_restarts_with_the_next_episode(make_env):
    env = make_env(COINS, num_envs=2)
    end, rewards, after = play_until_first_episode_end(env)
    assert len(rewards) == 10
    np.testing.assert_array_equal(end["episode_coins"], [20.0, 20.0])  # 2 coins a step
    np.testing.assert_array_equal(after["episode_coins"], [2.0, 2.0])
    np.testing.assert_array_equal(env.reset(seed=1)["episode_coins"], [0.0, 0.0])


def test_an_env_without_episode_extras_steps_only_the_usual_columns(make_env):
    env = make_env("CartPole-v1")
    env.reset(seed=0)
    assert sorted(env.step(np.zeros(1, np.int64))) == [
        "done", "episode_end", "episode_return", "episode_step", "final_frame", "frame",
        "last_action", "reward", "truncated",
    ]  # fmt: skip


def coins_env_declaring(extras: dict) -> BatchedEnv:
    class Declaring(CoinsEnv):
        metadata = {"render_modes": [], "episode_extras": extras}

    return BatchedEnv(gym.vector.SyncVectorEnv([Declaring]), "Declaring-v0", track_lives=False)


def test_an_episode_extra_missing_from_the_steps_info_is_one_clear_error():
    env = coins_env_declaring({"coins": "gold"})
    env.reset(seed=0)
    with pytest.raises(EnvError, match="info\\['gold'\\] but its steps' info has no such key"):
        env.step(np.zeros(1, np.int64))


# A rollout column (episode_step), logs.csv's mean_episode_length, eval's own figures: an
# extra named "length" overwrote mean_episode_length, one named "episode_length" or
# "return_per_step" was dropped from eval.json.
@pytest.mark.parametrize(
    "name",
    [
        "step",
        "return",
        "length",
        "episode_length",
        "proxy_return",
        "return_per_step",
        "true_return_per_step",
        # eval.json's own fields: the extra's figure took their place.
        "actions",
        "episodes",
        "reward_proxy",
    ],
)
def test_an_episode_extra_that_would_clash_with_a_figure_of_ours_is_refused(name):
    with pytest.raises(EnvError, match=f"extra '{name}' would clash with a figure of torchbeast"):
        coins_env_declaring({name: "coins_this_step"})


def test_an_episode_extra_per_step_of_its_own_is_a_name_like_any():
    env = coins_env_declaring({"collisions_per_step": "coins_this_step"})  # no return's
    assert env.spec.episode_extras == ("collisions_per_step",)


def test_a_discrete_space_that_starts_elsewhere_gets_its_own_actions():
    class Signed(CoinsEnv):  # actions -1, 0, +1: the agent's 0, 1, 2
        action_space = gym.spaces.Discrete(3, start=-1)

        def step(self, action):
            assert self.action_space.contains(action), action  # it was sent 0, 1, 2
            return super().step(action)

    env = BatchedEnv(gym.vector.SyncVectorEnv([Signed]), "Signed-v0", track_lives=False)
    env.reset(seed=0)
    assert env.spec.num_actions == 3
    for action in (0, 1, 2):
        step = env.step(np.array([action]))
        assert step["last_action"][0] == action  # the agent's index, as it chose it


# Unknown ids.


@pytest.mark.parametrize("env_id", ["NoSuchGame-v0", "PongNoFrameskip-v99"])
def test_unknown_id_names_it_and_says_how_to_list_ids(env_id):
    with pytest.raises(EnvError) as error:
        create_env(env_id)
    assert repr(env_id) in str(error.value)
    assert "python -m torchbeast.envs" in str(error.value)


def test_unknown_minatar_id_says_how_to_install_minatar():
    with pytest.raises(EnvError, match="pip install MinAtar"):
        create_env("MinAtar/NoSuchGame-v1")


def test_only_a_minatar_id_imports_minatar():
    """MinAtar's package imports matplotlib and seaborn (a second per process): a run of
    another env, its learner and each of its actors, goes without it."""
    program = (
        "import sys; from torchbeast.envs import create_env; "
        "create_env('CartPole-v1').close(); print('minatar' in sys.modules); "
        "create_env('MinAtar/Breakout-v1').close(); print('minatar' in sys.modules)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert shown.stdout.split() == ["False", "True"], shown.stderr


def test_minatars_display_modules_load_only_when_a_picture_is_drawn():
    """MinAtar's package imports seaborn (and with it scipy) and matplotlib's pyplot for its
    display: 2.1-2.5 s in every process of a MinAtar run, which draws no picture."""
    program = """
import sys
import numpy as np
from torchbeast.envs import create_env
env = create_env("MinAtar/Breakout-v1", num_envs=2)
env.reset(seed=1)
for _ in range(20):
    env.step(np.zeros(2, dtype=np.int64))
env.close()
import torch  # its import reads every module's __file__ (inspect.getmodule), as a run's does
# What seaborn and pyplot import (the names stand in for them until then).
print(sorted({"scipy", "seaborn.palettes", "matplotlib._pylab_helpers"} & set(sys.modules)))
env = create_env("MinAtar/Breakout-v1", render="rgb_array")
env.reset(seed=1)
picture = env.frame()  # MinAtar draws it with seaborn's palette
print(picture.shape, float(picture.max()) > 0, "scipy" in sys.modules)
import matplotlib.pyplot as plt
print(callable(plt.figure), "matplotlib._pylab_helpers" in sys.modules)
"""
    shown = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["[]", "(10, 10, 3) True True", "True True"], (
        shown.stdout + shown.stderr
    )


def test_a_large_seed_stays_within_ales_32_bit_seeds(make_env):
    from torchbeast.envs import worker_seed

    env = make_env("PongNoFrameskip-v4", num_envs=2)
    seed = worker_seed(999_999, worker=7, num_envs=2)  # 999_999 * 100_003 > 2**31 before
    assert 0 <= seed and seed + 2 < 2**31
    env.reset(seed=seed)  # ale-py refused seeds of 2**31 and more


def test_listing_envs_with_a_filter_that_matches_none_says_so(capsys):
    from torchbeast.envs.__main__ import main

    assert main(["CartPole"]) == 0
    assert "  CartPole-v1\n" in capsys.readouterr().out
    assert main(["NoSuchGameAnywhere"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: no environment id contains 'NoSuchGameAnywhere'")


def test_a_scalar_box_observation_is_refused_naming_the_fix():
    from torchbeast.envs.batched import space_problem

    # It trained into a traceback ("Dimension out of range") in the model.
    scalar = gym.spaces.Box(-1.0, 1.0, (), np.float32)
    problem = space_problem(scalar, gym.spaces.Discrete(2))
    assert problem.startswith("a Box observation of shape () (a single number)")
    assert "ReshapeObservation" in problem
    assert (
        space_problem(gym.spaces.Box(-1.0, 1.0, (1,), np.float32), gym.spaces.Discrete(2)) is None
    )


@pytest.mark.parametrize(
    "env_id, said",
    [
        # A module whose own code raises (not an ImportError) was a traceback.
        (
            "tests.env_module_that_fails:Broken-v0",
            "importing 'tests.env_module_that_fails' for environment "
            "'tests.env_module_that_fails:Broken-v0' failed (RuntimeError: the module's own "
            "setup failed): fix the module, then run the same command",
        ),
        # No module before the ':' (a typo), or a relative one: a traceback, or "the
        # environment failed as it was made".
        (":CartPole-v1", "environment ':CartPole-v1' names no module before its ':'"),
        (".envs_for_tests:Coins-v0", "environment '.envs_for_tests:Coins-v0' names no module"),
    ],
)
def test_an_env_id_whose_module_cannot_be_had_is_one_line(tmp_path, env_id, said):
    from tests.test_monobeast import assert_one_error_line, monobeast

    result = monobeast(tmp_path, "--env", env_id, "--total_steps", "10")
    assert_one_error_line(result, said)


# Time limits: an episode cut short keeps its last observation for the learner.


def test_an_episode_a_time_limit_cuts_short_keeps_its_last_observation(make_env):
    env = make_env("tests.envs_for_tests:TimeLimitedCartPole-v0", num_envs=2)
    alone = gym.make("tests.envs_for_tests:TimeLimitedCartPole-v0")  # as env 0, seeded alike
    env.reset(seed=3)
    observation, _ = alone.reset(seed=3)
    for step in range(16):  # the limit
        output = env.step(np.ones(2, np.int64) * (step % 2))
        observation, _, terminated, truncated, _ = alone.step(step % 2)
    assert truncated and not terminated
    assert output["truncated"].tolist() == [True, True] and output["done"].all()
    np.testing.assert_array_equal(output["final_frame"][0], observation)
    assert not np.array_equal(output["frame"][0], observation)  # the next episode's first
    alone.close()


def test_an_episode_the_game_ends_is_not_truncated(make_env):
    env = make_env("tests.envs_for_tests:TimeLimitedCartPole-v0")
    env.reset(seed=0)
    for _ in range(15):  # always right: the pole falls within the limit
        output = env.step(np.ones(1, np.int64))
        if output["done"][0]:
            break
    assert output["done"][0] and not output["truncated"][0]
    assert output["final_frame"].shape == (0, 4)


def test_an_atari_game_cut_short_by_its_frame_limit_keeps_its_stacked_last_frames(make_env):
    env = make_env("tests.envs_for_tests:ShortPongNoFrameskip-v4", num_envs=2)
    env.reset(seed=0)
    outputs = [env.step(np.zeros(2, np.int64)) for _ in range(100)]  # 400 frames
    assert not any(output["done"].any() for output in outputs[:-1])
    last, before = outputs[-1], outputs[-2]
    assert last["truncated"].tolist() == [True, True] and last["episode_end"].all()
    assert last["final_frame"].shape == (2, 4, 84, 84)
    # The stack moved on by one frame from the step before, as within an episode.
    np.testing.assert_array_equal(last["final_frame"][:, :3], before["frame"][:, 1:])


def test_an_episode_the_game_ends_on_its_time_limits_step_is_not_truncated():
    """Gymnasium's TimeLimit says truncated there too; the game's end counts."""
    vector_env = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=8)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env = BatchedEnv(vector_env, "CartPole-v1", track_lives=False)
    try:
        env.reset(seed=0)
        outputs = [env.step(np.ones(1, np.int64)) for _ in range(8)]  # always right
    finally:
        env.close()
    assert [bool(output["done"][0]) for output in outputs] == [False] * 7 + [True]
    assert not outputs[-1]["truncated"][0] and outputs[-1]["final_frame"].shape == (0, 4)

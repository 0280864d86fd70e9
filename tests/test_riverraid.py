"""Riverraid's reward proxies: each proxy on scripted RAM and scores, then the real ROM."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests import warm_start
from tests.test_monobeast import assert_one_error_line, monobeast, read_rows
from torchbeast.config.env import env_settings
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_learner_parser
from torchbeast.config.settings import build_settings, env_side_of
from torchbeast.core.models import count_parameters, create_model
from torchbeast.envs import BatchedEnv, EnvError, create_env, riverraid
from torchbeast.envs.riverraid import (
    MISSILE_Y,
    NO_MISSILE_Y,
    PLAYER_X,
    RewardProxy,
    move_measure,
    proxy_from_flags,
    proxy_reward,
)
from torchbeast.envs.settings import EnvSettings

RIVERRAID = "RiverraidNoFrameskip-v4"


def proxy_of(*args: str) -> RewardProxy | None:
    return proxy_from_flags(vars(parse_flags(["--env", RIVERRAID, *args])))


# Which reward trains the agent.


def test_no_proxy_flag_trains_on_the_game_score():
    assert proxy_of() is None


@pytest.mark.parametrize(
    "args, kind",
    [
        (["--fuel_multiplier", "10"], "fuel"),
        (["--fuel_multiplier", "0"], "fuel"),
        (["--fuel_multiplier", "-2", "--move_penalty", "5"], "pacifist"),
        (["--fuel_multiplier", "1"], "move"),  # the fork's rule: m == 1 means no fuel proxy
        (["--move_penalty", "0"], "move"),  # the pure survival reward
        (["--move_penalty", "-1"], "deviate"),
        (["--true_move_penalty", "1"], "move"),  # any proxy flag follows the fork's table
    ],
)
def test_the_forks_table_picks_the_proxy(args, kind):
    assert proxy_of(*args).kind == kind


def test_the_log_says_each_proxy_in_words():
    # The survival proxy read "10 per step alive, -0 per step moving".
    assert proxy_of("--move_penalty", "0").describe() == (
        "move proxy (10 per step alive); true move penalty 0"
    )
    assert proxy_of("--move_penalty", "2").describe() == (
        "move proxy (10 per step alive, -2 per step moving); true move penalty 0"
    )
    assert proxy_of("--fuel_multiplier", "5").describe().startswith("fuel proxy (canisters worth")


def test_flags_left_out_take_their_defaults():
    assert proxy_of("--move_penalty", "3") == RewardProxy(1.0, 3.0, 0.0)


def test_a_proxy_on_another_game_is_one_clear_error():
    flags = parse_flags(["--env", "PongNoFrameskip-v4", "--fuel_multiplier", "2"])
    with pytest.raises(EnvError, match="Riverraid's reward proxies; PongNoFrameskip-v4"):
        create_env(env_settings(flags))


# Each proxy, one agent step at a time (hand-computed).


def test_fuel_counts_a_canister_and_other_points_in_one_step_apart():
    proxy = RewardProxy(fuel_multiplier=10)
    # Frame 2 shot a canister (80), frame 4 a tanker (30): 800 + 30, not 10 * 110.
    assert proxy_reward(proxy, [0, 80, 0, 30], 76, 76, NO_MISSILE_Y, True) == 830


def test_fuel_leaves_points_that_only_add_up_to_80_alone():
    proxy = RewardProxy(fuel_multiplier=10)
    assert proxy_reward(proxy, [30, 0, 50, 0], 76, 76, NO_MISSILE_Y, True) == 80


def test_fuel_multiplier_zero_makes_canisters_worthless():
    proxy = RewardProxy(fuel_multiplier=0)
    assert proxy_reward(proxy, [80, 60, 0, 0], 76, 76, NO_MISSILE_Y, True) == 60


@pytest.mark.parametrize(
    "missile_y, alive, expected",
    [(NO_MISSILE_Y, True, 10), (120, True, 7), (NO_MISSILE_Y, False, 0), (120, False, -3)],
)
def test_pacifist_pays_for_steps_alive_and_charges_for_missiles(missile_y, alive, expected):
    proxy = RewardProxy(fuel_multiplier=-3)
    assert proxy_reward(proxy, [500, 0, 0, 0], 76, 76, missile_y, alive) == expected


@pytest.mark.parametrize(
    "player_x, previous_x, alive, expected",
    [(76, 76, True, 10), (77, 76, True, 7.5), (60, 61, False, -2.5), (60, 60, False, 0)],
)
def test_move_charges_each_step_that_changes_the_position(player_x, previous_x, alive, expected):
    proxy = RewardProxy(move_penalty=2.5)
    assert proxy_reward(proxy, [80, 0, 0, 0], player_x, previous_x, 180, alive) == expected


@pytest.mark.parametrize("player_x, expected", [(76, 10), (86, 5), (56, -10), (66, 5)])
def test_deviate_charges_the_squared_distance_from_the_centre(player_x, expected):
    proxy = RewardProxy(move_penalty=-1)  # 10 - (x - 76)^2 / 20
    assert proxy_reward(proxy, [0, 0, 0, 0], player_x, 12, 180, True) == expected


def test_the_true_move_is_the_move_measure_with_its_own_penalty():
    assert move_measure(0.5, 80, 79, True) == 9.5
    assert move_measure(0.0, 80, 79, True) == 10
    assert move_measure(-2.0, 86, 86, True) == 0


# The wrappers on a scripted console: per-frame scores, RAM and lives.


class ScriptedConsole:
    """Stands in for ale-py's ALEInterface: RAM and lives from a script."""

    def __init__(self):
        self.ram = np.zeros(128, dtype=np.uint8)
        self.lives_left = 4

    def getRAM(self):  # noqa: N802 (ale-py's name)
        return self.ram.copy()

    def lives(self):
        return self.lives_left


class ScriptedRiverraid(gym.Env):
    """One emulator frame per step; the score, position and lives of each frame come
    from ``frames``: a list of (score, player_x, missile_y, lives)."""

    observation_space = gym.spaces.Box(0, 255, (1,), np.uint8)
    action_space = gym.spaces.Discrete(18)

    def __init__(self, frames, reset_x=76):
        self.ale = ScriptedConsole()
        self.frames = list(frames)
        self.reset_x = reset_x

    def reset(self, *, seed=None, options=None):
        self.ale.ram[PLAYER_X] = self.reset_x
        self.ale.ram[MISSILE_Y] = NO_MISSILE_Y
        return np.zeros(1, np.uint8), {"lives": self.ale.lives_left}

    def step(self, action):
        score, player_x, missile_y, lives = self.frames.pop(0)
        self.ale.ram[PLAYER_X], self.ale.ram[MISSILE_Y] = player_x, missile_y
        self.ale.lives_left = lives
        game_over = lives == 0
        return np.zeros(1, np.uint8), float(score), game_over, False, {"lives": lives}


class RepeatFour(gym.Wrapper):
    """The action repeat of AtariPreprocessing, without its screen processing."""

    def step(self, action):
        total = 0.0
        for _ in range(4):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info


def scripted_env(frames, proxy, reset_x=76):
    console = ScriptedRiverraid(frames, reset_x)
    scores = riverraid.FrameScores(console)
    return riverraid.ProxyReward(RepeatFour(scores), scores, proxy)


def four(score_frame, player_x, missile_y=NO_MISSILE_Y, lives=4, score=0):
    """One agent step: four frames, ``score`` in frame ``score_frame``, the rest nothing."""
    return [(score if i == score_frame else 0, player_x, missile_y, lives) for i in range(4)]


def test_proxy_wrapper_scores_each_agent_step_from_frames_and_ram():
    frames = [
        *four(1, 76, score=80),  # a canister: 80 * 2
        *four(3, 80, score=30),  # a tanker, and a move
        *four(0, 76),  # back in the middle after a crash, the life not yet taken: a move
        *four(0, 76, lives=3),  # the life taken: not alive
        *four(0, 76),  # alive again, no move
    ]
    env = scripted_env(frames, RewardProxy(fuel_multiplier=2, true_move_penalty=1))
    env.reset()
    steps = [env.step(0) for _ in range(5)]
    assert [reward for _, reward, *_ in steps] == [160, 30, 0, 0, 0]
    assert [info["true_reward"] for *_, info in steps] == [80, 30, 0, 0, 0]
    assert [info["true_move"] for *_, info in steps] == [10, 9, 9, 0, 10]


def test_the_previous_position_resets_when_a_life_is_taken():
    frames = [*four(0, 76), *four(0, 90, lives=3), *four(0, 90)]
    env = scripted_env(frames, RewardProxy(move_penalty=4))
    env.reset()
    assert [env.step(0)[1] for _ in range(3)] == [10, 0, 10]  # no move charged after 90


def test_the_previous_position_resets_with_the_game():
    frames = [*four(0, 90), *four(0, 90), *four(0, 50)]
    env = scripted_env(frames, RewardProxy(move_penalty=4), reset_x=76)
    env.reset()
    assert env.step(0)[1] == 6  # 76 -> 90: a move
    assert env.step(0)[1] == 10  # 90 -> 90
    env.unwrapped.reset_x = 50
    env.reset()
    assert env.step(0)[1] == 10  # the new game starts at 50: no move from 90


def test_a_missile_in_flight_costs_the_pacifist():
    frames = [*four(0, 76, missile_y=100), *four(0, 76)]
    env = scripted_env(frames, RewardProxy(fuel_multiplier=-4))
    env.reset()
    assert [env.step(1)[1] for _ in range(2)] == [6, 10]


def test_the_last_step_of_a_game_keeps_its_true_reward_through_the_vector_env():
    # The game ends in its third agent step, which scores 500; the vector env resets the
    # game in that same step and keeps the last step's info aside ("final_info").
    game_over = [(0, 77, NO_MISSILE_Y, 4), (500, 77, NO_MISSILE_Y, 4), (0, 77, NO_MISSILE_Y, 0)]
    frames = [*four(0, 76), *four(0, 77), *game_over, *four(0, 76)]
    vector = gym.vector.SyncVectorEnv(
        [lambda: scripted_env(frames, RewardProxy(move_penalty=1, true_move_penalty=2))],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env = BatchedEnv(vector, RIVERRAID, track_lives=True)
    env.reset()
    steps = [env.step(np.zeros(1, np.int64)) for _ in range(3)]
    last = steps[-1]
    assert last["episode_end"][0]
    assert last["episode_return"][0] == 10 + 9 + 0  # move proxy: alive, moved, game over
    assert last["episode_true_return"][0] == 500
    assert last["episode_true_move"][0] == 10 + 8 + 0


# The real Riverraid ROM.


def play(flags_args, steps, seed=0, fire=False):
    flags = parse_flags(["--env", RIVERRAID, *flags_args])
    env = create_env(env_settings(flags), num_envs=1)
    rng = np.random.default_rng(seed)
    rewards, true_rewards, true_moves = [], [], []
    try:
        previous = env.reset(seed=seed)
        for _ in range(steps):
            action = np.array([1 if fire else rng.integers(18)])
            step = env.step(action)
            start_true = 0.0 if previous["episode_end"][0] else previous["episode_true_return"][0]
            start_move = 0.0 if previous["episode_end"][0] else previous["episode_true_move"][0]
            rewards.append(float(step["reward"][0]))
            true_rewards.append(float(step["episode_true_return"][0] - start_true))
            true_moves.append(float(step["episode_true_move"][0] - start_move))
            previous = step
    finally:
        env.close()
    return np.array(rewards), np.array(true_rewards), np.array(true_moves)


def test_real_rom_fuel_proxy_pays_canisters_ten_times_and_the_true_return_stays_the_score():
    rewards, true_rewards, _ = play(["--fuel_multiplier", "10"], steps=1500)
    extra = rewards - true_rewards
    # Each canister adds 800 - 80 to the proxy; nothing else differs.
    assert set(np.unique(extra)) <= {0.0, 720.0, 1440.0}
    assert (extra == 720).sum() >= 1, "random play shot no canister"
    assert (true_rewards > 0).sum() > (extra > 0).sum()  # other points count the same


def test_real_rom_pacifist_charges_the_steps_a_missile_flies():
    rewards, true_rewards, _ = play(["--fuel_multiplier", "-3"], steps=300, fire=True)
    assert set(np.unique(rewards)) <= {10.0, 7.0, 0.0, -3.0}
    assert (rewards == 7).sum() > 50  # firing all the time keeps a missile in flight
    assert true_rewards.sum() > 0  # and the missiles score, in the true return


def test_real_rom_move_proxy_and_true_move_differ_by_their_penalties():
    rewards, _, true_moves = play(["--move_penalty", "2", "--true_move_penalty", "0.5"], 800)
    moved = rewards == 8
    assert moved.sum() > 10 and (rewards == 10).sum() > 10
    # Alive steps: the same moves, charged 2 by the proxy and 0.5 by the true move.
    alive = (rewards == 10) | moved
    assert np.array_equal(true_moves[alive], np.where(moved, 9.5, 10.0)[alive])


def test_real_rom_the_jump_back_to_the_middle_is_one_move_and_the_life_taken_pays_nothing():
    flags = parse_flags(["--env", RIVERRAID, "--move_penalty", "4"])
    env = create_env(env_settings(flags), num_envs=1)
    console = env.env.envs[0].unwrapped.ale
    try:
        env.reset(seed=0)
        positions, rewards, lives = [], [], []
        for _ in range(200):  # steering right crashes into the bank
            step = env.step(np.array([3]))
            positions.append(int(console.getRAM()[PLAYER_X]))
            rewards.append(float(step["reward"][0]))
            lives.append(console.lives())
    finally:
        env.close()
    back = next(t for t in range(1, 200) if positions[t] == 76 and positions[t - 1] > 85)
    taken = next(t for t in range(1, 200) if lives[t] < lives[t - 1])
    assert back < taken  # the plane is back in the middle before the life is taken
    assert rewards[back] == 6  # 10 alive, minus 4 for the jump
    assert rewards[taken] == 0  # not alive; and no move


def test_real_rom_survival_proxy_starts_every_game_so_a_noop_agent_cannot_wait_forever():
    # A new game ignores the controller for its first frames; pressed then, the reset's
    # FIRE would leave the game waiting, paying 10 per step to an agent that never starts.
    env = create_env(env_settings(parse_flags(["--env", RIVERRAID, "--move_penalty", "0"])))
    try:
        env.reset(seed=0)
        games_over = 0
        for _ in range(3000):
            step = env.step(np.zeros(1, np.int64))
            games_over += int(step["episode_end"][0])
            if games_over == 2:
                break
    finally:
        env.close()
    assert games_over == 2  # flying straight crashes: two whole games within 3,000 steps


def test_real_rom_a_video_without_a_proxy_starts_the_game_as_training_did():
    # Training without a proxy runs AtariVectorEnv, which presses FIRE right after the
    # reset's no-ops; a --video (Gymnasium's wrappers) waited for frame 80 as the proxies
    # do, and played other games: 976-step episodes where eval without --video had 816-820.
    def frame_after_reset(settings: EnvSettings) -> int:
        env = create_env(settings, num_envs=1, render="rgb_array")
        try:
            env.reset(seed=0)
            return env.env.envs[0].unwrapped.ale.getEpisodeFrameNumber()
        finally:
            env.close()

    assert frame_after_reset(EnvSettings(RIVERRAID)) < riverraid.FIRST_INPUT_FRAME
    proxy = EnvSettings(RIVERRAID, options={"move_penalty": 0.0})
    assert frame_after_reset(proxy) > riverraid.FIRST_INPUT_FRAME  # FIRE once it counts


def test_polybeast_passes_proxy_values_that_look_like_options_to_its_env_servers():
    learner_flags = parse_flags(
        ["--env", RIVERRAID, "--move_penalty=-1e-05", "--fuel_multiplier", "1"],
        make_learner_parser("test"),
    )
    env = env_side_of(build_settings(learner_flags, "poly")).env
    assert (env.option("move_penalty"), env.option("fuel_multiplier")) == (-1e-05, 1.0)


def test_real_rom_without_proxy_flags_stays_on_the_fast_vector_env():
    env = create_env(RIVERRAID, num_envs=1)
    try:
        assert type(env.env).__name__ == "AtariVectorEnv"
    finally:
        env.close()
    env = create_env(EnvSettings(RIVERRAID, options={"fuel_multiplier": 2.0}), num_envs=1)
    try:
        assert isinstance(env.env, gym.vector.SyncVectorEnv)
    finally:
        env.close()


# End to end: training logs the true return and move; eval mode writes eval.json.

SHORT_RIVERRAID = [
    "--env", RIVERRAID, "--num_actors", "2", "--envs_per_actor", "2", "--batch_size", "4",
    "--unroll_length", "40", "--hidden_size", "64", "--num_layers", "2", "--disable_cuda",
]  # fmt: skip
FUEL = ["--fuel_multiplier", "10", "--true_move_penalty", "1"]
RIGHT = 3  # Riverraid's action: steering right all the way ends each life in about 64 steps


def assert_fuel_proxy_logged(run_dir, fuel_multiplier: float) -> None:
    """logs.csv of a run on the fuel proxy holds true figures that fit it, in every update
    in which games ended (a random game may score nothing, but not all of them)."""
    rows = [row for row in read_rows(run_dir / "logs.csv") if row["episodes"] != "0"]
    assert rows, "no episode ended"
    for row in rows:
        proxy_return = float(row["mean_episode_return"])
        true_return = float(row["mean_episode_true_return"])
        # Canisters worth 80 * m instead of 80; nothing else differs.
        assert proxy_return >= true_return if fuel_multiplier >= 1 else proxy_return <= true_return
        # 10 per step alive, less q per move with q <= 2 here: positive.
        assert float(row["mean_episode_true_move"]) > 0
    assert any(float(row["mean_episode_true_return"]) > 0 for row in rows)


def steer_right(checkpoint_path) -> None:
    """Makes the checkpoint's greedy action RIGHT, so that greedy games end quickly."""
    state = torch.load(checkpoint_path, weights_only=True)
    state["model_state_dict"]["policy.bias"][RIGHT] += 1e6
    torch.save(state, checkpoint_path)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A short run on the fuel proxy, then its policy made to steer right greedily (an
    untrained greedy policy may never start the game, which waits for the player)."""
    savedir = tmp_path_factory.mktemp("riverraid")
    result = monobeast(savedir, *SHORT_RIVERRAID, *FUEL, "--total_steps", "6000", "--xpid", "r")
    assert result.returncode == 0, result.stderr
    steer_right(savedir / "r" / "model.tar")
    return savedir, result


def test_training_on_a_proxy_logs_true_return_and_move(trained_run):
    savedir, result = trained_run
    assert_fuel_proxy_logged(savedir / "r", fuel_multiplier=10)
    assert "Reward: fuel proxy (canisters worth 800); true move penalty 1." in result.stdout
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "--reward_clipping none" in warnings[0]
    parameters = count_parameters(create_model(dict(kind="atari", hidden_size=64, num_layers=2,
                                                    use_lstm=False), (4, 84, 84), 18))  # fmt: skip
    assert f"atari model, {parameters} parameters" in result.stdout


def test_eval_mode_writes_the_mean_and_std_of_each_figure_to_eval_json(trained_run):
    savedir, _ = trained_run
    # The model flags are read from the checkpoint: the eval command need not repeat them.
    result = monobeast(
        savedir, "--env", RIVERRAID, "--mode", "eval", "--xpid", "r", "--num_episodes", "2",
        *FUEL,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # No word of the proxy flags (they are the trained ones); Riverraid from its start and
    # a greedy policy play one game, which is said.
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "The 2 games were one game played 2 times" in warnings[0]
    report = json.loads((savedir / "r" / "eval.json").read_text())
    assert report["num_episodes"] == 2 and len(report["episodes"]) == 2
    assert report["reward_proxy"] == {
        "fuel_multiplier": 10.0, "move_penalty": 0.0, "true_move_penalty": 1.0
    }  # fmt: skip
    state = torch.load(savedir / "r" / "model.tar", weights_only=True)
    assert report["parameters"] == sum(t.numel() for t in state["model_state_dict"].values())
    for episode in report["episodes"]:
        length = episode["episode_length"]
        assert length > 4  # four lives of steering into the bank
        assert episode["proxy_return_per_step"] == pytest.approx(episode["proxy_return"] / length)
        assert episode["true_return_per_step"] == pytest.approx(episode["true_return"] / length)
        # 10 per step alive, minus 1 per move: steering right moves the plane.
        assert 0 < episode["true_move"] < 10 * length
    for name in ("proxy_return", "true_return", "true_move", "episode_length"):
        values = [episode[name] for episode in report["episodes"]]
        assert report[name]["mean"] == pytest.approx(np.mean(values))
        assert report[name]["std"] == pytest.approx(np.std(values))
        assert f"{name} " in result.stdout  # printed as mean ± std


def test_eval_with_other_proxy_flags_says_so_in_one_warning(trained_run):
    savedir, _ = trained_run
    result = monobeast(
        savedir, "--env", RIVERRAID, "--mode", "eval", "--xpid", "r", "--num_episodes", "1",
        "--move_penalty", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 1
    assert "Playing with reward proxy {'fuel_multiplier': 1.0, 'move_penalty': 2.0" in warnings[0]
    assert "but the run was trained with {'fuel_multiplier': 10.0" in warnings[0]
    report = json.loads((savedir / "r" / "eval.json").read_text())
    assert report["trained_with_reward_proxy"]["fuel_multiplier"] == 10.0
    # Evaluated on the move proxy, 10 A - 2 M over A steps alive and M <= A moves, while
    # the true move (penalty 0) is 10 A: between 80% and 100% of it, since the plane moves.
    episode = report["episodes"][0]
    assert 0.8 * episode["true_move"] <= episode["proxy_return"] < episode["true_move"]


def test_test_mode_names_each_env_flag_it_plays_with_unlike_training(trained_run):
    # Test and eval play with the command line's env flags; the run trained with the fuel
    # proxy and FIRE pressed after a lost life.
    savedir, _ = trained_run
    result = monobeast(
        savedir, "--env", RIVERRAID, "--mode", "test", "--xpid", "r", "--num_episodes", "1",
        "--no_fire_on_life_loss",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, warnings
    assert warnings[0].endswith(
        "Playing with --no_fire_on_life_loss, but the run was trained with no "
        "--no_fire_on_life_loss."
    )
    assert (
        "Playing with reward proxy none (game score), but the run was trained with "
        in (warnings[1])
    )


def test_proxy_flags_that_do_not_apply_to_the_env_played_are_refused_without_a_warning(
    trained_run,
):
    # The warning said it played with a proxy that the next line refused.
    savedir, _ = trained_run
    result = monobeast(
        savedir, "--env", "PongNoFrameskip-v4", "--mode", "test", "--xpid", "r",
        "--num_episodes", "1", "--move_penalty", "2",
    )  # fmt: skip
    assert_one_error_line(result, "are Riverraid's reward proxies; PongNoFrameskip-v4 has none")
    assert "WARNING" not in result.stdout


def test_eval_of_a_file_that_is_no_torchbeast_checkpoint_is_one_clear_error(tmp_path):
    (tmp_path / "r").mkdir()
    torch.save({"model_state_dict": {}}, tmp_path / "r" / "model.tar")
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", "--mode", "eval",
         "--savedir", str(tmp_path), "--xpid", "r"],
        timeout=60,
    )  # fmt: skip
    assert_one_error_line(result, "is not a torchbeast checkpoint (no env)")


def test_a_random_policy_is_evaluated_with_the_proxy_and_the_true_return(tmp_path):
    """No checkpoint needed with --env: the level a study marks in its figures."""
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.monobeast", "--mode", "eval", "--random_policy",
         "--env", "RiverraidNoFrameskip-v4", "--fuel_multiplier", "0", "--num_episodes", "2",
         "--seed", "3", "--savedir", str(tmp_path), "--xpid", "random"],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "random" / "eval.json").exists()  # a trained run's eval stays
    report = json.loads((tmp_path / "random" / "eval_random.json").read_text())
    assert report["policy"] == "random" and report["num_episodes"] == 2
    assert report["reward_proxy"]["fuel_multiplier"] == 0.0
    for episode in report["episodes"]:
        # Random play scores, and with canisters worth 0 its proxy return is at most that.
        assert 0 < episode["true_return"] and episode["proxy_return"] <= episode["true_return"]


def test_a_random_policy_without_a_checkpoint_or_an_env_is_one_line(tmp_path):
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", "--mode", "eval",
         "--random_policy", "--savedir", str(tmp_path), "--xpid", "r"],
        timeout=60,
    )  # fmt: skip
    assert_one_error_line(result, "no checkpoint at")

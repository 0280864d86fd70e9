"""Small environments the integration tests need and Gymnasium does not ship.

Importing this module registers them; name them as ``tests.envs_for_tests:Id``.
"""

import os
import signal
import time

import gymnasium as gym
import numpy as np


class OverflowRewardEnv(gym.Env):
    """Episodes of 10 steps with reward 1 until global step ``overflow_after``; then 1e30.

    Unclipped, such rewards overflow the squared float32 baseline loss to infinity.
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, overflow_after: int = 3000):
        self.overflow_after = overflow_after
        self.steps = 0
        self.episode_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        self.episode_steps += 1
        reward = 1e30 if self.steps > self.overflow_after else 1.0
        return np.zeros(3, np.float32), reward, self.episode_steps >= 10, False, {}


if "OverflowReward-v0" not in gym.registry:
    gym.register("OverflowReward-v0", entry_point=OverflowRewardEnv)


class Float64ObservationEnv(OverflowRewardEnv):
    """Like OverflowRewardEnv without the overflow, with float64 observations."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float64)

    def __init__(self):
        super().__init__(overflow_after=10**12)

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed)
        return observation.astype(np.float64), info

    def step(self, action):
        observation, *rest = super().step(action)
        return (observation.astype(np.float64), *rest)


class SelfKillingEnv(OverflowRewardEnv):
    """Kills its own process after 50 steps, as a crashing emulator would."""

    def step(self, action):
        if self.steps >= 50:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class RaisingEnv(OverflowRewardEnv):
    """Raises after 50 steps, as an environment with a bug would."""

    def step(self, action):
        if self.steps >= 50:
            raise RuntimeError("the emulator crashed")
        return super().step(action)


# The first HangingOnce env to reach its step 50 makes this file and then never returns;
# the others (a replacement actor's too) go on. A test removes the file first.
HANG_ONCE_MARKER = os.path.join("/tmp", f"torchbeast-hang-once-{os.getuid()}")


class HangingOnceEnv(OverflowRewardEnv):
    """Hangs in its step 50, once per marker file, as an env stuck in a call would."""

    def step(self, action):
        if self.steps == 50:
            try:
                os.close(os.open(HANG_ONCE_MARKER, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                while True:
                    time.sleep(60)
        return super().step(action)


class NanObservationEnv(OverflowRewardEnv):
    """Observes NaN from its step 30, as a physics simulation that blew up would."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if self.steps >= 30:
            observation = np.full(3, np.nan, np.float32)
        return observation, reward, terminated, truncated, info


if "Float64Observation-v0" not in gym.registry:
    gym.register("Float64Observation-v0", entry_point=Float64ObservationEnv)
    gym.register("SelfKilling-v0", entry_point=SelfKillingEnv)
    gym.register("Raising-v0", entry_point=RaisingEnv)
    gym.register("NanObservation-v0", entry_point=NanObservationEnv)
    gym.register("HangingOnce-v0", entry_point=HangingOnceEnv)


class CoinsEnv(OverflowRewardEnv):
    """Episodes of 10 steps with reward 1 that also report an episode extra, "coins": each
    step's info holds 2 coins under "coins_this_step", so every episode collects 20. Its
    reset's info has none (a vector env whose envs all end in one step then gives the
    last step's info only under "final_info")."""

    metadata = {"render_modes": [], "episode_extras": {"coins": "coins_this_step"}}

    def __init__(self):
        super().__init__(overflow_after=10**12)

    def step(self, action):  # reset's info has no coins: every env ends in one step
        observation, reward, terminated, truncated, _ = super().step(action)
        return observation, reward, terminated, truncated, {"coins_this_step": 2.0}


if "Coins-v0" not in gym.registry:
    gym.register("Coins-v0", entry_point=CoinsEnv)


class SlowFromSeedEnv(OverflowRewardEnv):
    """Like OverflowRewardEnv without the overflow; a step takes 20 ms in envs seeded 2 or
    above. With --seed 0 and 2 envs per actor, actor 0's envs take seeds 0 and 1, so that
    actor runs far ahead of the others."""

    def __init__(self):
        super().__init__(overflow_after=10**12)
        self.step_seconds = 0.0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.step_seconds = 0.02 if seed >= 2 else 0.0
        return super().reset(seed=seed)

    def step(self, action):
        time.sleep(self.step_seconds)
        return super().step(action)


if "SlowFromSeed-v0" not in gym.registry:
    gym.register("SlowFromSeed-v0", entry_point=SlowFromSeedEnv)


class ResizableEnv(OverflowRewardEnv):
    """Like OverflowRewardEnv without the overflow, with observations of
    $TB_TEST_OBSERVATION_SIZE numbers (3 if unset): an env whose code changed."""

    def __init__(self):
        super().__init__(overflow_after=10**12)
        self.size = int(os.environ.get("TB_TEST_OBSERVATION_SIZE", "3"))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (self.size,), np.float32)

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return np.zeros(self.size, np.float32), info

    def step(self, action):
        _, *rest = super().step(action)
        return (np.zeros(self.size, np.float32), *rest)


class NanRewardEnv(OverflowRewardEnv):
    """Rewards NaN, as a reward computed from a broken simulation would."""

    def step(self, action):
        observation, _, terminated, truncated, info = super().step(action)
        return observation, float("nan"), terminated, truncated, info


class DrawingEnv(OverflowRewardEnv):
    """Draws $TB_TEST_PICTURE: "five-colours" (a [2, 2, 5] picture, which no video
    holds), "raise" (its render() raises from its third step) or an RGB picture."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, render_mode=None):
        super().__init__(overflow_after=10**12)
        self.render_mode = render_mode

    def render(self):
        picture = os.environ.get("TB_TEST_PICTURE", "rgb")
        if picture == "raise" and self.episode_steps >= 3:
            raise RuntimeError("the renderer lost its display")
        colours = 5 if picture == "five-colours" else 3
        return np.zeros((2, 2, colours), np.uint8)


class FailingToStartEnv(OverflowRewardEnv):
    """Raises as it is made, as an env whose simulator is missing would."""

    def __init__(self):
        raise RuntimeError("no simulator license found")


if "Resizable-v0" not in gym.registry:
    gym.register("Resizable-v0", entry_point=ResizableEnv)
    gym.register("NanReward-v0", entry_point=NanRewardEnv, disable_env_checker=True)
    # (Gymnasium's checker would warn of the five colours before torchbeast refuses them.)
    gym.register("Drawing-v0", entry_point=DrawingEnv, disable_env_checker=True)
    gym.register("FailingToStart-v0", entry_point=FailingToStartEnv)


class WalkEnv(OverflowRewardEnv):
    """A walk on a line from 0, deterministic: action 1 steps right, 0 left; the episode
    ends at -3 or +3, or after 20 steps; reward 1 at +3. A greedy policy plays one game."""

    def __init__(self):
        super().__init__(overflow_after=10**12)
        self.position = 0

    def reset(self, *, seed=None, options=None):
        self.position = 0
        return super().reset(seed=seed)

    def step(self, action):
        observation, _, _, _, info = super().step(action)
        self.position += 1 if action == 1 else -1
        ended = abs(self.position) == 3
        observation[0] = self.position / 3
        return observation, float(self.position == 3), ended, self.episode_steps >= 20, info


if "Walk-v0" not in gym.registry:
    gym.register("Walk-v0", entry_point=WalkEnv)


# CartPole cut short by a time limit at 16 steps: random play (about 22 steps a game) ends
# some of its episodes itself before then, and the time limit ends the others (truncated).
if "TimeLimitedCartPole-v0" not in gym.registry:
    gym.register(
        "TimeLimitedCartPole-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=16,
    )

# Pong as ale-py registers it, but with a time limit of 400 frames (100 agent steps).
if "ShortPongNoFrameskip-v4" not in gym.registry:
    gym.register(
        "ShortPongNoFrameskip-v4",
        entry_point="ale_py.env:AtariEnv",
        kwargs={
            "game": "pong",
            "repeat_action_probability": 0.0,
            "full_action_space": False,
            "frameskip": 1,
            "max_num_frames_per_episode": 400,
        },
    )

"""PixelCue: a synthetic pixel task that a correct pipeline learns in a minute or two.

Every frame lights one of four quadrants of an 84x84 picture (uint8 [4, 84, 84], the
Atari stack's shape, so it runs through the conv torso); the right action is the number of
the lit quadrant. The reward comes only at the episode's last step: the fraction of the
episode's steps answered right. A uniform policy scores 1/4 on average, a perfect one 1.

It checks what Atari needs and CartPole does not: pixels through the conv torso, a reward
that arrives after the actions it rewards (bootstrapping across steps), and actions lined
up with the frames they answer. A pipeline that shifts frames against actions by one step
learns nothing here: the cue of each step is drawn afresh.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from torchbeast.envs.family import EnvFamily

ENV_ID = "torchbeast/PixelCue-v0"
SIZE = 84
HALF = SIZE // 2
LIT = 255


class PixelCue(gym.Env):
    """Light quadrant k (0 top left, 1 top right, 2 bottom left, 3 bottom right); press k."""

    observation_space = gym.spaces.Box(0, 255, (4, SIZE, SIZE), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, episode_length: int = 4):
        self.episode_length = episode_length
        self.frame = np.zeros((4, SIZE, SIZE), dtype=np.uint8)
        self.cue = 0
        self.steps = 0
        self.right = 0

    def _show_new_cue(self) -> np.ndarray:
        self.cue = int(self.np_random.integers(4))
        self.frame[:] = 0
        row, column = divmod(self.cue, 2)
        self.frame[:, row * HALF : (row + 1) * HALF, column * HALF : (column + 1) * HALF] = LIT
        return self.frame.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps = self.right = 0
        return self._show_new_cue(), {}

    def step(self, action: int):
        self.right += int(action) == self.cue
        self.steps += 1
        ended = self.steps >= self.episode_length
        reward = self.right / self.episode_length if ended else 0.0
        return self._show_new_cue(), reward, ended, False, {}


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=PixelCue)


class PixelCueFamily(EnvFamily):
    """PixelCue, the pipeline's own check (``make learn``)."""

    name = "PixelCue"
    summary = "the synthetic pixel task of the learning checks"

    def cannot_train(self, env_id: str) -> str | None:
        return None  # every id of the family trains

    def takes(self, env_id: str, spec: gym.envs.registration.EnvSpec) -> bool:
        return spec.id == ENV_ID

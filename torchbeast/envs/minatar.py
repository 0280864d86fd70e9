"""The MinAtar family (``MinAtar/*-v1``; ``pip install MinAtar``): small [10, 10, C] grids
of Atari-like games, made by Gymnasium, and the settings that learned them here."""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym

from torchbeast.envs.family import EnvFamily, Preset
from torchbeast.envs.registry import MINATAR_PREFIX

GRID_TORSO = Preset(
    "MinAtar",
    {"torso": "grid", "entropy_cost": 0.01},
    "Breakout, seed 1: 21.1 at 5M (MLP torso: 6.2), and 28.8 with `--env` alone (seed "
    "474635); SpaceInvaders, seeds 1-3: 138.8-165.4 at 5M (MLP: 54.8); measured on these "
    "two games, the MinAtar paper's network for all",
    "`--env MinAtar/*`",
)
SPACE_INVADERS = Preset(
    "MinAtar/SpaceInvaders-v1",
    {"learning_rate": 0.0028},
    "with the MinAtar preset, seeds 1-4: 175.9, 180.5, 195.9, 156.2 at 5M, and 150.6 with "
    "`--env` alone (seed 548381) (default rate: 138.8-165.4 in seeds 1-3)",
    "`--env MinAtar/SpaceInvaders-v1`",
)


class MinAtarFamily(EnvFamily):
    name = "MinAtar"
    summary = "MinAtar's grid games (pip install MinAtar)"

    def cannot_train(self, env_id: str) -> str | None:
        return None  # every id of the family trains

    def takes(self, env_id: str, spec: gym.envs.registration.EnvSpec) -> bool:
        return spec.id.startswith(MINATAR_PREFIX)

    def known_presets(self) -> list[Preset]:
        return [GRID_TORSO, SPACE_INVADERS]

    def presets(self, env_id: str, given: Mapping[str, object]) -> list[Preset]:
        game = gym.spec(env_id.rpartition(":")[2]).id
        return [GRID_TORSO] + ([SPACE_INVADERS] if game == SPACE_INVADERS.scope else [])

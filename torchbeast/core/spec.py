"""What the learner needs to know about an environment (no torch here: env servers use it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an environment."""

    env_id: str
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    num_actions: int

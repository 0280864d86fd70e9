"""Lists the environment ids torchbeast can create: python -m torchbeast.envs [FILTER]."""

import sys

import gymnasium as gym

from torchbeast.envs.registry import _register_optional_envs

_register_optional_envs()
pattern = sys.argv[1].lower() if len(sys.argv) > 1 else ""
for env_id in sorted(gym.registry):
    if pattern in env_id.lower():
        print(env_id)

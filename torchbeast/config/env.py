"""From parsed flags to the env's settings, free of torch: env processes build theirs here too."""

from __future__ import annotations

import argparse

from torchbeast.envs.family import families
from torchbeast.envs.settings import EnvSettings


def env_settings(flags: argparse.Namespace) -> EnvSettings:
    """The run's environments: ``--env``, ``--seed`` and every family's flags."""
    parsed = vars(flags)
    options = {
        name: parsed[name] for family in families() for name in family.flag_names if name in parsed
    }
    return EnvSettings(flags.env, flags.seed, options)

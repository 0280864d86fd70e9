"""From parsed flags to settings, free of torch: env processes build theirs here too."""

from __future__ import annotations

import argparse
import dataclasses

from torchbeast.envs.family import families
from torchbeast.envs.settings import EnvSettings


def from_flags(settings_type, parsed: argparse.Namespace, /, **given):
    """``settings_type`` from the ``parsed`` flags of its fields' names, but those ``given``;
    a field with a default keeps it where the parser had no such flag (a runtime's own flag,
    e.g. MonoBeast's --central_inference, parsed by the flags of every runtime)."""
    values = dict(given)
    for field in dataclasses.fields(settings_type):
        if field.name in given:
            continue
        if field.default is not dataclasses.MISSING and field.name not in vars(parsed):
            continue
        values[field.name] = getattr(parsed, field.name)
    return settings_type(**values)


def env_settings(flags: argparse.Namespace) -> EnvSettings:
    """The run's environments: ``--env``, ``--seed`` and every family's flags."""
    parsed = vars(flags)
    options = {
        name: parsed[name] for family in families() for name in family.flag_names if name in parsed
    }
    return EnvSettings(flags.env, flags.seed, options)

"""From parsed flags to settings, free of torch: env processes build theirs here too."""

from __future__ import annotations

import argparse
import dataclasses

from torchbeast.envs.settings import EnvSettings


def from_flags(settings_type, parsed: argparse.Namespace, /, **given):
    """``settings_type`` from the ``parsed`` flags of its fields' names, but those ``given``."""
    fields = dataclasses.fields(settings_type)
    names = [field.name for field in fields if field.name not in given]
    return settings_type(**{name: getattr(parsed, name) for name in names}, **given)


def env_settings(flags: argparse.Namespace) -> EnvSettings:
    """The run's environments: the flags of the same names."""
    return from_flags(EnvSettings, flags)

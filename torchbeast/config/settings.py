"""From the parsed flags to the typed settings that the algorithm takes, once, at the edge:
``core/`` receives these objects, never an argparse namespace."""

from __future__ import annotations

import argparse
import dataclasses

from torchbeast.core.learner import LearnerSettings
from torchbeast.core.models import ModelSettings


def learner_settings(flags: argparse.Namespace) -> LearnerSettings:
    """The learner's settings: the flags of the same names."""
    return _from_flags(LearnerSettings, flags)


def model_settings(flags: argparse.Namespace) -> ModelSettings:
    """The model's settings: the flags of the same names."""
    return _from_flags(ModelSettings, flags)


def _from_flags(settings_type, flags: argparse.Namespace):
    names = [field.name for field in dataclasses.fields(settings_type)]
    return settings_type(**{name: getattr(flags, name) for name in names})

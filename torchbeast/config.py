"""From the parsed flags to the typed settings that the algorithm takes, once, at the edge:
``core/`` receives these objects, never an argparse namespace."""

from __future__ import annotations

import argparse
import dataclasses

from torchbeast.core.learner import LearnerSettings


def learner_settings(flags: argparse.Namespace) -> LearnerSettings:
    """The learner's settings: the flags of the same names."""
    names = [field.name for field in dataclasses.fields(LearnerSettings)]
    return LearnerSettings(**{name: getattr(flags, name) for name in names})

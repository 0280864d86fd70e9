"""Specification of the typed settings: built once from the parsed flags, and frozen."""

from __future__ import annotations

import dataclasses

import pytest

from torchbeast.config.flags import parse_flags
from torchbeast.config.settings import learner_settings


def test_learner_settings_are_the_flags_of_the_same_names_and_frozen():
    learner = learner_settings(parse_flags(["--entropy_cost", "0.02", "--optimizer", "adam"]))
    assert (learner.entropy_cost, learner.optimizer, learner.unroll_length) == (0.02, "adam", 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        learner.entropy_cost = 0.5  # nothing edits settings once they are built

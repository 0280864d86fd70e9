"""What every entry point does after building its parser: parse, dispatch, report errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import gymnasium as gym

from torchbeast.core.checkpoint import CheckpointError
from torchbeast.core.flags import parse_flags
from torchbeast.envs import EnvError
from torchbeast.runtime.mono import TrainingError

# gym's DependencyNotInstalled: e.g. --mode test_render of CartPole without pygame.
USER_ERRORS = (EnvError, CheckpointError, TrainingError, gym.error.DependencyNotInstalled)


def run(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    train: Callable[[argparse.Namespace], object],
    test: Callable[..., object],
) -> int:
    """Runs the mode the flags ask for; a user's error is one line on stderr, exit 1."""
    flags = parse_flags(argv, parser)
    try:
        if flags.mode == "train":
            train(flags)
        else:
            test(flags, render=flags.mode == "test_render")
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0

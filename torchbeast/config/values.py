"""Argparse value types that refuse impossible values with a message naming the flag's rule."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


SEED_LIMIT = 2**32  # seeds below it suit every generator a run seeds (torch, numpy, envs)


def seed_int(text: str) -> int:
    value = int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {SEED_LIMIT - 1}], got {text}")
    return value


# The largest float32: rates, costs and limits meet float32 tensors (PyTorch refuses a
# larger scalar with a traceback deep in the optimizer).
LARGEST = 3.4028234663852886e38


def nonnegative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value <= LARGEST:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (an infinite rate or cost makes every loss non-finite; a
    user who means "no limit" gives a large number)."""
    value = float(text)
    if not 0 < value <= LARGEST:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def unit_float(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value

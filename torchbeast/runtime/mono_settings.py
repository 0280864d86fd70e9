"""MonoBeast's own flags and settings (torch-free: the parser and the settings are built at
the edge, before any runtime is imported)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from torchbeast.config.env import from_flags


@dataclass(frozen=True)
class MonoSettings:
    num_buffers: int  # shared-memory rollout buffers
    central_inference: bool = False  # the learner process acts for every actor


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("MonoBeast")
    group.add_argument(
        "--central_inference",
        action="store_true",
        help="(new) MonoBeast: actors only step their environments; one thread of the "
        "learner process runs one batched forward pass for every actor waiting, on the "
        "learner's device (the GPU where there is one), as SEED RL and Sample Factory do.",
    )


def settings(flags: argparse.Namespace) -> MonoSettings:
    return from_flags(MonoSettings, flags)

"""RayBeast's own flags and settings (imports no Ray: the edge builds them first)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from torchbeast.config.env import from_flags


@dataclass(frozen=True)
class RaySettings:
    ray_address: str | None  # None: a local Ray instance


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("RayBeast")
    group.add_argument(
        "--ray_address",
        default=None,
        metavar="ADDRESS",
        help="(new) A running Ray cluster to join: host:port of its head, or auto "
        "(default: start a local Ray instance bound to 127.0.0.1, stopped at the end).",
    )


def settings(flags: argparse.Namespace) -> RaySettings:
    return from_flags(RaySettings, flags)

"""MonoBeast's own settings, each declared once as its flag (torch-free: the parser and the
settings are built at the edge, before any runtime is imported)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from torchbeast.config.resolvers import Sources
from torchbeast.core.settings import flag


@dataclass(frozen=True)
class MonoSettings:
    flags_group: ClassVar[str] = "MonoBeast"

    central_inference: bool = flag(
        False,
        "(new) MonoBeast: actors only step their environments; an inference process "
        "beside the learner's runs one batched forward pass for every actor waiting, on the "
        "learner's device (the GPU where there is one), as Sample Factory's policy workers "
        "do.",
    )
    env_groups: int | None = flag(
        None,
        "(new) MonoBeast with --central_inference: each actor steps its envs in this many "
        "groups that take turns, one group stepping while the server chooses the others' "
        "actions (Sample Factory's double-buffered sampling); 1: all at once (default: 2 "
        "where --envs_per_actor is even, else 1).",
        metavar="N",
        check="positive",
    )


def default_env_groups(envs_per_actor: int, central_inference: bool) -> int:
    """--env_groups where not given: 2 with central inference where the envs split evenly,
    else 1."""
    return 2 if central_inference and envs_per_actor % 2 == 0 else 1


def resolve_env_groups(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """--env_groups: 2 with --central_inference where the envs split evenly, else 1; one
    given must divide --envs_per_actor, and only central inference takes it."""
    envs, groups = flags.envs_per_actor, flags.env_groups
    if groups is None:
        return dict(env_groups=default_env_groups(envs, flags.central_inference))
    if groups > 1 and not flags.central_inference:
        parser.error(
            f"--env_groups {groups} takes turns waiting for central inference's actions: "
            "add --central_inference, or leave --env_groups out"
        )
    if envs % groups:
        parser.error(
            f"--env_groups {groups} does not divide --envs_per_actor {envs} into equal "
            f"groups: give a divisor of {envs}"
        )
    return {}


def adjust_parser(parser: argparse.ArgumentParser) -> None:
    """What MonoBeast's flags derive: --env_groups from the layout."""
    parser.resolvers.append(resolve_env_groups)

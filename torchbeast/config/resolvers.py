"""What a parse derives from the flags given (defaults that depend on other flags), and
the combinations it refuses; ``parse_flags`` runs a parser's resolvers in order."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable

# Fills defaults derived from other flags, or refuses a combination: the flags it resolves.
Resolver = Callable[[argparse.Namespace, argparse.ArgumentParser], dict]

# The default layout: this many environments in all, spread over the actors.
DEFAULT_ENVS = 16


def min_num_buffers(flags: argparse.Namespace) -> int:
    """Fewest buffers with which actors and learner can never wait on each other forever."""
    return flags.batch_size + flags.num_actors * (flags.envs_per_actor - 1)


def default_num_actors() -> int:
    """As many actors as cores, up to 16, rounded down to a power of 2 (a divisor of 16)."""
    cores = min(len(os.sched_getaffinity(0)), DEFAULT_ENVS)
    return 1 << (cores.bit_length() - 1)


def resolve_layout(flags: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """--num_actors and --envs_per_actor: the machine's layout of DEFAULT_ENVS environments
    when neither is given, one env per actor (the original's) when only --num_actors is."""
    num_actors, envs_per_actor = flags.num_actors, flags.envs_per_actor
    if num_actors is None:
        num_actors = default_num_actors()
        if envs_per_actor is None:
            envs_per_actor = DEFAULT_ENVS // num_actors
    return dict(num_actors=num_actors, envs_per_actor=envs_per_actor or 1)


def resolve_run_folder(flags: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """--savedir with ~ and $VARS expanded; --xpid, a plain folder name, from the time if
    not given."""
    xpid = flags.xpid or "torchbeast-" + time.strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._=+-]+", xpid) or xpid in (".", ".."):
        parser.error(
            f"--xpid {xpid!r} is not a plain folder name: use letters, digits and . _ - = + only"
        )
    return dict(savedir=os.path.expanduser(os.path.expandvars(flags.savedir)), xpid=xpid)


def resolve_num_buffers(flags: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """MonoBeast's --num_buffers: its default, or a refusal of too few."""
    needed = min_num_buffers(flags)
    if flags.num_buffers is None:
        return dict(num_buffers=max(2 * flags.num_actors * flags.envs_per_actor, needed))
    if flags.num_buffers < needed:
        parser.error(
            f"--num_buffers {flags.num_buffers} is too few for --batch_size {flags.batch_size} "
            f"with {flags.num_actors} actors x {flags.envs_per_actor} envs: "
            f"use --num_buffers {needed} or more"
        )
    return {}

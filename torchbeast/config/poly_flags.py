"""PolyBeast's parsers: what the learner's derives from its flags, and ``polybeast_env``'s
flags, from the settings that declare them (``config.poly``). No torch and no gRPC: env
machines and env processes import them."""

from __future__ import annotations

import argparse

from torchbeast.config.declared import add_declared_flags
from torchbeast.config.flags import add_env_side_flags
from torchbeast.config.poly import PolyEnvSettings, resolve_learner_flags


def adjust_learner_parser(parser: argparse.ArgumentParser) -> None:
    """The learner's parser, beyond the flags PolySettings declares (``runtime.registry``):
    the defaults they derive, and ``--env`` none (the checkpoint or the first env stream
    names it)."""
    parser.set_defaults(env=None)
    parser.resolvers.append(resolve_learner_flags)


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """polybeast_env's flags."""
    add_declared_flags(parser, PolyEnvSettings)
    add_env_side_flags(parser)

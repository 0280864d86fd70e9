"""polybeast_env's flags, kept free of torch: env machines and env processes import them."""

from __future__ import annotations

import argparse

from torchbeast.config import flags as core_flags
from torchbeast.config.flags import nonnegative_int, positive_int
from torchbeast.runtime.poly import network


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """polybeast_env's flags."""
    network.add_network_flags(parser)
    add = parser.add_argument
    add("--env", type=str, default="PongNoFrameskip-v4", help="Gymnasium environment id.")
    add("--seed", type=nonnegative_int, default=None, help="(new) Seed for the environments.")
    add(
        "--connect",
        default=None,
        metavar="ADDRESS",
        help="(new) Inverted mode: dial the learner at ADDRESS (its --serve) instead of serving.",
    )
    add(
        "--clients_per_process",
        default=1,
        type=positive_int,
        help="(new) Inverted mode: env clients (streams) per process.",
    )
    add(
        "--envs_per_stream",
        default=1,
        type=positive_int,
        help="(new) Environments one stream steps together (a vectorised env, batched "
        "messages: less gRPC overhead per step).",
    )
    add(
        "--client_steps",
        default=0,
        type=nonnegative_int,
        help="(new) Inverted mode: a client leaves after this many steps (0: stays).",
    )
    add(
        "--max_streams",
        default=256,
        type=positive_int,
        help="(new) Classic mode: most streams one env server serves at once.",
    )
    core_flags.add_env_side_flags(parser)


def make_env_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="PolyBeast env servers (or, with --connect, env clients).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_env_flags(parser)
    return parser

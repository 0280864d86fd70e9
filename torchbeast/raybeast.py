"""RayBeast: IMPALA with Ray actors, on this machine or on an existing Ray cluster.

python -m torchbeast.raybeast --env PongNoFrameskip-v4                # a local Ray, started here
python -m torchbeast.raybeast --ray_address auto --env PongNoFrameskip-v4   # a running cluster
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from torchbeast.cli import run
from torchbeast.core.flags import make_parser, nonnegative_int
from torchbeast.runtime import mono
from torchbeast.runtime.training import TrainingError

REACH_TIMEOUT_S = 5.0


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--ray_address",
        default=None,
        metavar="ADDRESS",
        help="(new) A running Ray cluster to join: host:port of its head, or auto "
        "(default: start a local Ray instance bound to 127.0.0.1, stopped at the end).",
    )
    add(
        "--episodes_for_avg",
        default=0,
        type=nonnegative_int,
        metavar="N",
        help="(new) Print the mean return once N episodes have ended since the last one "
        "printed (0: the last 100 episodes on every progress line).",
    )
    add(
        "--suppress_logs",
        action="store_true",
        help="(new) Only progress lines (steps, SPS, loss, mean return) and warnings on the "
        "console; out.log keeps everything.",
    )


def make_ray_parser() -> argparse.ArgumentParser:
    parser = make_parser("RayBeast: IMPALA with Ray actors, on one machine or a Ray cluster.")
    add_ray_flags(parser)
    return parser


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def prepare_environment(flags: argparse.Namespace) -> None:
    """Settings Ray reads from the environment when it is imported, so set them first.

    Ray replaces 127.0.0.1 with this machine's network address unless told that this is
    a single-machine cluster; then every Ray server listens on 127.0.0.1 only. Token
    authentication is asked for when joining a cluster (Ray starts its own clusters with
    it); RAY_AUTH_MODE=disabled in the environment opts out.
    """
    host = None if flags.ray_address in (None, "auto") else flags.ray_address.rpartition(":")[0]
    if flags.ray_address is None or (host is not None and is_loopback(host)):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if host is not None:
        check_reachable(flags.ray_address)


def check_reachable(address: str) -> None:
    """Fails in seconds where Ray would retry an unreachable address for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TrainingError(
            f"--ray_address {address!r} is not host:port (e.g. 127.0.0.1:6379) or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as error:
        raise TrainingError(
            f"cannot reach a Ray cluster at --ray_address {address}: {error}. Start one "
            "with `ray start --head`, or leave out --ray_address to run Ray on this machine"
        ) from None


def train(flags: argparse.Namespace) -> dict:
    prepare_environment(flags)
    from torchbeast.runtime import ray_actors  # imports Ray: after prepare_environment

    return ray_actors.train(flags)


def main(argv: list[str] | None = None) -> int:
    return run(make_ray_parser(), argv, train=train, test=mono.test)


if __name__ == "__main__":
    sys.exit(main())

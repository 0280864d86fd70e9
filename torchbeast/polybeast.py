"""PolyBeast in one command: starts the env servers and the learner, stops both when done.

python -m torchbeast.polybeast --env PongNoFrameskip-v4
python -m torchbeast.polybeast --serve unix:/tmp/learner    # inverted: env clients dial in
"""

from __future__ import annotations

import argparse
import math
import sys

from torchbeast.cli import run
from torchbeast.runtime import mono
from torchbeast.runtime.poly import env_side, trainer


def env_flags(flags: argparse.Namespace) -> argparse.Namespace:
    """polybeast_env's flags for the learner's run: same env, addresses, TLS and token."""
    args = ["--env", flags.env, "--pipes_basename", flags.pipes_basename]
    args += ["--num_servers", str(flags.num_servers)]
    if flags.seed is not None:
        args += ["--seed", str(flags.seed)]
    if flags.serve:
        per_server = math.ceil(flags.num_actors / flags.num_servers)
        args += ["--connect", flags.serve, "--envs_per_server", str(per_server)]
    for name in ("auth_token", "tls_cert", "tls_key", "tls_ca"):
        if getattr(flags, name):
            args += [f"--{name}", getattr(flags, name)]
    parsed = trainer.make_env_parser().parse_args(args)
    parsed.env_servers = flags.env_servers
    return parsed


def train(flags: argparse.Namespace) -> dict:
    processes = env_side.start_processes(env_flags(flags))
    try:
        return trainer.train(flags)
    finally:
        env_side.stop_processes(processes)


def main(argv: list[str] | None = None) -> int:
    parser = trainer.make_learner_parser("PolyBeast: env servers and learner in one command.")
    parser.set_defaults(env="PongNoFrameskip-v4")
    return run(parser, argv, train=train, test=mono.test)


if __name__ == "__main__":
    sys.exit(main())

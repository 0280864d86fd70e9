"""Every entry point's parser, built from the flag groups (``flags``: those of every
runtime; ``poly_flags``: PolyBeast's; here: RayBeast's and the benchmark's)."""

from __future__ import annotations

import argparse

from torchbeast.config.argparser import FlagParser
from torchbeast.config.flags import make_parser
from torchbeast.config.poly import resolve_learner_flags
from torchbeast.config.poly_flags import add_env_flags, add_learner_flags
from torchbeast.config.resolvers import resolve_num_buffers
from torchbeast.config.values import nonnegative_int, positive_int


def add_mono_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--central_inference",
        action="store_true",
        help="(new) MonoBeast: actors only step their environments; one thread of the "
        "learner process runs one batched forward pass for every actor waiting, on the "
        "learner's device (the GPU where there is one), as SEED RL and Sample Factory do.",
    )


def make_mono_parser() -> argparse.ArgumentParser:
    parser = make_parser("MonoBeast: IMPALA on one machine, actors in processes.")
    add_mono_flags(parser)
    return parser


def make_learner_parser(
    description: str = "PolyBeast learner: IMPALA with environments as gRPC peers.",
) -> argparse.ArgumentParser:
    """``polybeast_learner``'s parser; ``polybeast`` and the benchmark start from it."""
    parser = make_parser(description, shared_memory_buffers=False)
    add_learner_flags(parser)
    parser.resolvers.append(resolve_learner_flags)
    return parser


def make_poly_parser() -> argparse.ArgumentParser:
    parser = make_learner_parser("PolyBeast: env servers and learner in one command.")
    parser.set_defaults(env="PongNoFrameskip-v4")
    return parser


def make_env_parser() -> argparse.ArgumentParser:
    """``polybeast_env``'s parser."""
    parser = FlagParser(description="PolyBeast env servers (or, with --connect, env clients).")
    add_env_flags(parser)
    return parser


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray_address",
        default=None,
        metavar="ADDRESS",
        help="(new) A running Ray cluster to join: host:port of its head, or auto "
        "(default: start a local Ray instance bound to 127.0.0.1, stopped at the end).",
    )


def make_ray_parser() -> argparse.ArgumentParser:
    parser = make_parser(
        "RayBeast: IMPALA with Ray actors, on one machine or a Ray cluster.",
        shared_memory_buffers=False,
    )
    add_ray_flags(parser)
    return parser


def make_bench_parser(runtimes: list[str]) -> argparse.ArgumentParser:
    """The benchmark's: every runtime's flags, ``--runtime`` one of ``runtimes``, and the
    measurement window."""
    parser = make_learner_parser("Benchmark a runtime: steady-state SPS and per-stage CPU costs.")
    # The data path's figure, comparable with the original MonoBeast's: its batch shape and
    # one gradient step per batch (the training defaults take two).
    parser.set_defaults(
        env="PongNoFrameskip-v4",
        batch_size=4,
        unroll_length=80,
        epochs=1,
        ppo_clip=0.0,
        num_actors=2,
        envs_per_actor=8,
        total_steps=10**12,
    )
    add_ray_flags(parser)
    add_mono_flags(parser)
    parser.add_argument("--runtime", default="mono", choices=runtimes)
    parser.add_argument("--warmup_steps", type=nonnegative_int, default=20_000)
    parser.add_argument("--bench_steps", type=positive_int, default=60_000)
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="Also write the figures to FILE as JSON."
    )
    parser.resolvers.append(resolve_num_buffers_of_mono)
    return parser


def resolve_num_buffers_of_mono(flags: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """--num_buffers, for the one runtime with shared-memory buffers; --central_inference,
    for the one runtime whose actors could run their own."""
    if flags.runtime == "mono":
        return resolve_num_buffers(flags, parser)
    if flags.central_inference:
        parser.error(
            f"--central_inference is MonoBeast's (--runtime {flags.runtime} has its own "
            "inference): leave it out, or use --runtime mono"
        )
    return {}

"""PolyBeast training: the shared Trainer fed by env streams over gRPC."""

from __future__ import annotations

import argparse
import logging
import math
import os

import torch
from torch import nn

from torchbeast.core import flags as core_flags
from torchbeast.core.filewriter import setup_console_logging
from torchbeast.core.flags import make_parser, nonnegative_float, nonnegative_int, positive_int
from torchbeast.envs.riverraid import PROXY_FLAGS
from torchbeast.runtime.poly import network
from torchbeast.runtime.poly.actor_pool import PolyActorPool
from torchbeast.runtime.training import Trainer

log = logging.getLogger("torchbeast")


def add_learner_flags(parser: argparse.ArgumentParser) -> None:
    """The learner's PolyBeast flags (the original's, plus addresses and inverted mode)."""
    network.add_network_flags(parser)
    add = parser.add_argument
    parser.set_defaults(env=None)
    add(
        "--serve",
        default=None,
        metavar="ADDRESS",
        help="(new) Inverted mode: serve env clients on ADDRESS (e.g. unix:/tmp/learner or "
        "127.0.0.1:4431) instead of dialling env servers.",
    )
    add(
        "--max_clients",
        default=256,
        type=positive_int,
        help="(new) Inverted mode: most env clients connected at once.",
    )
    add(
        "--max_learner_queue_size",
        default=None,
        type=positive_int,
        metavar="N",
        help="Most rollouts waiting for the learner (default: batch_size).",
    )
    add(
        "--num_inference_threads",
        default=2,
        type=positive_int,
        metavar="N",
        help="Number of threads running batched inference.",
    )
    add(
        "--max_inference_batch_size",
        default=512,
        type=positive_int,
        help="(new) Most env streams in one inference batch.",
    )
    add(
        "--inference_timeout_ms",
        default=1.0,
        type=nonnegative_float,
        help="(new) Longest wait for more streams to join an inference batch.",
    )


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


def make_learner_parser(description: str) -> argparse.ArgumentParser:
    parser = make_parser(description)
    add_learner_flags(parser)
    return parser


def make_env_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="PolyBeast env servers (or, with --connect, env clients).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_env_flags(parser)
    return parser


def finish_learner_flags(flags: argparse.Namespace) -> None:
    if flags.max_learner_queue_size is None:
        flags.max_learner_queue_size = flags.batch_size


def env_flags(flags: argparse.Namespace) -> argparse.Namespace:
    """polybeast_env's flags for the learner's run: same env, addresses, TLS and token."""
    args = ["--env", flags.env, "--pipes_basename", flags.pipes_basename]
    args += ["--num_servers", str(flags.num_servers)]
    args += ["--envs_per_stream", str(flags.envs_per_actor)]
    if flags.seed is not None:
        args += ["--seed", str(flags.seed)]
    if flags.no_fire_on_life_loss:
        args.append("--no_fire_on_life_loss")
    if flags.serve:
        per_server = math.ceil(flags.num_actors / flags.num_servers)
        args += ["--connect", flags.serve, "--clients_per_process", str(per_server)]
    for name in ("auth_token", "tls_cert", "tls_key", "tls_ca", *PROXY_FLAGS):
        if getattr(flags, name) is not None:
            args.append(f"--{name}={getattr(flags, name)}")  # "=": values may start with "-"
    parsed = make_env_parser().parse_args(args)
    parsed.env_servers = flags.env_servers
    return parsed


class PolyTrainer(Trainer):
    """Training on rollouts that env streams deliver to ``pool``."""

    def __init__(self, flags: argparse.Namespace, pool: PolyActorPool):
        super().__init__(flags, pool.wait_for_spec())
        self.flags.env = self.env_spec.env_id  # as the environments said, for checkpoints
        self.poly_pool = pool

    def create_pool(self) -> PolyActorPool:
        run_dir = os.path.join(self.flags.savedir, self.flags.xpid)
        self.poly_pool.attach(self.learner.model, self.config, run_dir)
        return self.poly_pool

    def publish(self, model: nn.Module) -> None:
        self.poly_pool.publish(model)


def limit_intra_op_threads(flags: argparse.Namespace) -> None:
    """Learner and inference threads run ops at the same time; each op's own thread pool
    must not oversubscribe the cores (on 2 cores, 2 threads per op cost 25% of the SPS)."""
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // (flags.num_learner_threads + flags.num_inference_threads))
    torch.set_num_threads(threads)
    log.info("PyTorch uses %d thread(s) per op on the learner's CPU.", threads)


def train(flags: argparse.Namespace, env_processes: list | None = None) -> dict:
    """Starts the network side, waits for the first environment, then trains.

    ``env_processes``: env processes started for this run; if all of them exit, it stops.
    """
    setup_console_logging()
    finish_learner_flags(flags)
    limit_intra_op_threads(flags)
    pool = PolyActorPool(flags, env_processes)
    try:
        pool.listen()
        return PolyTrainer(flags, pool).train()
    finally:
        pool.stop()


# The PolyBeast flag tables in README.md are generated from these parsers (`make docs`).

README_BEGIN = "<!-- polyflags:begin (generated by `make docs`; do not edit by hand) -->"
README_END = "<!-- polyflags:end -->"


def markdown_reference() -> str:
    shared = frozenset(action.dest for action in make_parser()._actions)
    learner = core_flags.markdown_reference(make_learner_parser(""), exclude=shared)
    env = core_flags.markdown_reference(make_env_parser())
    return (
        f"`polybeast` and `polybeast_learner`, besides the flags above:\n\n{learner}\n\n"
        f"`polybeast_env`:\n\n{env}"
    )

"""PolyBeast training: the shared Trainer fed by env streams over gRPC."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from torchbeast import envs
from torchbeast.config import flags as core_flags
from torchbeast.config.flags import (
    make_parser,
    nonnegative_float,
    positive_float,
    positive_int,
)
from torchbeast.core import checkpoint
from torchbeast.core.spec import EnvSpec
from torchbeast.envs.riverraid import PROXY_FLAGS
from torchbeast.runtime.console import setup_console_logging
from torchbeast.runtime.poly import env_side, network
from torchbeast.runtime.poly.actor_pool import PolyActorPool
from torchbeast.runtime.poly.env_flags import make_env_parser
from torchbeast.runtime.processes import process_cpu_seconds
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
        "--stream_timeout_s",
        default=60.0,
        type=positive_float,
        help="(new) Close an env stream that sends no Step for this long (a client must "
        "also send its Hello within 10 s).",
    )
    add(
        "--stream_memory_mb",
        default=None,
        type=positive_int,
        metavar="MIB",
        help="(new) Most memory all env streams' rollout buffers may take; a stream that "
        "would exceed it is refused (default: a quarter of this machine's memory).",
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


def make_learner_parser(description: str) -> argparse.ArgumentParser:
    parser = make_parser(description, shared_memory_buffers=False)
    add_learner_flags(parser)
    return parser


def finish_learner_flags(flags: argparse.Namespace) -> None:
    if flags.max_learner_queue_size is None:
        flags.max_learner_queue_size = flags.batch_size
    if flags.stream_memory_mb is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        flags.stream_memory_mb = memory // 4 >> 20


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
        super().__init__(flags, pool.spec or pool.wait_for_spec())
        self.flags.env = self.env_spec.env_id  # as the environments said, for checkpoints
        self.poly_pool = pool

    def stage_totals(self) -> np.ndarray:
        """The env processes this command started: their CPU seconds (envs and gRPC)."""
        pids = [process.pid for process in self.poly_pool.env_processes]
        return np.array([process_cpu_seconds(pids), 0.0, 0.0])

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


def learner_spec(flags: argparse.Namespace) -> EnvSpec | None:
    """The environment the run trains on, derived by the learner itself from ``--env`` or
    from the checkpoint it resumes: env streams that present another are refused. None when
    the learner was told nothing: then the first env stream decides."""
    if flags.env:
        return envs.env_spec(flags)  # an unknown --env is one error line, at start-up
    path = os.path.join(flags.savedir, flags.xpid, "model.tar")
    if not os.path.exists(path):
        return None
    state = checkpoint.load(path)
    if "env" not in state:
        raise checkpoint.CheckpointError(f"{path} is not a torchbeast checkpoint (no env)")
    flags.env = state["env"]
    log.info("Resuming %s: the environment is %s, as in its checkpoint.", flags.xpid, flags.env)
    return checkpoint.saved_spec(state) or envs.env_spec(flags)


def check_run_dir(flags: argparse.Namespace) -> None:
    """An unwritable --savedir is an error now, not once the first client connects."""
    run_dir = os.path.join(flags.savedir, flags.xpid)
    os.makedirs(run_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=run_dir):
        pass


@contextlib.contextmanager
def session(flags: argparse.Namespace, start_envs: bool = True) -> Iterator[PolyTrainer]:
    """A trainer whose pool listens (or dials) and knows the run's environment; with
    ``start_envs`` this command also starts the env processes (servers, or with --serve
    clients), and stops them at the end; ``polybeast_learner`` starts none."""
    processes = env_side.start_processes(env_flags(flags)) if start_envs else []
    try:
        setup_console_logging(flags.suppress_logs)
        finish_learner_flags(flags)
        check_run_dir(flags)
        spec = learner_spec(flags)
        limit_intra_op_threads(flags)
        pool = PolyActorPool(flags, processes, spec)
        try:
            pool.listen()
            yield PolyTrainer(flags, pool)
        finally:
            pool.stop()
    finally:
        env_side.stop_processes(processes)


def train(flags: argparse.Namespace, start_envs: bool = True) -> dict:
    """Starts the network side, waits for the first environment, then trains; if every
    env process this command started exits, it stops."""
    with session(flags, start_envs) as trainer:
        return trainer.train()


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

"""PolyBeast training: the shared Trainer fed by env streams over gRPC."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
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
from torchbeast.config.poly import env_side_of, resolve_learner_flags
from torchbeast.config.settings import RunSettings, Settings
from torchbeast.core import checkpoint
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.console import setup_console_logging
from torchbeast.runtime.poly import env_side, network
from torchbeast.runtime.poly.env_flags import make_env_parser
from torchbeast.runtime.poly.learner_end import PolyActorPool
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
    parser.resolvers.append(resolve_learner_flags)
    return parser


class PolyTrainer(Trainer):
    """Training on rollouts that env streams deliver to ``pool``; the run's env id is the
    one the environments said (or the learner's checkpoint), recorded in checkpoints."""

    def __init__(self, settings: Settings, pool: PolyActorPool):
        super().__init__(settings, pool.spec or pool.wait_for_spec())
        self.poly_pool = pool

    def stage_totals(self) -> np.ndarray:
        """The env processes this command started: their CPU seconds (envs and gRPC)."""
        pids = [process.pid for process in self.poly_pool.env_processes]
        return np.array([process_cpu_seconds(pids), 0.0, 0.0])

    def create_pool(self) -> PolyActorPool:
        self.poly_pool.attach(self.learner.model, self.config, self.run.run_dir)
        return self.poly_pool

    def publish(self, model: nn.Module) -> None:
        self.poly_pool.publish(model)


def limit_intra_op_threads(settings: Settings) -> None:
    """Learner and inference threads run ops at the same time; each op's own thread pool
    must not oversubscribe the cores (on 2 cores, 2 threads per op cost 25% of the SPS)."""
    cores = len(os.sched_getaffinity(0))
    threads_per_op = settings.run.num_learner_threads + settings.runtime.num_inference_threads
    threads = max(1, cores // threads_per_op)
    torch.set_num_threads(threads)
    log.info("PyTorch uses %d thread(s) per op on the learner's CPU.", threads)


def learner_spec(settings: Settings) -> EnvSpec | None:
    """The environment the run trains on, derived by the learner itself from ``--env`` or
    from the checkpoint it resumes: env streams that present another are refused. None when
    the learner was told nothing: then the first env stream decides."""
    if settings.env.env:
        return envs.env_spec(settings.env)  # an unknown --env is one error line, at start-up
    path = os.path.join(settings.run.run_dir, "model.tar")
    if not os.path.exists(path):
        return None
    state = checkpoint.load(path)
    if "env" not in state:
        raise checkpoint.CheckpointError(f"{path} is not a torchbeast checkpoint (no env)")
    env = dataclasses.replace(settings.env, env=state["env"])
    log.info(
        "Resuming %s: the environment is %s, as in its checkpoint.", settings.run.xpid, env.env
    )
    if not checkpoint.saves_episode_extras(state):  # an older checkpoint: the flags tell them
        return envs.env_spec(env)
    return checkpoint.saved_spec(state)


def check_run_dir(run: RunSettings) -> None:
    """An unwritable --savedir is an error now, not once the first client connects."""
    os.makedirs(run.run_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=run.run_dir):
        pass


@contextlib.contextmanager
def session(settings: Settings, start_envs: bool = True) -> Iterator[PolyTrainer]:
    """A trainer whose pool listens (or dials) and knows the run's environment; with
    ``start_envs`` this command also starts the env processes (servers, or with --serve
    clients), and stops them at the end; ``polybeast_learner`` starts none."""
    processes = env_side.start_processes(env_side_of(settings)) if start_envs else []
    try:
        setup_console_logging(settings.run.suppress_logs)
        check_run_dir(settings.run)
        spec = learner_spec(settings)
        limit_intra_op_threads(settings)
        pool = PolyActorPool(settings, processes, spec)
        try:
            pool.listen()
            yield PolyTrainer(settings, pool)
        finally:
            pool.stop()
    finally:
        env_side.stop_processes(processes)


def train(settings: Settings, start_envs: bool = True) -> dict:
    """Starts the network side, waits for the first environment, then trains; if every
    env process this command started exits, it stops."""
    with session(settings, start_envs) as trainer:
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

"""PolyBeast training: the shared Trainer fed by env streams over gRPC."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import multiprocessing as mp
import os
import tempfile
from collections.abc import Iterator

from torch import nn

from torchbeast import envs
from torchbeast.config.settings import RunSettings, Settings, env_side_of
from torchbeast.core import checkpoint
from torchbeast.core.spec import EnvSpec
from torchbeast.envs.settings import EnvSettings
from torchbeast.runtime.poly import env_side, network
from torchbeast.runtime.poly.learner_end import PolyActorPool
from torchbeast.runtime.training import Trainer

log = logging.getLogger("torchbeast")


class PolyTrainer(Trainer):
    """Training on rollouts that env streams deliver to ``pool``; the run's env id is the
    one the environments said (or the learner's checkpoint), recorded in checkpoints."""

    def __init__(self, settings: Settings, pool: PolyActorPool):
        spec = pool.spec or pool.wait_for_spec()
        super().__init__(settings, spec, pool.run_spec.env_options)
        self.poly_pool = pool

    def concurrent_ops(self) -> int:
        # The updates, and each inference thread beside them.
        return 1 + self.settings.runtime.num_inference_threads

    def actor_layout(self) -> str:
        actors, poly = self.settings.actors, self.settings.runtime
        # Classic: the learner dials its streams over the servers, round robin.
        servers = min(len(poly.network.server_addresses()), actors.num_actors)
        peers = "env clients dialling in" if poly.serve else f"{servers} env servers"
        return f"{actors.num_actors} streams x {actors.envs_per_actor} envs from {peers}"

    def create_pool(self) -> PolyActorPool:
        self.poly_pool.attach(self.learner.model, self.config, self.run.run_dir)
        return self.poly_pool

    def publish(self, model: nn.Module) -> None:
        self.poly_pool.publish(model)


def bench_flags(flags: argparse.Namespace, folder: str) -> dict:
    """What a benchmark run in ``folder`` sets beyond the user's flags: one env server per
    stream, on Unix sockets in the folder."""
    return dict(num_servers=flags.num_actors, pipes_basename=f"unix:{folder}/env")


def learner_spec(settings: Settings) -> tuple[EnvSpec | None, dict[str, object] | None]:
    """The environment the run trains on, derived by the learner itself from ``--env`` or
    from the checkpoint it resumes: env streams that present another are refused. None when
    the learner was told nothing: then the first env stream decides. And, resuming a run
    whose learner was told nothing, the env options its checkpoint recorded (its env
    servers' reward proxy, say): env streams made with others are refused too."""
    if settings.env.env:  # an unknown --env: one line, at start-up
        return envs.env_spec(settings.env), hello_options(settings.env)
    path = checkpoint.path_in(settings.run.run_dir)
    if not os.path.exists(path):
        return None, None
    state = checkpoint.load(path)
    env = dataclasses.replace(settings.env, env=checkpoint.saved_env_id(state, path))
    log.info(
        "Resuming %s: the environment is %s, as in its checkpoint.", settings.run.xpid, env.env
    )
    recorded = state.get("flags", {})
    options = {  # as a Hello carries them: each family flag that is not None
        name: recorded[name] for name, _ in settings.env.options if recorded.get(name) is not None
    }
    if not checkpoint.saves_episode_extras(state):  # an older checkpoint: the flags tell them
        return envs.env_spec(env), options or None
    return checkpoint.saved_spec(state, path), options or None


def hello_options(env: EnvSettings) -> dict[str, object]:
    """The env family flags as a Hello carries them: each that is not None."""
    return {name: value for name, value in env.options if value is not None}


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
    env_settings = env_side_of(settings)
    network_settings = env_settings.network
    if start_envs and network_settings.tls_cert and not network_settings.tls_ca:
        raise network.NetworkError(  # its dialling side would talk plainly to TLS, for ever
            "--tls_cert makes one side of this command serve TLS, and its other side dials "
            "it: give --tls_ca too (the certificate itself, where it is self-signed)"
        )
    if start_envs and not env_settings.connect:  # one line here, not one per env process
        for address in env_settings.network.server_addresses():
            network.check_can_listen(address)
    quiet = settings.run.suppress_logs  # the env processes' INFO lines go too
    log_level = logging.WARNING if quiet else logging.INFO
    failures = mp.get_context("spawn").SimpleQueue() if start_envs else None
    processes = env_side.start_processes(env_settings, log_level, failures) if start_envs else []
    try:
        check_run_dir(settings.run)
        spec, env_options = learner_spec(settings)
        start = functools.partial(
            env_side.start_process, env_settings, log_level=log_level, failures=failures
        )
        replacements = env_side.Replacements(processes, start) if processes else None
        pool = PolyActorPool(settings, processes, spec, failures, env_options, replacements)
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

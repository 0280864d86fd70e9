"""RayBeast training: the shared Trainer fed by Ray actors, on a local Ray instance
started here or on a running cluster (``--ray_address``). Import only after
``prepare.prepare_environment`` (the registry does)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator

import ray
from torch import nn

from torchbeast import envs
from torchbeast.config.settings import Settings
from torchbeast.runtime.ray.actor_pool import RayActorPool
from torchbeast.runtime.ray.actors import RayWeights
from torchbeast.runtime.ray.prepare import cannot_join
from torchbeast.runtime.supervision import STOP_SIGNALS, signals_blocked
from torchbeast.runtime.training import Trainer, TrainingError

log = logging.getLogger("torchbeast")


class RayTrainer(Trainer):
    """Training with Ray actors; the learner runs in the driver."""

    def __init__(self, settings: Settings, connected: str = ""):
        super().__init__(settings, envs.env_spec(settings.env))
        self.connected = connected
        self.weights = RayWeights()

    def create_pool(self) -> RayActorPool:
        if self.connected:  # now that out.log exists
            log.info("%s", self.connected)
        self.weights.publish(self.learner.model)
        return RayActorPool(
            self.settings,
            self.env_spec,
            self.config,
            self.weights,
            self.checkpoint.first_incarnation(),
        )

    def publish(self, model: nn.Module) -> None:
        self.weights.publish(model)


def connect(settings: Settings) -> str:
    """Starts a local Ray instance on this machine's CPUs, or joins ``--ray_address``;
    returns a line that says which, for the run's log."""
    quiet = dict(logging_level=logging.WARNING, log_to_driver=not settings.run.suppress_logs)
    address = settings.runtime.ray_address
    started = time.monotonic()
    # Ray's driver installs a SIGTERM handler of its own that aborts the process; this
    # program's (a checkpoint, then a clean stop, ``runtime.supervision``) is put back.
    handler = signal.getsignal(signal.SIGTERM)
    if address is None:
        # Ray's daemons inherit this signal mask (Ray itself blocks SIGINT for them). A
        # SIGTERM to the whole process group, as job schedulers send, must reach only the
        # driver, which then saves a checkpoint and stops Ray; a raylet that died first
        # would take the driver down with it. A Ctrl-C waits for the start to finish: in
        # the middle of it, Ray's agents were left running (a minute) with no raylet.
        with signals_blocked(STOP_SIGNALS):
            try:
                # "local": a new instance, even where $RAY_ADDRESS (a Ray job's driver) or
                # an earlier `ray start` names a cluster, which would refuse num_cpus.
                ray.init(
                    address="local",
                    num_cpus=len(os.sched_getaffinity(0)),
                    include_dashboard=False,
                    **quiet,
                )
            finally:  # before a SIGTERM that came meanwhile is delivered
                signal.signal(signal.SIGTERM, handler)
        where = "a local Ray instance (127.0.0.1)"
    else:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as error:
            raise TrainingError(
                cannot_join(address, error, "leave out --ray_address to run Ray on this machine")
            ) from None
        finally:
            signal.signal(signal.SIGTERM, handler)
        where = f"the Ray cluster at {address}"
    seconds = time.monotonic() - started
    cpus = ray.cluster_resources().get("CPU", 0)
    nodes = len([node for node in ray.nodes() if node.get("Alive")])
    return f"Connected to {where} in {seconds:.1f} s: {cpus:g} CPUs on {nodes} nodes."


@contextlib.contextmanager
def session(settings: Settings) -> Iterator[RayTrainer]:
    """A trainer on a running Ray (a local instance started here, or --ray_address);
    a local instance is stopped at the end."""
    try:
        yield RayTrainer(settings, connect(settings))
    finally:  # also when a signal stopped the run while Ray started
        ray.shutdown()


def train(settings: Settings) -> dict:
    with session(settings) as trainer:
        return trainer.train()

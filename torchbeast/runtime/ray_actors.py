"""RayBeast: actors are Ray actors; rollouts and weights move through Ray's object store.

    Ray actor i (a process, on any node)           driver: the learner
    ------------------------------------           -------------------
    E envs, a CPU model copy                       RayActorPool keeps TASKS_PER_ACTOR unroll
    unroll(weights, version):        <-- task --     tasks in flight per actor; a collector
      load the weights if newer                      thread waits for finished ones (ray.wait),
      step E envs T times, batched                   queues their E columns and asks again
      return arrays [E, T+1, ...]    -- object -->   learner threads: stack B columns, learn
                                                     publish: one ray.put per update

An actor that dies (its process killed, its node lost) fails its tasks with a
RayActorError; the collector starts a new actor in its place and asks it for rollouts.
Import this module only after ``ray_setup.prepare_environment``: Ray reads some settings
from the environment when it is first imported.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import ray
import torch
from torch import nn

from torchbeast import envs
from torchbeast.config.settings import Settings
from torchbeast.core import rollout
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.acting import Unroller, actor_seed
from torchbeast.runtime.console import setup_console_logging
from torchbeast.runtime.queues import Batch, Closed, RolloutQueue, stack_rollouts
from torchbeast.runtime.supervision import RestartBudget, Supervised, last_line, signals_blocked
from torchbeast.runtime.training import Trainer, TrainingError

log = logging.getLogger("torchbeast")

TASKS_PER_ACTOR = 2  # one running, one queued: an actor never waits to be asked
WAIT_S = 0.1


# --------------------------------------------------------------------------- actor


class RolloutActor:
    """A Ray actor: ``envs_per_actor`` environments and a CPU copy of the model."""

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        actor_index: int,
        incarnation: int,
    ):
        torch.set_num_threads(1)
        num_envs = settings.actors.envs_per_actor
        seed = actor_seed(settings, actor_index, incarnation)
        self.unroller = Unroller(settings, env_spec, config, seed)
        self.buffers = rollout.allocate(
            env_spec, settings.learner.unroll_length, num_envs
        )  # [E, T+1, ...]
        state = self.unroller.model.initial_state(1)  # each [layers, 1, H]
        self.initial_core_states = tuple(torch.zeros(num_envs, *s.shape[::2]) for s in state)
        self.index = torch.arange(num_envs)
        self.version = -1
        self.cpu_mark = time.process_time()

    def unroll(self, weights: list[ray.ObjectRef], version: int) -> dict:
        """One rollout of each env with weights ``version`` (fetched only if newer).

        ``weights`` is a one-element list so that Ray does not fetch the object for a task
        that already holds that version. Returns numpy arrays, which Ray passes without
        pickling element by element: rollout [E, T+1, ...], core_state [E, layers, H] each,
        timings (env, inference, all CPU seconds, agent steps).
        """
        if version != self.version:
            flat = torch.from_numpy(ray.get(weights[0]).copy())  # [num_parameters] float32
            with torch.no_grad():
                offset = 0
                for param in self.unroller.model.parameters():  # copy_ keeps channels_last
                    param.copy_(flat[offset : offset + param.numel()].view(param.shape))
                    offset += param.numel()
                self.unroller.model.policy_version.fill_(version)
            self.version = version
        self.unroller.unroll(self.buffers, self.index, self.initial_core_states)
        env_time, inference_time = self.unroller.take_times()
        now = time.process_time()
        steps = self.unroller.unroll_length * len(self.index)
        timings = np.array([env_time, inference_time, now - self.cpu_mark, steps])
        self.cpu_mark = now
        # Ray copies the arrays into the object store as the task returns, so the buffers
        # can be refilled by the next task.
        return {
            "rollout": {key: value.numpy() for key, value in self.buffers.items()},
            "core_state": tuple(s.numpy() for s in self.initial_core_states),
            "timings": timings,
        }


RemoteRolloutActor = ray.remote(max_restarts=0)(RolloutActor)


# --------------------------------------------------------------------------- weights


class RayWeights:
    """The learner's newest weights in the object store: one ``ray.put`` per update."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ref: ray.ObjectRef | None = None
        self.version = -1  # the learner updates behind the weights (policy_version)

    def publish(self, model: nn.Module) -> None:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy()
        ref = ray.put(flat)
        with self.lock:
            self.ref, self.version = ref, int(model.policy_version)

    def latest(self) -> tuple[ray.ObjectRef, int]:
        with self.lock:
            assert self.ref is not None, "publish before asking for rollouts"
            return self.ref, self.version


# --------------------------------------------------------------------------- actor pool


class RayActorPool(Supervised):
    """Starts the Ray actors, keeps them busy, restarts dead ones, queues their rollouts."""

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        weights: RayWeights,
    ):
        super().__init__()
        self.settings, self.env_spec, self.config, self.weights = (
            settings,
            env_spec,
            config,
            weights,
        )
        self.batch_size = settings.learner.batch_size
        num_actors, self.envs_per_actor = settings.actors.num_actors, settings.actors.envs_per_actor
        # Columns waiting for the learner; a full queue holds the collector back.
        self.queue: RolloutQueue[tuple] = RolloutQueue(
            2 * self.batch_size + self.envs_per_actor, closed=self.stopping
        )
        self.lock = threading.Lock()
        self.actors: list = [None] * num_actors
        self.incarnations = [0] * num_actors
        self.pending: dict[ray.ObjectRef, tuple[int, int]] = {}  # task -> (actor, incarnation)
        self.restarts = RestartBudget(num_actors)
        self.timings = np.zeros(4)  # env, inference, all CPU seconds; agent steps
        self.started = time.monotonic()
        self.first_rollout_s: float | None = None
        # Fraction of a CPU each actor asks Ray for, so that every actor can be placed:
        # rounded down to Ray's resource granularity (1e-4), never up.
        total_cpus = ray.cluster_resources().get("CPU", 1.0)
        share = math.floor(total_cpus / num_actors * 10_000) / 10_000
        self.cpus_per_actor = min(1.0, max(share, 0.0001))
        self.collector = threading.Thread(target=self._collect, name="collector", daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        for actor_index in range(len(self.actors)):
            self._start_actor(actor_index)
        self.collector.start()

    def _start_actor(self, actor_index: int) -> None:
        actor = RemoteRolloutActor.options(
            num_cpus=self.cpus_per_actor, scheduling_strategy="SPREAD"
        ).remote(
            self.settings, self.env_spec, self.config, actor_index, self.incarnations[actor_index]
        )
        with self.lock:
            self.actors[actor_index] = actor
        for _ in range(TASKS_PER_ACTOR):
            self._submit(actor_index)

    def _submit(self, actor_index: int) -> None:
        ref, version = self.weights.latest()
        with self.lock:
            task = self.actors[actor_index].unroll.remote([ref], version)
            self.pending[task] = (actor_index, self.incarnations[actor_index])

    def stop(self) -> None:
        self.stopping.set()
        if self.collector.is_alive():
            self.collector.join(timeout=5.0)
        with self.lock:
            for actor in self.actors:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
            self.pending.clear()

    # The collector thread.

    def _collect(self) -> None:
        try:
            while not self.stopping.is_set():
                with self.lock:
                    tasks = list(self.pending)
                if not tasks:
                    self.stopping.wait(WAIT_S)
                    continue
                ready, _ = ray.wait(tasks, num_returns=1, timeout=WAIT_S)
                for task in ready:
                    self._finish(task)
        except Closed:
            pass  # stopping
        except Exception as error:  # surfaced as the run's error, not swallowed
            log.exception("The rollout collector failed.")
            self.fail(f"the rollout collector failed: {last_line(error)} (see out.log)")

    def _finish(self, task: ray.ObjectRef) -> None:
        with self.lock:
            owner = self.pending.pop(task, None)
        if owner is None or self.stopping.is_set():
            return  # abandoned by stop()
        actor_index, incarnation = owner
        try:
            result = ray.get(task)
        except ray.exceptions.RayActorError as error:
            if error.actor_init_failed:
                self.fail(f"actor {actor_index} could not start: {last_line(error)}")
            else:
                self._replace_dead_actor(actor_index, incarnation, error)
            return
        except ray.exceptions.ObjectLostError as error:  # its node went down with the rollout
            self._replace_dead_actor(actor_index, incarnation, error)
            return
        except ray.exceptions.RayTaskError as error:
            log.error("Actor %d failed:\n%s", actor_index, error)
            self.fail(f"actor {actor_index} failed: {last_line(error)} (traceback in out.log)")
            return
        if self.first_rollout_s is None:
            self.first_rollout_s = time.monotonic() - self.started
            log.info("First rollout after %.1f s (the Ray actors start).", self.first_rollout_s)
        self.timings += result["timings"]
        self._queue_columns(actor_index, result)
        if incarnation == self.incarnations[actor_index]:
            self._submit(actor_index)

    def _queue_columns(self, actor_index: int, result: dict) -> None:
        """Queues each env's rollout as one column: numpy views into the object store."""
        arrays, core_state = result["rollout"], result["core_state"]
        for env_index in range(self.envs_per_actor):
            column = {key: value[env_index] for key, value in arrays.items()}  # [T+1, ...]
            env_state = tuple(s[env_index][:, None] for s in core_state)  # [layers, 1, H]
            self.queue.put((column, env_state, (actor_index, env_index)))

    def _replace_dead_actor(self, actor_index: int, incarnation: int, error: Exception) -> None:
        with self.lock:
            if incarnation != self.incarnations[actor_index] or self.stopping.is_set():
                return  # its other task already reported the death
            self.incarnations[actor_index] += 1
        if not self.restarts.record_death():
            self.fail(
                f"actors keep dying: {self.restarts.deaths_text()} "
                f"(last: {last_line(error)}); see out.log"
            )
            return
        log.warning("Actor %d died (%s); starting a new one.", actor_index, last_line(error))
        # Usually dead already; a lost rollout may have left it alive but of no more use.
        ray.kill(self.actors[actor_index], no_restart=True)
        self._start_actor(actor_index)

    # The learner's side.

    def get_batch(self) -> Batch | None:
        """B columns stacked to [T+1, B, ...], their core states [layers, B, H], sources."""
        items = self.queue.get_batch(self.batch_size)
        # One copy, out of the object store into the batch.
        return None if items is None else stack_rollouts(items)

    def timing_totals(self) -> np.ndarray:
        """(env, inference, all) CPU seconds and agent steps, summed over actors so far."""
        return self.timings.copy()


# --------------------------------------------------------------------------- training


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
        return RayActorPool(self.settings, self.env_spec, self.config, self.weights)

    def publish(self, model: nn.Module) -> None:
        self.weights.publish(model)


def connect(settings: Settings) -> str:
    """Starts a local Ray instance on this machine's CPUs, or joins ``--ray_address``;
    returns a line that says which, for the run's log."""
    quiet = dict(logging_level=logging.WARNING, log_to_driver=not settings.run.suppress_logs)
    address = settings.runtime.ray_address
    started = time.monotonic()
    if address is None:
        # Ray's daemons inherit this signal mask (Ray itself blocks SIGINT for them). A
        # SIGTERM to the whole process group, as job schedulers send, must reach only the
        # driver, which then saves a checkpoint and stops Ray; a raylet that died first
        # would take the driver down with it.
        with signals_blocked({signal.SIGTERM}):
            ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, **quiet)
        where = "a local Ray instance (127.0.0.1)"
    else:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as error:
            raise TrainingError(
                f"cannot join the Ray cluster at --ray_address {address}: "
                f"{last_line(error)}. Start one with `ray start --head`, or leave out "
                "--ray_address to run Ray on this machine"
            ) from None
        where = f"the Ray cluster at {address}"
    seconds = time.monotonic() - started
    cpus = ray.cluster_resources().get("CPU", 0)
    nodes = len([node for node in ray.nodes() if node.get("Alive")])
    return f"Connected to {where} in {seconds:.1f} s: {cpus:g} CPUs on {nodes} nodes."


@contextlib.contextmanager
def session(settings: Settings) -> Iterator[RayTrainer]:
    """A trainer on a running Ray (a local instance started here, or --ray_address);
    a local instance is stopped at the end."""
    setup_console_logging(settings.run.suppress_logs)
    connected = connect(settings)
    try:
        yield RayTrainer(settings, connected)
    finally:
        ray.shutdown()


def train(settings: Settings) -> dict:
    with session(settings) as trainer:
        return trainer.train()

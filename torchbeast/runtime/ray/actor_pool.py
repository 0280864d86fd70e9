"""The driver's side of RayBeast's actors: starts them, keeps TASKS_PER_ACTOR unroll tasks
in flight per actor (fewer while it runs ahead of the others), restarts dead ones within a
budget, and queues their rollouts for the learner."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import ray

from torchbeast.config.settings import Settings
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.batches import per_env_share
from torchbeast.runtime.pool import Pool, actor_stage_totals
from torchbeast.runtime.queues import Batch, Closed, RolloutQueue, stack_rollouts
from torchbeast.runtime.ray.actors import RayWeights, RemoteRolloutActor
from torchbeast.runtime.supervision import RestartBudget, last_line
from torchbeast.runtime.training import TrainingError

log = logging.getLogger("torchbeast")

TASKS_PER_ACTOR = 2  # one running, one queued: an actor never waits to be asked
WAIT_S = 0.1
# An actor (a replacement too) that has sent no rollout this long after it was asked for
# cannot be placed: the cluster lost the CPUs it had at the start (a node went down).
START_DEADLINE_S = 300.0
# A started actor asked for a rollout this long ago that has sent none is hung (an env
# stuck in its step): it is replaced as a dead one is, where the run would wait for it
# without a word (its envs' share of the batch never comes, and the others wait).
HUNG_DEADLINE_S = 300.0


def cpus_per_actor(num_actors: int) -> float:
    """The fraction of a CPU each actor asks Ray for, so that every actor can be placed
    on the CPUs free now (other jobs may hold some of the cluster's): rounded down to
    Ray's resource granularity (1e-4), never up."""
    total = ray.cluster_resources().get("CPU", 0.0)
    free = min(total, ray.available_resources().get("CPU", 0.0))
    share = math.floor(free / num_actors * 10_000) / 10_000
    if total == 0:
        raise TrainingError(
            "the Ray cluster has no CPUs for the actors (a head started with --num-cpus 0?): "
            "add a node with CPUs, then run the same command"
        )
    if free < 0.0001:
        raise TrainingError(
            f"the Ray cluster has no CPU free for the actors: other work holds all "
            f"{total:g} of its CPUs (`ray status` shows it); free some or add a node, then "
            "run the same command"
        )
    if share < 0.0001:  # Ray's resource granularity
        raise TrainingError(
            f"{num_actors} actors are too many for the {free:g} CPUs free on the Ray cluster "
            f"(each asks for at least 0.0001): give at most {math.floor(free * 10_000)} "
            "--num_actors, with more --envs_per_actor each"
        )
    if free < total:
        log.warning(
            "Other work holds %g of the Ray cluster's %g CPUs: the %d actors share the %g free.",
            total - free,
            total,
            num_actors,
            free,
        )
    return min(1.0, share)


class RayActorPool(Pool):
    """Starts the Ray actors, keeps them busy, restarts dead ones, queues their rollouts."""

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        weights: RayWeights,
        first_incarnation: int = 0,
    ):
        """``first_incarnation``: the number of the actors' first incarnations (which
        their seeds follow from)."""
        super().__init__()
        self.settings, self.env_spec, self.config, self.weights = (
            settings,
            env_spec,
            config,
            weights,
        )
        self.batch_size = settings.learner.batch_size
        num_actors, self.envs_per_actor = settings.actors.num_actors, settings.actors.envs_per_actor
        # Columns waiting for the learner; a full queue holds the collector back. A batch
        # takes each env's at most ⌈B / envs⌉ times while others' can come (``batches``).
        per_env = per_env_share(self.batch_size, num_actors * self.envs_per_actor)
        self.queue: RolloutQueue[tuple] = RolloutQueue(
            2 * self.batch_size + self.envs_per_actor, closed=self.stopping, per_env=per_env
        )
        # An actor that runs ahead waits, as MonoBeast's wait for free slots: its next task
        # is held back while more of its columns wait than a batch takes of them. (When
        # every actor is held back, each env has more waiting than that: a batch fills.)
        self.most_waiting = per_env * self.envs_per_actor
        self.lock = threading.Lock()
        self.waiting_columns = [0] * num_actors  # in the queue, per actor
        self.held_back = [0] * num_actors  # tasks not submitted while it is ahead
        self.actors: list = [None] * num_actors
        # When each actor was started, until its first rollout comes (then None).
        self.starting_since: list[float | None] = [None] * num_actors
        self.incarnations = [first_incarnation] * num_actors
        self.pending: dict[ray.ObjectRef, tuple[int, int]] = {}  # task -> (actor, incarnation)
        self.asked_at: dict[ray.ObjectRef, float] = {}  # task -> when it was submitted
        self.restarts = RestartBudget(num_actors)
        self.timings = np.zeros(4)  # env, inference, all CPU seconds; agent steps
        self.started = time.monotonic()
        self.first_rollout_s: float | None = None
        self.cpus_per_actor = cpus_per_actor(num_actors)
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
            self.starting_since[actor_index] = time.monotonic()
        for _ in range(TASKS_PER_ACTOR):
            self._submit(actor_index)

    def _submit(self, actor_index: int) -> None:
        ref, version = self.weights.latest()
        with self.lock:
            actor = self.actors[actor_index]
            if actor is None:  # dead, its replacement not up yet: it brings its own tasks
                return
            task = actor.unroll.remote([ref], version)
            self.pending[task] = (actor_index, self.incarnations[actor_index])
            self.asked_at[task] = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()
        if self.collector.is_alive():
            self.collector.join(timeout=5.0)
        with self.lock:
            for actor in self.actors:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
            self.pending.clear()
            self.asked_at.clear()

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
                self._check_starts()
                self._check_hung()
        except Closed:
            pass  # stopping
        except Exception as error:  # surfaced as the run's error, not swallowed
            log.exception("The rollout collector failed.")
            self.fail(f"the rollout collector failed: {last_line(error)} (see out.log)")

    def _finish(self, task: ray.ObjectRef) -> None:
        with self.lock:
            owner = self.pending.pop(task, None)
            self.asked_at.pop(task, None)
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
        if incarnation == self.incarnations[actor_index]:
            self.starting_since[actor_index] = None
        if self.first_rollout_s is None:
            self.first_rollout_s = time.monotonic() - self.started
            log.info("First rollout after %.1f s (the Ray actors start).", self.first_rollout_s)
        self.timings += result["timings"]
        self._queue_columns(actor_index, result)
        if incarnation == self.incarnations[actor_index]:
            self._submit_unless_ahead(actor_index)

    def _check_starts(self) -> None:
        """Stops the run with one line where an actor has not started by the deadline
        (its rollouts neither came nor are waiting to be read): training would otherwise
        wait for it without a word."""
        now = time.monotonic()
        with self.lock:
            late = {
                index
                for index, since in enumerate(self.starting_since)
                if since is not None and now - since > START_DEADLINE_S
            }
            theirs = [task for task, (index, _) in self.pending.items() if index in late]
        if not late or (theirs and ray.wait(theirs, num_returns=1, timeout=0)[0]):
            return
        self.fail(
            f"actor {min(late)} has not started in {START_DEADLINE_S:.0f} s: the cluster has "
            f"no room for the {self.cpus_per_actor:g} CPUs it asks for (did a node go "
            "down, or other work take them?); run it again (with this run's --xpid) to go on "
            "with the CPUs free then"
        )

    def _check_hung(self) -> None:
        """Replaces a started actor whose oldest task has sent nothing for
        ``HUNG_DEADLINE_S`` (and is not waiting to be read), as a dead one is."""
        now = time.monotonic()
        with self.lock:
            oldest: dict[tuple[int, int], tuple[float, ray.ObjectRef]] = {}
            for task, owner in self.pending.items():
                index, incarnation = owner
                if incarnation != self.incarnations[index] or self.starting_since[index]:
                    continue  # a dead one's, or one not started: _check_starts' to judge
                asked = self.asked_at.get(task, now)
                if owner not in oldest or asked < oldest[owner][0]:
                    oldest[owner] = (asked, task)
        for (index, incarnation), (asked, task) in oldest.items():
            if now - asked <= HUNG_DEADLINE_S or ray.wait([task], timeout=0)[0]:
                continue
            error = TimeoutError(
                f"no rollout {HUNG_DEADLINE_S:.0f} s after it was asked for one: is an env "
                "stuck in its step?"
            )
            self._replace_dead_actor(index, incarnation, error)

    def _submit_unless_ahead(self, actor_index: int) -> None:
        with self.lock:
            if self.waiting_columns[actor_index] > self.most_waiting:
                self.held_back[actor_index] += 1
                return
        self._submit(actor_index)

    def _queue_columns(self, actor_index: int, result: dict) -> None:
        """Queues each env's rollout as one column: numpy views into the object store."""
        arrays, core_state = result["rollout"], result["core_state"]
        for env_index in range(self.envs_per_actor):
            column = {key: value[env_index] for key, value in arrays.items()}  # [T+1, ...]
            env_state = tuple(s[env_index][:, None] for s in core_state)  # [layers, 1, H]
            source = (actor_index, env_index)
            with self.lock:
                self.waiting_columns[actor_index] += 1
            self.queue.put((column, env_state, source), source)

    def _replace_dead_actor(self, actor_index: int, incarnation: int, error: Exception) -> None:
        with self.lock:
            if incarnation != self.incarnations[actor_index] or self.stopping.is_set():
                return  # its other task already reported the death
            self.incarnations[actor_index] += 1
            self.held_back[actor_index] = 0  # the new actor starts with its own tasks
            # Taken with the incarnation's change: a task submitted meanwhile (a held-back
            # one resumed by the learner) would go to the dead actor under the new
            # incarnation, and its failure would count as the new actor's death.
            dead, self.actors[actor_index] = self.actors[actor_index], None
        # Usually dead already; a lost rollout may have left it alive but of no more use.
        ray.kill(dead, no_restart=True)
        if not self.restarts.record_death():
            self.fail(
                f"actors keep dying: {self.restarts.deaths_text()} "
                f"(last: {last_line(error)}); see out.log"
            )
            return
        log.warning("Actor %d died (%s); starting a new one.", actor_index, last_line(error))
        self._start_actor(actor_index)

    # The learner's side.

    def get_batch(self) -> Batch | None:
        """B columns stacked to [T+1, B, ...], their core states [layers, B, H], sources."""
        items = self.queue.get_batch(self.batch_size)
        if items is None:
            return None
        self._taken([source for _, _, source in items])
        # One copy, out of the object store into the batch.
        return stack_rollouts(items)

    def _taken(self, sources: list[tuple[int, int]]) -> None:
        """Submits the tasks held back from actors that are no longer ahead."""
        with self.lock:
            for actor_index, _ in sources:
                self.waiting_columns[actor_index] -= 1
            resumed = []
            for actor_index, count in enumerate(self.held_back):
                if count and self.waiting_columns[actor_index] <= self.most_waiting:
                    resumed += [actor_index] * count
                    self.held_back[actor_index] = 0
        for actor_index in resumed:
            self._submit(actor_index)

    def stage_totals(self) -> dict[str, float]:
        """The Ray actors' CPU seconds: stepping envs, inference, and the rest."""
        return actor_stage_totals(self.timings)

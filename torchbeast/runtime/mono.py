"""MonoBeast: actors are local processes; rollouts move through shared memory.

    actor process i                       learner process
    ---------------                       ---------------
    E envs, CPU model copy      pipe      ActorPool (dispatcher thread)
    recv E free buffer slots  <-------    hands out free slots, takes full ones
    step E envs T times,                  full queue -> learner threads: stack B
      one batched forward per step          rollouts to [T+1, B, ...], learn,
      writing into shared buffers           publish weights (versioned), free slots
    send the slots back       ------->
    reload weights if newer   <-- shared memory (seqlock)

Each actor talks to the learner only through its own pipe, so an actor that is killed
takes no lock with it: the dispatcher sees the pipe close, takes back the slots the actor
held, and starts a new one. A learner that dies closes the pipes and the actors exit. The
actor's side is ``runtime.mono_actor``'s, the shared weights ``runtime.mono_weights``'. With
``--central_inference`` the actors hold no weights: an inference process beside the
learner's chooses their actions (``runtime.mono_inference``), through a second pipe per
actor; the dispatcher watches it too.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import threading
from collections.abc import Iterator

import torch
from torch import nn

from torchbeast import envs
from torchbeast.config.settings import Settings
from torchbeast.core import rollout
from torchbeast.core.models import create_model
from torchbeast.core.precision import bf16_on_cpu
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.batches import Arrivals, per_env_share
from torchbeast.runtime.layout import actor_niceness
from torchbeast.runtime.mono_actor import ActorShared, actor_process
from torchbeast.runtime.mono_inference import (
    CentralInference,
    InferenceFigures,
    InferenceProcess,
    InferenceSlots,
)
from torchbeast.runtime.mono_settings import default_env_groups
from torchbeast.runtime.mono_weights import SharedWeights
from torchbeast.runtime.pool import ACTOR_TIME_PARTS, Pool, actor_stage_totals
from torchbeast.runtime.processes import process_cpu_seconds
from torchbeast.runtime.supervision import (
    RestartBudget,
    forked_children,
    join_or_kill,
    last_line,
    starting_child,
)
from torchbeast.runtime.training import Trainer

log = logging.getLogger("torchbeast")

ACTOR_STOP_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------- actor pool


def groups_line(envs_per_actor: int, env_groups: int) -> str:
    """How each actor steps its envs with central inference, for the run's log."""
    if env_groups == 1:
        return f"each actor steps its {envs_per_actor} env(s) at once (--env_groups 1)"
    return (
        f"each actor steps its {envs_per_actor} envs in {env_groups} groups of "
        f"{envs_per_actor // env_groups} that take turns waiting for their actions "
        "(--env_groups)"
    )


def actor_context() -> mp.context.BaseContext:
    """Where actors and the inference process start: forked from one server that has
    torch and their modules imported, started by the first call. The server is this
    process forked where CUDA is not at hand: no child forked from a process that started
    CUDA's driver (which counting the GPUs does) can use CUDA."""
    preload = ["torchbeast.runtime.mono_actor", "torchbeast.envs"]
    return forked_children(preload, fork_here=not torch.cuda.is_available())


class ActorPool(Pool):
    """Starts actor processes, hands them free buffer slots, collects full ones.

    One dispatcher thread watches every actor's pipe; an actor that dies is replaced
    and the slots it held go back to the free pool.
    """

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        weights: SharedWeights,
        learner_model: nn.Module,
        first_incarnation: int,
        context: mp.context.BaseContext,
    ):
        """``learner_model``: the learner's model, whose device and weights central
        inference (``--central_inference``) takes; ``first_incarnation``: the number of
        the actors' first incarnations (which their seeds follow from); ``context``: where
        the actors start (``actor_context()``)."""
        num_buffers = settings.actors.num_buffers
        num_actors = settings.actors.num_actors
        self.envs_per_actor = settings.actors.envs_per_actor
        self.batch_size = settings.learner.batch_size
        self.context = context
        state = create_model(
            config, env_spec.observation_shape, env_spec.num_actions
        ).initial_state(1)
        self.shared = ActorShared(
            settings=settings,
            env_spec=env_spec,
            config=config,
            buffers=rollout.allocate(env_spec, settings.learner.unroll_length, num_buffers, True),
            # Core state at the start of each rollout: [num_buffers, layers, H] per tensor.
            initial_core_states=tuple(
                torch.zeros(num_buffers, *s.shape[::2]).share_memory_() for s in state
            ),
            weights=weights,
            timings=torch.zeros(num_actors, 4, dtype=torch.float64).share_memory_(),
            walls=torch.zeros(
                num_actors, len(ACTOR_TIME_PARTS), dtype=torch.float64
            ).share_memory_(),
            niceness=actor_niceness(
                bf16_on_cpu(learner_model.compute_dtype, next(learner_model.parameters()).device)
            ),
        )
        self.inference: InferenceProcess | None = None
        # With central inference, each actor's env groups ask through rows of their own.
        self.env_groups = 1
        if settings.runtime.central_inference:
            self.env_groups = settings.runtime.env_groups or default_env_groups(
                self.envs_per_actor, True
            )
            if self.envs_per_actor % self.env_groups:
                raise ValueError(
                    f"env_groups {self.env_groups} does not divide envs_per_actor "
                    f"{self.envs_per_actor}"
                )
            rows = num_actors * self.env_groups
            central = CentralInference(
                slots=InferenceSlots.allocate(
                    env_spec, learner_model, rows, self.envs_per_actor // self.env_groups
                ),
                figures=InferenceFigures.allocate(rows),
                config=config,
                env_spec=env_spec,
                device=str(next(learner_model.parameters()).device),
                compute_dtype=learner_model.compute_dtype,
                seed=settings.env.seed,
                cuda_graphs=settings.learner.cuda_graphs == "auto",
            )
            self.shared.inference = central.slots  # all that the actors need of it
            self.inference = InferenceProcess(self.context, central, weights)

        self.free_slots: collections.deque[int] = collections.deque(range(num_buffers))
        # Full slots, each with the (actor, env) whose rollout it holds.
        self.full_slots: Arrivals[int] = Arrivals(
            per_env_share(self.batch_size, num_actors * self.envs_per_actor)
        )
        self.lock = threading.Lock()
        self.slots_changed = threading.Condition(self.lock)  # full slots came, or an actor waits
        self.waiting: collections.deque[int] = collections.deque()  # actors needing slots
        self.held: dict[int, list[int]] = {}
        self.processes: dict[int, mp.process.BaseProcess] = {}
        self.conns: dict[int, mp.connection.Connection] = {}
        self.incarnations = [first_incarnation] * num_actors
        self.restarts = RestartBudget(num_actors)
        super().__init__()
        self.batch_lock = threading.Lock()
        self.dispatcher = threading.Thread(target=self._dispatch, name="dispatcher", daemon=True)

    # Lifecycle.

    def start(self) -> None:
        if self.inference is not None:
            failure = self.inference.start()
            if failure is not None:
                self.fail(failure)
                return
            log.info(
                "Central inference runs in process %d, on %s; %s.",
                self.inference.process.pid,
                self.inference.central.device,
                groups_line(self.envs_per_actor, self.env_groups),
            )
        for actor_index in range(len(self.incarnations)):
            self._start_actor(actor_index)
        self.dispatcher.start()

    def _start_actor(self, actor_index: int) -> None:
        parent_conn, child_conn = self.context.Pipe()
        # With central inference: one pipe per env group, to the server's row of it.
        inference_pipes = (
            [self.context.Pipe() for _ in range(self.env_groups)] if self.inference else []
        )
        child_inference_conns = [child for _, child in inference_pipes] or None
        process = self.context.Process(
            target=actor_process,
            name=f"actor-{actor_index}",
            args=(
                actor_index,
                self.incarnations[actor_index],
                self.shared,
                child_conn,
                child_inference_conns,
            ),
            daemon=True,
        )
        # A Ctrl-C while an actor starts must not kill it before it ignores SIGINT.
        with starting_child(self.context):
            process.start()
        child_conn.close()  # so the parent sees EOF when the actor dies
        for group, (conn, child) in enumerate(inference_pipes):
            child.close()
            assert self.inference is not None
            self.inference.add(actor_index * self.env_groups + group, conn)
        with self.lock:
            self.processes[actor_index] = process
            self.conns[actor_index] = parent_conn
            self.held[actor_index] = []

    def stop(self) -> None:
        self.stopping.set()
        if self.dispatcher.is_alive():
            self.dispatcher.join(timeout=ACTOR_STOP_TIMEOUT_S)
        with self.lock:
            for conn in self.conns.values():
                try:
                    conn.send(None)
                except OSError:
                    pass
        if self.inference is not None:  # an actor waiting for its actions ends on EOF
            self.inference.stop()
        join_or_kill(self.processes.values(), ACTOR_STOP_TIMEOUT_S)
        for conn in self.conns.values():
            conn.close()

    # Dispatcher thread.

    def _dispatch(self) -> None:
        try:
            while not self.stopping.is_set():
                with self.lock:
                    by_conn = {conn: index for index, conn in self.conns.items()}
                inference = [] if self.inference is None else [self.inference.control]
                ready = mp.connection.wait([*inference, *by_conn], timeout=0.1)
                # The inference process first: when it dies, its actors fail too, and its
                # death is what the run reports.
                for conn in sorted(ready, key=lambda conn: conn in by_conn):
                    if conn in by_conn:
                        self._handle(by_conn[conn], conn)
                    else:  # the inference process: a line for the log, or why it stopped
                        failure = self.inference.read_failure()
                        if failure is not None:
                            self.fail(failure)
        except Exception as error:  # without the dispatcher nothing moves: stop the run
            log.exception("The actor dispatcher failed.")
            self.fail(f"the actor dispatcher failed: {error!r}")

    def _handle(self, actor_index: int, conn: mp.connection.Connection) -> None:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            self._replace_dead_actor(actor_index)
            return
        if kind == "error":
            log.error("Actor %d failed:\n%s", actor_index, payload)
            # An actor whose central inference died fails on its pipe: say the cause.
            cause = None if self.inference is None else self.inference.gone()
            self.fail(
                cause or f"actor {actor_index} failed: {last_line(payload)} (traceback in out.log)"
            )
            return
        with self.lock:
            if kind == "full":
                self.held[actor_index] = []
                for env_index, slot in enumerate(payload):
                    self.full_slots.add(slot, (actor_index, env_index))
            self.waiting.append(actor_index)
            self._serve_waiting()
            self.slots_changed.notify_all()

    def _replace_dead_actor(self, actor_index: int) -> None:
        process = self.processes[actor_index]
        process.join(timeout=ACTOR_STOP_TIMEOUT_S)
        with self.lock:
            if self.stopping.is_set():
                return
            self.conns.pop(actor_index).close()
            self.free_slots.extend(self.held.pop(actor_index, []))
            if actor_index in self.waiting:
                self.waiting.remove(actor_index)
            self.slots_changed.notify_all()
        self.incarnations[actor_index] += 1
        if not self.restarts.record_death():
            self.fail(
                f"actors keep dying ({self.restarts.deaths_text()}, last exit "
                f"code {process.exitcode}); see out.log, and check memory (e.g. fewer "
                "--num_actors)"
            )
            return
        log.warning(
            "Actor %d died (exit code %s); starting a new one, training goes on.",
            actor_index,
            process.exitcode,
        )
        self._start_actor(actor_index)
        with self.lock:
            self._serve_waiting()

    def _serve_waiting(self) -> None:
        """Hands free slots to waiting actors, all of an actor's slots at once (lock held)."""
        needed = self.envs_per_actor
        while self.waiting and len(self.free_slots) >= needed:
            actor_index = self.waiting.popleft()
            slots = [self.free_slots.popleft() for _ in range(needed)]
            self.held[actor_index] = slots
            try:
                self.conns[actor_index].send(slots)
            except OSError:
                pass  # it died; the dispatcher reclaims its slots when it sees the pipe close

    # Learner side.

    def get_batch(
        self,
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...], list[tuple[int, int]]] | None:
        """B full rollouts stacked to [T+1, B, ...], their initial core states and the
        (actor, env) each came from; None when stopping. A batch holds each env at most
        ⌈B / envs⌉ times while other envs' rollouts are on their way (``batches.Arrivals``)."""
        slots: list[int] = []
        sources: list[tuple[int, int]] = []
        with self.batch_lock, self.slots_changed:
            while len(slots) < self.batch_size and not self.stopping.is_set():
                self.full_slots.take(slots, sources, self.batch_size)
                if len(slots) < self.batch_size and self._nothing_else_can_come():
                    self.full_slots.take(slots, sources, self.batch_size, any_env=True)
                if len(slots) < self.batch_size:
                    self.slots_changed.wait(timeout=0.1)
        if len(slots) < self.batch_size:  # stopping
            self.release(slots)
            return None
        index = torch.tensor(slots)
        batch = {
            key: buffer.index_select(0, index).transpose(0, 1)
            for key, buffer in self.shared.buffers.items()
        }
        # [layers, B, H] per state tensor.
        core_state = tuple(
            s.index_select(0, index).transpose(0, 1).contiguous()
            for s in self.shared.initial_core_states
        )
        self.release(slots)
        return batch, core_state, sources

    def _nothing_else_can_come(self) -> bool:
        """Whether no actor holds slots and none can get them until a batch frees some
        (lock held): the slots a batch set aside are then all it can take."""
        running = any(self.held.values())
        return not running and len(self.free_slots) < self.envs_per_actor

    def release(self, slots: list[int]) -> None:
        with self.lock:
            self.free_slots.extend(slots)
            self._serve_waiting()

    def publish(self, model: nn.Module) -> None:
        """New weights for whoever chooses the actions: the actors, or central inference."""
        self.shared.weights.publish(model)

    def stage_totals(self) -> dict[str, float]:
        """The actors' CPU seconds: stepping envs, inference (with central inference only
        handing over the rows), and the rest; and the central inference process's."""
        totals = actor_stage_totals(self.shared.timings.sum(0).numpy())
        if self.inference is not None:
            totals["central inference"] = process_cpu_seconds([self.inference.process.pid])
        return totals

    def actor_wall_seconds(self) -> dict[str, float]:
        return dict(zip(ACTOR_TIME_PARTS, self.shared.walls.sum(0).tolist(), strict=True))

    def inference_batch_sizes(self) -> dict[int, int]:
        """Central inference's passes by the envs they served."""
        if self.inference is None:
            return {}
        envs_per_row = self.envs_per_actor // self.env_groups
        sizes = self.inference.central.figures.batch_sizes()
        return {rows * envs_per_row: count for rows, count in sizes.items()}

    def inference_seconds(self) -> dict[str, float]:
        if self.inference is None:
            return {}
        return self.inference.central.figures.seconds_by_part()


# --------------------------------------------------------------------------- training


class MonoTrainer(Trainer):
    """Training with actor processes that share memory with the learner."""

    def __init__(self, settings: Settings):
        self.context: mp.context.BaseContext | None = None  # once the run's checks passed
        super().__init__(settings, envs.env_spec(settings.env))
        self.weights = SharedWeights(self.learner.model)
        self.actor_pool: ActorPool | None = None

    def prepare_children(self) -> None:
        self.context = actor_context()  # its server imports while the learner is built

    def create_pool(self) -> ActorPool:
        self.weights.publish(self.learner.model)
        self.actor_pool = ActorPool(
            self.settings,
            self.env_spec,
            self.config,
            self.weights,
            self.learner.model,
            self.checkpoint.first_incarnation(),
            self.context,
        )
        return self.actor_pool

    def publish(self, model: nn.Module) -> None:
        if self.actor_pool is None:
            self.weights.publish(model)
        else:
            self.actor_pool.publish(model)


@contextlib.contextmanager
def session(settings: Settings) -> Iterator[MonoTrainer]:
    """A trainer ready to start its actor processes (which its ``train`` stops)."""
    yield MonoTrainer(settings)


def train(settings: Settings) -> dict:
    with session(settings) as trainer:
        return trainer.train()

"""MonoBeast's central inference (``--central_inference``): actors only step their
environments; one process beside the learner's runs one batched forward pass for every
actor waiting, on the learner's device, as Sample Factory's policy workers do.

    actor i, env group g                        inference process
    writes its env outputs and core state       waits on every group's inference pipe
    into its row of InferenceSlots, then        gathers the rows of the groups ready,
    sends one byte on its pipe       ------->   [1, N x E/G, ...]; one forward pass with
                                                the weights last published; writes each
    reads its actions, logits, baseline,  <---  group's outputs and core state into its
    policy version and core state               row, and answers each with one byte

An actor's E envs step in G groups (``--env_groups``, 2 by default) that take turns: while
the server chooses one group's actions the actor steps the other's envs, as Sample
Factory's rollout workers do ("double-buffered sampling"); ``mono_actor.TakingTurns``.
The actor needs no copy of the weights, and its CPU goes to its environments alone. The
server reads the weights the learner publishes for actors (``SharedWeights``, a seqlock)
before each pass. It runs in a process of its own rather than a thread of the learner's:
there it shared the interpreter's lock and the CPU threads with the learner's threads, and
on a 16-core H200 machine it topped out at 8,200-8,900 SPS with cores to spare. The
learner process starts it, hands it the inference end of each (new) actor's pipe over a
control pipe, and reads its figures from shared memory; a dead actor closes its pipe and
the server forgets it. If the server fails or dies, the run ends with one line.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import multiprocessing.connection
import signal
import threading
import time
import traceback
from collections.abc import Callable

import torch
from torch import nn

from torchbeast import envs
from torchbeast.core import rollout
from torchbeast.core.inference_graph import InferenceGraphs
from torchbeast.core.models import Agent, CoreState, create_model, sampling_generator
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.mono_weights import SharedWeights
from torchbeast.runtime.processes import die_with_parent
from torchbeast.runtime.supervision import (
    STOP_SIGNALS,
    join_or_kill,
    last_line,
    starting_child,
)

Connection = multiprocessing.connection.Connection
log = logging.getLogger("torchbeast")

# What the model reads of an env output, and what an actor gets back.
INPUT_KEYS = rollout.MODEL_KEYS  # frame, reward, done, last_action
OUTPUT_KEYS = rollout.AGENT_KEYS  # policy_logits, baseline, action, policy_version

# The parts of the server's time, in order: idle until an actor asks, then each part of
# one pass: new weights (when the learner published some), the rows to the device, the
# forward pass, the outputs to the rows, the answers.
PASS_PARTS = ("waiting", "weights", "gather", "forward", "return", "answer")

START_TIMEOUT_S = 300.0  # building the model, and CUDA's first start on a busy machine
STOP_TIMEOUT_S = 5.0


@dataclasses.dataclass
class InferenceSlots:
    """Shared memory for the requests: one row per env group of an actor (R rows in all),
    its E envs side by side (an actor's E/G)."""

    inputs: dict[str, torch.Tensor]  # frame [R, E, *obs]; reward, done, last_action [R, E]
    outputs: dict[str, torch.Tensor]  # policy_logits [R, E, actions]; the others [R, E]
    core_state: tuple[torch.Tensor, ...]  # [R, layers, E, H] each: in, then out

    @classmethod
    def allocate(
        cls, env_spec: EnvSpec, model: nn.Module, num_rows: int, envs_per_row: int
    ) -> InferenceSlots:
        spec = rollout.rollout_spec(env_spec, 0)  # [1, ...] shapes and dtypes of one step

        def shared(name: str) -> torch.Tensor:
            shape, dtype = spec[name]
            return torch.zeros(num_rows, envs_per_row, *shape[1:], dtype=dtype)

        state = model.initial_state(envs_per_row)  # [layers, E, H] each
        return cls(
            inputs={key: shared(key).share_memory_() for key in INPUT_KEYS},
            outputs={key: shared(key).share_memory_() for key in OUTPUT_KEYS},
            core_state=tuple(torch.zeros(num_rows, *s.shape).share_memory_() for s in state),
        )


@dataclasses.dataclass
class InferenceFigures:
    """What the server did so far, in shared memory: the learner process reads it for the
    benchmark."""

    seconds: torch.Tensor  # float64 [len(PASS_PARTS) + 1]: wall-clock per part, then CPU
    passes: torch.Tensor  # int64 [num_rows + 1]: forward passes that served n rows

    @classmethod
    def allocate(cls, num_rows: int) -> InferenceFigures:
        return cls(
            seconds=torch.zeros(len(PASS_PARTS) + 1, dtype=torch.float64).share_memory_(),
            passes=torch.zeros(num_rows + 1, dtype=torch.int64).share_memory_(),
        )

    def seconds_by_part(self) -> dict[str, float]:
        """Wall-clock seconds in each of PASS_PARTS, and the server's CPU seconds ("cpu")."""
        return dict(zip((*PASS_PARTS, "cpu"), self.seconds.tolist(), strict=True))

    def batch_sizes(self) -> dict[int, int]:
        """Rows (env groups) per forward pass -> passes."""
        return {size: count for size, count in enumerate(self.passes.tolist()) if count}


@dataclasses.dataclass
class CentralInference:
    """What the inference process works with: the actors' slots (all that the actors get
    of it, as ``ActorShared.inference``), its figures, and what it builds its model from."""

    slots: InferenceSlots
    figures: InferenceFigures
    config: dict  # the model's
    env_spec: EnvSpec
    device: str  # the learner's
    compute_dtype: torch.dtype  # the learner's torso's (``--precision``)
    seed: int | None  # the server's sampling (``--seed``'s)
    cuda_graphs: bool = True  # its forward passes as CUDA graphs, on a GPU (``--cuda_graphs``)


class RemotePolicy:
    """An actor's end of one row: called as the model would be, it asks the server instead;
    ``ask`` and ``answer`` do the same in two halves, so that the actor can step other
    envs while the server works."""

    def __init__(self, slots: InferenceSlots, row: int, conn: Connection):
        self.slots = slots
        self.row = row
        self.conn = conn

    def __call__(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """``inputs`` [1, E, ...] -> (outputs [1, E, ...], core state [layers, E, H])."""
        self.ask(inputs, core_state)
        return self.answer()

    def ask(self, inputs: dict[str, torch.Tensor], core_state: CoreState) -> None:
        """Hands ``inputs`` [1, E, ...] and ``core_state`` to the server."""
        for key in INPUT_KEYS:
            self.slots.inputs[key][self.row].copy_(inputs[key][0])
        for shared, state in zip(self.slots.core_state, core_state, strict=True):
            shared[self.row].copy_(state)
        self.conn.send_bytes(b"?")

    def answer(self) -> tuple[dict[str, torch.Tensor], CoreState]:
        """Waits for the outputs [1, E, ...] and next core state of the last ``ask``."""
        self.conn.recv_bytes()  # EOFError when the server is gone: the actor ends
        outputs = {key: self.slots.outputs[key][self.row].clone()[None] for key in OUTPUT_KEYS}
        return outputs, tuple(shared[self.row].clone() for shared in self.slots.core_state)


class InferenceServer:
    """A model with the weights last published, on the learner's device, answering the
    rows (actors' env groups) whose pipes it was given.

    A pass gathers the rows waiting into host buffers allocated once (pinned
    on a GPU, so that the copies to and from the device are asynchronous), runs one
    forward pass (on a GPU, replayed from a CUDA graph: ``core.inference_graph``), samples
    the actions, and waits for the device once, for the outputs, before it writes them to
    the rows."""

    def __init__(
        self,
        model: Agent,
        slots: InferenceSlots,
        figures: InferenceFigures,
        weights: SharedWeights,
        cuda_graphs: bool = True,
    ):
        """``model``: an inference copy of the learner's, on the learner's device;
        ``cuda_graphs``: its passes as CUDA graphs, where that device is a GPU."""
        self.model = model.train()  # samples actions, as an actor's copy does
        self.device = next(model.parameters()).device
        self.generator = sampling_generator(self.device)
        on_gpu = self.device.type == "cuda"
        num_rows, envs_per_row = slots.inputs["reward"].shape
        self.graphs = (
            InferenceGraphs(model, num_rows, envs_per_row) if cuda_graphs and on_gpu else None
        )
        # Lines for the run's log (how the passes run), which the process sends on.
        self.tell: Callable[[int, str], None] = log.log
        # One wait per pass, on an event that sleeps rather than spins: the cores belong
        # to the actors' environments.
        self.outputs_ready = torch.cuda.Event(blocking=True) if on_gpu else None
        self.slots = slots
        self.staged = InferenceSlots(  # the rows of one pass, in the order asked
            inputs={key: host_buffer(value, on_gpu) for key, value in slots.inputs.items()},
            outputs={key: host_buffer(value, on_gpu) for key, value in slots.outputs.items()},
            core_state=tuple(host_buffer(state, on_gpu) for state in slots.core_state),
        )
        self.weights = weights
        self.version = -1  # of the weights the model holds
        # New weights arrive in one piece, in pinned memory, on a GPU.
        self.weights_staging = host_buffer(weights.flat, pinned=True) if on_gpu else None
        self.seconds = figures.seconds.numpy()  # written here, read by the learner process
        self.passes = figures.passes.numpy()
        self.conns: dict[Connection, int] = {}  # pipe -> row
        self.retired: list[Connection] = []  # pipes of rows that a new actor took over
        self.conns_lock = threading.Lock()
        self.stopping = threading.Event()

    def add(self, row: int, conn: Connection) -> None:
        """Serves a (new) actor's row from now on, through ``conn`` alone: the pipe of the
        actor it replaces goes, so that a request that actor left is not served too (one
        pass would hold the row twice)."""
        with self.conns_lock:
            for old in [old for old, served in self.conns.items() if served == row]:
                del self.conns[old]
                self.retired.append(old)  # closed by the serving thread, between its waits
            self.conns[conn] = row

    def serve(self) -> None:
        """Answers the rows until ``stopping`` is set; then closes their pipes, which
        ends any actor waiting for its actions."""
        clock = PassClock(self.seconds)
        while not self.stopping.is_set():
            rows, answers = self._requests()
            clock.lap("waiting")
            if rows:
                self.infer(rows, clock)
                for conn in answers:
                    try:
                        conn.send_bytes(b"!")
                    except OSError:
                        pass  # it died meanwhile; the next wait sees its pipe close
                clock.lap("answer")
        with self.conns_lock:
            for conn in [*self.conns, *self.retired]:
                conn.close()
            self.conns.clear()
            self.retired.clear()

    def _requests(self) -> tuple[list[int], list[Connection]]:
        """The rows that asked (waiting up to 0.1 s for one), and their pipes."""
        with self.conns_lock:
            for conn in self.retired:
                conn.close()
            self.retired.clear()
            conns = dict(self.conns)
        rows, answers = [], []
        for conn in multiprocessing.connection.wait(list(conns), timeout=0.1):
            try:
                conn.recv_bytes()
            except (EOFError, OSError):  # the actor died: its pipe goes
                with self.conns_lock:
                    self.conns.pop(conn, None)
                conn.close()
                continue
            rows.append(conns[conn])
            answers.append(conn)
        return rows, answers

    def infer(self, rows: list[int], clock: PassClock | None = None) -> None:
        """One forward pass for the requests of ``rows``; they get the outputs."""
        clock = clock or PassClock(self.seconds)
        self.passes[len(rows)] += 1
        self.version = self.weights.read_into(self.model, self.version, self.weights_staging)
        clock.lap("weights")
        index = torch.tensor(rows)
        inputs, core_state = self._gather(index)
        clock.lap("gather")
        with torch.inference_mode():
            outputs, core_state = self._forward(inputs, core_state)
        clock.lap("forward")
        self._return(index, outputs, core_state)
        clock.lap("return")

    def _forward(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """The pass's outputs [1, N x E, ...] (actions sampled) and next core state: from a
        graph where there are graphs, else eagerly (for good, once a graph fails)."""
        outputs = None
        if self.graphs is not None:
            first = not self.graphs.captured
            try:
                outputs, core_state_out = self.graphs.run(inputs, core_state)
            except Exception as error:  # a capture that failed, or a graph that disagreed
                self.graphs = None
                self.tell(
                    logging.WARNING,
                    "Central inference's forward passes run eagerly, not as CUDA graphs: "
                    f"{error}".strip(),
                )
            else:
                if first:
                    self.tell(
                        logging.INFO,
                        "Central inference's forward passes run as CUDA graphs (the first "
                        "agreed with the eager pass).",
                    )
        if outputs is None:
            outputs, core_state_out = self.model(inputs, core_state, act=False)
        logits = outputs["policy_logits"]
        return {
            "policy_logits": logits,
            "baseline": outputs["baseline"],
            "action": self.model.choose(logits[0], self.generator)[None],
            "policy_version": self.model.policy_version.expand(logits.shape[:2]),
        }, core_state_out

    def _gather(self, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], CoreState]:
        """The rows' inputs [1, N x E, ...] and core state [layers, N x E, H], on the device."""
        count = len(rows)
        inputs = {}
        for key, shared in self.slots.inputs.items():
            host = torch.index_select(shared, 0, rows, out=self.staged.inputs[key][:count])
            inputs[key] = host.flatten(0, 1)[None].to(self.device, non_blocking=True)
        core_state = []
        for shared, staged in zip(self.slots.core_state, self.staged.core_state, strict=True):
            host = torch.index_select(shared, 0, rows, out=staged[:count])  # [N, layers, E, H]
            state = host.to(self.device, non_blocking=True)
            core_state.append(state.transpose(0, 1).flatten(1, 2))
        return inputs, tuple(core_state)

    def _return(
        self, rows: torch.Tensor, outputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> None:
        """Writes the outputs [1, N x E, ...] and core state [layers, N x E, H] to the rows,
        waiting for the device once."""
        count, envs = len(rows), self.slots.inputs["reward"].shape[1]
        for key, staged in self.staged.outputs.items():
            by_actor = outputs[key][0].unflatten(0, (count, envs))
            staged[:count].copy_(by_actor, non_blocking=True)
        for state, staged in zip(core_state, self.staged.core_state, strict=True):
            by_actor = state.unflatten(1, (count, envs)).transpose(0, 1)  # [N, layers, E, H]
            staged[:count].copy_(by_actor, non_blocking=True)
        if self.outputs_ready is not None:
            self.outputs_ready.record()  # after the copies, on the current stream
            self.outputs_ready.synchronize()
        for key, shared in self.slots.outputs.items():
            shared.index_copy_(0, rows, self.staged.outputs[key][:count])
        for shared, staged in zip(self.slots.core_state, self.staged.core_state, strict=True):
            shared.index_copy_(0, rows, staged[:count])


def host_buffer(like: torch.Tensor, pinned: bool) -> torch.Tensor:
    """A host buffer shaped as ``like``, page-locked where ``pinned``."""
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinned)


class PassClock:
    """Adds the wall-clock time since its last lap to one part of ``seconds`` (an array
    in PASS_PARTS's order, then CPU), and the thread's CPU time to its last entry."""

    PART_INDEX = {part: index for index, part in enumerate(PASS_PARTS)}

    def __init__(self, seconds):
        self.seconds = seconds
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def lap(self, part: str) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.seconds[self.PART_INDEX[part]] += wall - self.wall
        self.seconds[-1] += cpu - self.cpu
        self.wall, self.cpu = wall, cpu


# --------------------------------------------------------------------------- the process


def inference_process(
    central: CentralInference, weights: SharedWeights, control: Connection
) -> None:
    """The inference process: serves until the learner process says stop (or is gone).
    ``control`` brings the inference ends of the actors' pipes and the stop; it takes back
    "ready" once the model is built, or the error that stopped the server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when it stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent()
    torch.set_num_threads(1)  # its CPU work is copies; the cores are the actors'
    try:
        server = build_server(central, weights)
        server.tell = lambda level, line: control.send(("note", (level, line)))
        control.send(("ready", None))
        threading.Thread(target=take_orders, args=(control, server), daemon=True).start()
        server.serve()
    except Exception:
        try:
            control.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None


def build_server(central: CentralInference, weights: SharedWeights) -> InferenceServer:
    """The server of the process: an inference copy of the learner's model on its device,
    sampling from a seed of its own (no actor's: theirs number from 0)."""
    seed = envs.worker_seed(central.seed, -1, 1)
    if seed is None:
        torch.seed()
    else:
        torch.manual_seed(seed)
    model = create_model(
        central.config,
        central.env_spec.observation_shape,
        central.env_spec.num_actions,
        compute_dtype=central.compute_dtype,
        inference_only=True,
    )
    return InferenceServer(
        model.to(central.device), central.slots, central.figures, weights, central.cuda_graphs
    )


def take_orders(control: Connection, server: InferenceServer) -> None:
    """Adds the actors' pipes the learner process sends; stops the server on None, or when
    the learner process is gone."""
    while True:
        try:
            order = control.recv()
        except (EOFError, OSError):
            order = None
        if order is None:
            server.stopping.set()
            return
        row, conn = order
        server.add(row, conn)


class InferenceProcess:
    """The learner process's handle on the inference process."""

    def __init__(
        self, context: mp.context.BaseContext, central: CentralInference, weights: SharedWeights
    ):
        self.central = central
        self.context = context
        self.control, self.child_control = context.Pipe()
        self.process = context.Process(
            target=inference_process,
            name="inference",
            args=(central, weights, self.child_control),
            daemon=True,
        )
        self.send_lock = threading.Lock()  # actors' pipes, from the dispatcher and start
        self.started = False

    def start(self) -> str | None:
        """Starts the process and waits until it serves; the error that stopped it, if
        any, as one line (the whole of it is logged)."""
        with starting_child(self.context):
            self.process.start()
        self.started = True
        self.child_control.close()  # so that this end sees EOF when the process dies
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.control.poll(0.1):
            if time.monotonic() > deadline:
                return self.death()
            if not self.process.is_alive():
                break  # its pipe holds the error it sent, or nothing but the end
        return self.read_failure()

    def add(self, row: int, conn: Connection) -> None:
        """Hands the inference end of the pipe of an actor's ``row`` over (and closes it
        here)."""
        try:
            with self.send_lock:
                self.control.send((row, conn))
        except OSError:
            pass  # the process is gone; the dispatcher says so
        conn.close()

    def read_failure(self) -> str | None:
        """What the process sent: None for "ready", or for a line for the run's log (logged
        here); else why it stopped."""
        try:
            kind, payload = self.control.recv()
        except (EOFError, OSError):
            return self.death()
        if kind == "note":
            log.log(*payload)
            return None
        if kind == "error":
            log.error("Central inference failed:\n%s", payload)
            return f"central inference failed: {last_line(payload)} (traceback in out.log)"
        return None

    def gone(self) -> str | None:
        """Why the process stopped, if it has (given a moment to finish an exit under way),
        else None: an actor that lost its pipe to it reports the cause, not its own error."""
        if not self.started:
            return None
        self.process.join(0.5)
        if self.process.is_alive():
            return None
        while self.control.poll():  # what it sent before it stopped: an error, or the end
            failure = self.read_failure()
            if failure is not None:
                return failure
        return self.death()

    def death(self) -> str:
        self.process.join(1.0)
        if self.process.is_alive():
            return f"central inference did not start within {START_TIMEOUT_S:.0f} s"
        return (
            f"the central inference process died (exit code {self.process.exitcode}); "
            "see out.log, and check memory"
        )

    def stop(self) -> None:
        """Stops the server; its actors waiting for actions end on their pipes' EOF."""
        try:
            with self.send_lock:
                self.control.send(None)
        except OSError:
            pass
        if self.started:
            join_or_kill([self.process], STOP_TIMEOUT_S)
        self.control.close()

"""MonoBeast's central inference (``--central_inference``): actors only step their
environments; one thread of the learner process runs one batched forward pass for every
actor waiting, on the learner's device, as SEED RL and Sample Factory do.

    actor i                                     learner process: InferenceServer thread
    writes its env outputs and core state       waits on every actor's inference pipe
    into its row of InferenceSlots, then        gathers the rows of the actors ready,
    sends one byte on its pipe       ------->   [1, N x E, ...]; one forward pass with
                                                the weights last published; writes each
    reads its actions, logits, baseline,  <---  actor's outputs and core state into its
    policy version and core state               row, and answers each with one byte

The actor needs no copy of the weights, and its CPU goes to its environments alone. A
dead actor closes its pipe and the server forgets it; its replacement brings a new pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from torchbeast.core import rollout
from torchbeast.core.models import CoreState, create_model, sampling_generator
from torchbeast.core.spec import EnvSpec
from torchbeast.core.weights import copy_weights

Connection = multiprocessing.connection.Connection

# What the model reads of an env output, and what an actor gets back.
INPUT_KEYS = ("frame", "reward", "done", "last_action")
OUTPUT_KEYS = rollout.AGENT_KEYS  # policy_logits, baseline, action, policy_version


@dataclasses.dataclass
class InferenceSlots:
    """Shared memory for the requests: one row per actor, its E envs side by side."""

    inputs: dict[str, torch.Tensor]  # frame [A, E, *obs]; reward, done, last_action [A, E]
    outputs: dict[str, torch.Tensor]  # policy_logits [A, E, actions]; the others [A, E]
    core_state: tuple[torch.Tensor, ...]  # [A, layers, E, H] each: in, then out

    @classmethod
    def allocate(
        cls, env_spec: EnvSpec, model: nn.Module, num_actors: int, envs_per_actor: int
    ) -> InferenceSlots:
        spec = rollout.rollout_spec(env_spec, 0)  # [1, ...] shapes and dtypes of one step

        def shared(name: str) -> torch.Tensor:
            shape, dtype = spec[name]
            return torch.zeros(num_actors, envs_per_actor, *shape[1:], dtype=dtype)

        state = model.initial_state(envs_per_actor)  # [layers, E, H] each
        return cls(
            inputs={key: shared(key).share_memory_() for key in INPUT_KEYS},
            outputs={key: shared(key).share_memory_() for key in OUTPUT_KEYS},
            core_state=tuple(torch.zeros(num_actors, *s.shape).share_memory_() for s in state),
        )


class RemotePolicy:
    """An actor's end: called as the model would be, it asks the server instead."""

    def __init__(self, slots: InferenceSlots, actor_index: int, conn: Connection):
        self.slots = slots
        self.row = actor_index
        self.conn = conn

    def __call__(
        self, inputs: dict[str, torch.Tensor], core_state: CoreState
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """``inputs`` [1, E, ...] -> (outputs [1, E, ...], core state [layers, E, H])."""
        for key in INPUT_KEYS:
            self.slots.inputs[key][self.row].copy_(inputs[key][0])
        for shared, state in zip(self.slots.core_state, core_state, strict=True):
            shared[self.row].copy_(state)
        self.conn.send_bytes(b"?")
        self.conn.recv_bytes()  # EOFError when the learner is gone: the actor ends
        outputs = {key: self.slots.outputs[key][self.row].clone()[None] for key in OUTPUT_KEYS}
        return outputs, tuple(shared[self.row].clone() for shared in self.slots.core_state)


# The parts of the server's time, in order: idle until an actor asks, then each part of
# one pass (see ``InferenceServer.seconds``).
PASS_PARTS = ("waiting", "gather", "forward", "return", "answer")


class InferenceServer:
    """The learner process's end: a model with the weights last published, on the
    learner's device, and the thread that answers the actors.

    A pass gathers the rows of the actors waiting into host buffers allocated once (pinned
    on a GPU, so that the copies to and from the device are asynchronous), runs one
    forward pass, and waits for the device once, for the outputs, before it writes them to
    the actors' rows."""

    def __init__(
        self,
        model: nn.Module,
        config: dict,
        env_spec: EnvSpec,
        slots: InferenceSlots,
        fail: Callable[[str], None],
    ):
        self.device = next(model.parameters()).device
        # The learner's device, so the learner's precision.
        self.model = create_model(
            config,
            env_spec.observation_shape,
            env_spec.num_actions,
            compute_dtype=model.compute_dtype,
            inference_only=True,
        )
        self.model.to(self.device).train()  # samples actions, as an actor's copy does
        self.generator = sampling_generator(self.device)
        # On a GPU, inference queues its copies and forward passes on a stream of its own,
        # not behind the learner's update and batch copies on the default stream, and
        # waits for its outputs on an event that sleeps rather than spins: the cores
        # belong to the actors' environments.
        on_gpu = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if on_gpu else None
        self.outputs_ready = torch.cuda.Event(blocking=True) if on_gpu else None
        self.slots = slots
        self.staged = InferenceSlots(  # the rows of one pass, in the order asked
            inputs={key: host_buffer(value, on_gpu) for key, value in slots.inputs.items()},
            outputs={key: host_buffer(value, on_gpu) for key, value in slots.outputs.items()},
            core_state=tuple(host_buffer(state, on_gpu) for state in slots.core_state),
        )
        self.fail = fail
        self.lock = threading.Lock()  # the weights: publish, or a forward pass
        self.publish(model)
        self.conns: dict[Connection, int] = {}  # pipe -> actor index
        self.conns_lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="inference", daemon=True)
        self.batch_sizes: dict[int, int] = {}  # actors per forward pass -> passes
        # Wall-clock seconds so far in each of PASS_PARTS, and the thread's CPU seconds.
        self.seconds = dict.fromkeys((*PASS_PARTS, "cpu"), 0.0)

    def publish(self, model: nn.Module) -> None:
        """Copies the learner's new weights in, between two forward passes."""
        with self.lock:
            copy_weights(self.model, model)
            if self.stream is not None:  # the next forward pass waits for this copy
                self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def add(self, actor_index: int, conn: Connection) -> None:
        """Serves a (new) actor from now on."""
        with self.conns_lock:
            self.conns[conn] = actor_index

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stops answering; closing the pipes ends any actor waiting for its actions."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()
        with self.conns_lock:
            for conn in self.conns:
                conn.close()
            self.conns.clear()

    def _serve(self) -> None:
        try:
            clock = PassClock(self.seconds)
            while not self.stopping.is_set():
                actors, answers = self._requests()
                clock.lap("waiting")
                if actors:
                    self.infer(actors, clock)
                    for conn in answers:
                        try:
                            conn.send_bytes(b"!")
                        except OSError:
                            pass  # it died meanwhile; the next wait sees its pipe close
                    clock.lap("answer")
        except Exception as error:  # without inference no actor moves: stop the run
            self.fail(f"central inference failed: {error!r}")

    def _requests(self) -> tuple[list[int], list[Connection]]:
        """The actors that asked (waiting up to 0.1 s for one), and their pipes."""
        with self.conns_lock:
            conns = dict(self.conns)
        actors, answers = [], []
        for conn in multiprocessing.connection.wait(list(conns), timeout=0.1):
            try:
                conn.recv_bytes()
            except (EOFError, OSError):  # the actor died: its pipe goes
                with self.conns_lock:
                    self.conns.pop(conn, None)
                conn.close()
                continue
            actors.append(conns[conn])
            answers.append(conn)
        return actors, answers

    def infer(self, actors: list[int], clock: PassClock | None = None) -> None:
        """One forward pass for the requests of ``actors``; their rows get the outputs."""
        clock = clock or PassClock(self.seconds)
        self.batch_sizes[len(actors)] = self.batch_sizes.get(len(actors), 0) + 1
        rows = torch.tensor(actors)
        with (
            torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        ):
            inputs, core_state = self._gather(rows)
            clock.lap("gather")
            with self.lock, torch.inference_mode():
                outputs, core_state = self.model(inputs, core_state, generator=self.generator)
            clock.lap("forward")
            self._return(rows, outputs, core_state)
            clock.lap("return")

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
            self.outputs_ready.record(self.stream)
            self.outputs_ready.synchronize()
        for key, shared in self.slots.outputs.items():
            shared.index_copy_(0, rows, self.staged.outputs[key][:count])
        for shared, staged in zip(self.slots.core_state, self.staged.core_state, strict=True):
            shared.index_copy_(0, rows, staged[:count])


def host_buffer(like: torch.Tensor, pinned: bool) -> torch.Tensor:
    """A host buffer shaped as ``like``, page-locked where ``pinned``."""
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinned)


class PassClock:
    """Adds the wall-clock time since its last lap to one part of ``seconds``, and the
    thread's CPU time to ``seconds["cpu"]``."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def lap(self, part: str) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.seconds[part] += wall - self.wall
        self.seconds["cpu"] += cpu - self.cpu
        self.wall, self.cpu = wall, cpu

"""The learner side of PolyBeast: env streams in, batched inference, rollouts out.

    env stream (one thread each)          learner
    ----------------------------          -------
    Hello -> spec checked                 DynamicBatcher: one forward pass for all
    Step  -> written into its rollout       streams waiting, on the learner's device
    ask the batcher for an action  <--->  RolloutQueue (bounded): learner threads
    every T steps: rollout -> queue         stack B rollouts to [T+1, B, ...]

Classic mode dials ``num_actors`` streams over the env servers' addresses and redials a
dead server with backoff. Inverted mode (``--serve ADDRESS``) serves any number of env
clients up to ``--max_clients``. A stream that ends before its rollout is full (a client
that left, a server that died) still delivers what it sent: padded to T+1 with a mask.

A peer can cost only its own stream: a stream's rollout buffers are allocated at its
first Step, from a learner-wide budget (``--stream_memory_mb``); a client that sends no
Hello within ``HELLO_TIMEOUT_S``, or no Step for ``--stream_timeout_s``, is closed; rows
of a batched inference that come out non-finite close the streams they came from; and
rollouts that make the loss non-finite close theirs (see ``Trainer``).
"""

from __future__ import annotations

import collections
import csv
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import torch
from torch import nn

from torchbeast.config.settings import Settings
from torchbeast.core import rollout
from torchbeast.core.checkpoint import describe_spec
from torchbeast.core.models import CoreState, create_model
from torchbeast.core.rollout import rollout_bytes
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec, network
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly import polybeast_pb2_grpc as pb_grpc
from torchbeast.runtime.poly.batching import DynamicBatcher, Failed
from torchbeast.runtime.queues import Batch, Closed, RolloutQueue, stack_rollouts
from torchbeast.runtime.supervision import Supervised
from torchbeast.runtime.training import TrainingError

log = logging.getLogger("torchbeast")

MAX_BACKOFF_S = 5.0
NO_ENVS_NOTICE_S = 5.0
HELLO_TIMEOUT_S = 10.0  # inverted mode: a client must say what it is this soon
WATCH_INTERVAL_S = 0.5
MAX_CLOSED_STREAM_NAMES = 10_000  # client ids kept for naming the sources of old rollouts


class SpecMismatch(ValueError):
    """An environment's spec differs from the one this learner trains on."""


class OverBudget(RuntimeError):
    """A stream's buffers would exceed the learner's memory budget for streams."""


class StreamClosed(codec.ProtocolError):
    """The learner closed a stream: it was idle, or its data cannot be learned from."""


@dataclass
class _Stream:
    """One env stream, as the watchdog sees it."""

    serial: int
    cancel: Callable[[], object]  # ends the RPC; the stream's thread sees an RpcError
    client_id: str = "?"
    deadline: float | None = None  # while waiting for the peer: when it is too late
    waiting_for: str = ""
    closed_because: str | None = None
    discard: bool = False  # closed for bad data: its partial rollout is not learned from


Rollout = tuple[dict[str, torch.Tensor], CoreState]  # [T+1, ...] with "mask"; [layers, 1, H]


class EpisodeLog:
    """episodes.csv in the run folder: one row per finished episode, with the client."""

    FIELDS = ("time", "client_id", "episode_return", "episode_step", "end")

    def __init__(self, path: str):
        new = not os.path.exists(path)
        self.file = open(path, "a", newline="")  # noqa: SIM115 (closed in close())
        self.writer = csv.writer(self.file)
        self.lock = threading.Lock()
        if new:
            self.writer.writerow(self.FIELDS)

    def write(self, client_id: str, episode_return: float, episode_step: int, end: str) -> None:
        with self.lock:
            self.writer.writerow(
                (f"{time.time():.3f}", client_id, episode_return, episode_step, end)
            )
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            self.file.close()


class PolyActorPool(Supervised):
    """Env streams on one side, the learner's ``get_batch`` on the other."""

    drops_bad_batches = True  # see Trainer.drop_batch: peers' data must not stop the run

    def __init__(
        self,
        settings: Settings,
        env_processes: list | None = None,
        spec: EnvSpec | None = None,
    ):
        """``env_processes``: the env processes this command started, watched for exits.
        ``spec``: the environment the run trains on, if the learner knows it; otherwise the
        first Hello decides it."""
        self.poly = poly = settings.runtime
        self.num_actors = settings.actors.num_actors
        self.batch_size = settings.learner.batch_size
        self.unroll_length = settings.learner.unroll_length
        self.env_processes = env_processes or []
        self.spec = spec
        self.spec_known = threading.Event()
        if spec is not None:
            self.spec_known.set()
        self.model_ready = threading.Event()
        super().__init__()
        # Stopping the pool closes the queue: learner threads waiting on it are let go.
        self.queue: RolloutQueue[Rollout] = RolloutQueue(poly.max_learner_queue_size, self.stopping)
        self.lock = threading.Lock()
        self.connected: collections.Counter[str] = collections.Counter()  # streams per id
        self.stream_serials = itertools.count()  # a replay source per stream and env
        self.streams: dict[int, _Stream] = {}  # open streams, by serial
        # serial -> client id, also of closed streams whose rollouts may still be queued.
        self.client_ids: collections.OrderedDict[int, str] = collections.OrderedDict()
        self.memory_budget = poly.stream_memory_mb << 20
        self.memory_used = 0
        self.last_connected = time.monotonic()
        self.server: grpc.Server | None = None
        self.port: int | None = None
        self.threads: list[threading.Thread] = []
        self.channels: list[grpc.Channel] = []
        self.batcher: DynamicBatcher | None = None
        self.inference_model: nn.Module | None = None
        self.inference_lock = threading.Lock()
        self.device = torch.device("cpu")
        self.episodes: EpisodeLog | None = None

    # ------------------------------------------------------------------ lifecycle

    def listen(self) -> None:
        """Starts serving (inverted) or dialling (classic); streams wait for the model."""
        poly = self.poly
        log.info(
            "Env streams' rollout buffers may take at most %d MiB (--stream_memory_mb)%s.",
            poly.stream_memory_mb,
            self._stream_size_text(),
        )
        if self.env_processes:
            threading.Thread(target=self._watch_env_processes, daemon=True).start()
        threading.Thread(target=self._watch_streams, name="stream-watchdog", daemon=True).start()
        if poly.serve:
            self.server, self.port = network.create_server(
                poly.network, poly.serve, poly.max_clients
            )
            add_learner_servicer(self.server, LearnerServicer(self))
            self.server.start()
            log.info("Learner serving env clients on %s.", poly.serve)
            log.info(
                "At most %d env clients at once (--max_clients); a client must send its Hello "
                "within %.0f s and a Step at least every %.0f s (--stream_timeout_s).",
                poly.max_clients,
                HELLO_TIMEOUT_S,
                poly.stream_timeout_s,
            )
        else:
            addresses = poly.network.server_addresses()
            for index in range(self.num_actors):
                address = addresses[index % len(addresses)]
                thread = threading.Thread(
                    target=self._dial, args=(address, index), name=f"dial-{index}", daemon=True
                )
                self.threads.append(thread)
                thread.start()
            log.info("Dialling %d env streams over %s.", self.num_actors, ", ".join(addresses))

    def wait_for_spec(self) -> EnvSpec:
        """Blocks until the first environment says what it is."""
        where = self.poly.serve or ", ".join(self.poly.network.server_addresses())
        if not self.spec_known.wait(2.0):
            log.info("Waiting for the first environment to connect (%s).", where)
        while not self.spec_known.wait(0.2):
            if self.stopping.is_set():
                raise TrainingError(self.error or "stopped before any environment connected")
        assert self.spec is not None
        return self.spec

    def attach(self, model: nn.Module, config: dict, run_dir: str) -> None:
        """Lets streams act with a copy of ``model`` on its device."""
        assert self.spec is not None
        self.device = next(model.parameters()).device
        inference_model = create_model(config, self.spec.observation_shape, self.spec.num_actions)
        inference_model.load_state_dict(model.state_dict())
        inference_model.policy_version.copy_(model.policy_version)  # not in state_dict
        self.inference_model = inference_model.to(self.device)
        self.initial_core_state = tuple(s.cpu() for s in inference_model.initial_state(1))
        self.episodes = EpisodeLog(os.path.join(run_dir, "episodes.csv"))
        self.batcher = DynamicBatcher(
            self._infer,
            max_batch_size=self.poly.max_inference_batch_size,
            timeout_s=self.poly.inference_timeout_ms / 1000,
            num_threads=self.poly.num_inference_threads,
        )
        self.model_ready.set()
        self.monitor = threading.Thread(target=self._watch_connections, daemon=True)
        self.monitor.start()

    def start(self) -> None:
        """Nothing to do: streams started in ``listen`` and act once ``attach`` ran."""

    def stop(self) -> None:
        self.stopping.set()
        self.queue.close()
        if self.batcher is not None:
            self.batcher.close()
        if self.server is not None:
            self.server.stop(grace=1.0).wait()
        for channel in list(self.channels):
            channel.close()
        for thread in self.threads:
            thread.join(timeout=5.0)
        if self.episodes is not None:
            self.episodes.close()

    def publish(self, model: nn.Module) -> None:
        """Copies the learner's new weights into the inference model."""
        if self.inference_model is None:
            return
        with self.inference_lock, torch.no_grad():
            for target, source in zip(
                self.inference_model.parameters(), model.parameters(), strict=True
            ):
                target.copy_(source)
            self.inference_model.policy_version.copy_(model.policy_version)

    # ------------------------------------------------------------------ learner side

    def get_batch(self) -> Batch | None:
        """B rollouts stacked to [T+1, B, ...] (with "mask"), their initial core states
        and the (stream, env) each came from."""
        items = self.queue.get_batch(self.batch_size)
        return None if items is None else stack_rollouts(items)

    def _infer(self, requests: list[tuple[dict[str, torch.Tensor], CoreState]]) -> list:
        """One forward pass for many streams: inputs [1, E, ...] each, batched on dim 1.

        Actions are sampled here, not in the model (which runs in eval mode), so that a
        stream whose observations give non-finite outputs fails alone (``Failed``)."""
        if len(requests) == 1:  # often: no copy needed
            inputs, core_state = requests[0]
        else:
            inputs = {
                key: torch.cat([request[0][key] for request in requests], dim=1)
                for key in requests[0][0]
            }
            core_state = tuple(
                torch.cat([request[1][i] for request in requests], dim=1)
                for i in range(len(requests[0][1]))
            )
        inputs = {key: value.to(self.device) for key, value in inputs.items()}
        core_state = tuple(s.to(self.device) for s in core_state)
        with self.inference_lock, torch.inference_mode():
            outputs, core_state = self.inference_model(inputs, core_state, act=False)
        logits = outputs["policy_logits"][0]  # [N, A]
        # One reduction per row: a non-finite logit or baseline makes the sum non-finite.
        finite = torch.isfinite(logits.sum(dim=1) + outputs["baseline"][0])  # [N]
        all_finite = bool(finite.all())
        if not all_finite:  # rare: sample the good rows; the others fail their stream
            logits = torch.where(finite[:, None], logits, 0.0)
        probabilities = torch.softmax(logits, dim=1)
        outputs["action"] = torch.multinomial(probabilities, num_samples=1).view(1, -1)
        outputs = {key: value.cpu() for key, value in outputs.items()}  # [1, N, ...]
        core_state = tuple(s.cpu() for s in core_state)  # [layers, N, H]
        row_finite = None if all_finite else finite.tolist()
        results: list = []
        start = 0
        for request in requests:
            end = start + request[0]["frame"].shape[1]
            if row_finite is not None and not all(row_finite[start:end]):
                error = StreamClosed(
                    "inference on its observations gave non-finite outputs "
                    "(are its values too large?)"
                )
                results.append(Failed(error))
            else:
                results.append(
                    (
                        {key: value[0, start:end] for key, value in outputs.items()},
                        tuple(s[:, start:end] for s in core_state),
                    )
                )
            start = end
        return results

    # ------------------------------------------------------------------ streams

    def register(self, client_id: str, spec: EnvSpec) -> None:
        """Checks a Hello's spec against the run's; the first Hello decides it only when
        the learner was told nothing about the environment."""
        with self.lock:
            if self.spec is None:
                self.spec = spec
                self.spec_known.set()
                log.info(
                    "The learner was not told the environment (--env), so the first one to "
                    "connect decides it: %s sent %s, observations %s %s, %d actions.",
                    client_id,
                    spec.env_id,
                    spec.observation_dtype,
                    list(spec.observation_shape),
                    spec.num_actions,
                )
            elif spec != self.spec:
                raise SpecMismatch(
                    f"environment {describe_spec(spec)} does not match the run's "
                    f"{describe_spec(self.spec)}"
                )
            self.connected[client_id] += 1

    def serve_env(
        self, incoming: Iterator[pb.EnvMessage], cancel: Callable[[], object]
    ) -> Iterator[pb.Action]:
        """Runs one env stream: reads Steps, yields Actions, queues rollouts.

        ``cancel`` ends the stream's RPC (the watchdog's way to close it)."""
        stream = _Stream(next(self.stream_serials), cancel)
        with self.lock:
            self.streams[stream.serial] = stream
        try:
            messages = self._watched(incoming, stream)
            first = next(messages, None)
            if first is None:
                return
            client_id, spec, num_envs = codec.read_hello(first)
            self.register(client_id, spec)
        except BaseException:
            with self.lock:
                del self.streams[stream.serial]
            raise
        stream.client_id = client_id
        with self.lock:
            self.client_ids[stream.serial] = client_id
            while len(self.client_ids) > MAX_CLOSED_STREAM_NAMES:
                self.client_ids.popitem(last=False)
        log.info("Env stream %s connected (%d envs).", client_id, num_envs)
        try:
            while not self.model_ready.wait(0.2):
                if self.stopping.is_set():
                    return
            yield from self._act(messages, stream, spec, num_envs)
        except (grpc.RpcError, codec.ProtocolError, Closed, OverBudget):
            raise  # the stream's own end; the caller closes it with the right status
        except Exception as error:  # a learner-side failure (e.g. in inference): stop the run
            with self.lock:
                first = self.error is None
                self.fail(f"serving env stream {client_id} failed: {error!r} (see out.log)")
            if first:  # every stream of the batch sees the same error: say it once
                log.exception("Serving env stream %s failed.", client_id)
            raise Closed("the learner is stopping") from None
        finally:
            with self.lock:
                del self.streams[stream.serial]
                self.connected[client_id] -= 1
                if self.connected[client_id] <= 0:
                    del self.connected[client_id]
                self.last_connected = time.monotonic()

    def _watched(
        self, incoming: Iterator[pb.EnvMessage], stream: _Stream
    ) -> Iterator[pb.EnvMessage]:
        """The stream's messages; the watchdog cancels a peer that keeps it waiting too long.

        Only waits for the peer count: not the learner's own (inference, a full queue)."""
        # Classic mode: the learner dials, and waiting for a server that is not up (yet) is
        # how it is meant to work; the timeouts start once the server said Hello.
        timeout = HELLO_TIMEOUT_S if self.poly.serve else None
        waiting_for = f"sent no Hello within {HELLO_TIMEOUT_S:.0f} s"
        while True:
            if timeout is not None:
                stream.waiting_for = waiting_for
                stream.deadline = time.monotonic() + timeout
            try:
                message = next(incoming, None)
            except grpc.RpcError:
                if stream.closed_because is not None:
                    raise StreamClosed(stream.closed_because) from None
                raise
            finally:
                stream.deadline = None
            if stream.closed_because is not None:
                raise StreamClosed(stream.closed_because)
            if message is None:
                return
            yield message
            timeout = self.poly.stream_timeout_s
            waiting_for = f"sent no Step for {timeout:.0f} s (--stream_timeout_s)"

    def close_streams(self, serials: set[int], reason: str) -> list[str]:
        """Closes the open streams among ``serials``; their partial rollouts are dropped.
        Returns the client ids of the ones closed."""
        closed = []
        with self.lock:
            for serial in serials:
                stream = self.streams.get(serial)
                if stream is not None and stream.closed_because is None:
                    stream.closed_because, stream.discard = reason, True
                    closed.append(stream)
        for stream in closed:
            stream.cancel()
        return [stream.client_id for stream in closed]

    def describe_sources(self, sources: list[tuple[int, int]]) -> str:
        """The client ids (with env index) that rollouts with these sources came from."""
        with self.lock:
            names = {
                f"{self.client_ids.get(serial, f'stream {serial}')}/{env}"
                for serial, env in sources
            }
        return ", ".join(sorted(names))

    def _watch_streams(self) -> None:
        """Closes streams whose peer kept them waiting past their deadline."""
        while not self.stopping.wait(WATCH_INTERVAL_S):
            now = time.monotonic()
            with self.lock:
                late = [
                    stream
                    for stream in self.streams.values()
                    if stream.deadline is not None
                    and stream.deadline < now
                    and stream.closed_because is None
                ]
                for stream in late:
                    stream.closed_because = stream.waiting_for
            for stream in late:
                stream.cancel()

    def _reserve(self, client_id: str, size: int) -> None:
        with self.lock:
            if self.memory_used + size > self.memory_budget:
                raise OverBudget(
                    f"the learner's memory for env streams is spent ({self.memory_used >> 20} "
                    f"of {self.memory_budget >> 20} MiB, --stream_memory_mb); "
                    f"{client_id} needs {size / 2**20:.1f} MiB"
                )
            self.memory_used += size

    def _release(self, size: int) -> None:
        with self.lock:
            self.memory_used -= size

    def _stream_size_text(self) -> str:
        if self.spec is None:
            return ""
        per_env = rollout_bytes(self.spec, self.unroll_length)
        return f"; each env of a stream takes {per_env / 2**20:.2f} MiB"

    def _act(
        self, incoming: Iterator[pb.EnvMessage], stream_info: _Stream, spec: EnvSpec, num_envs: int
    ) -> Iterator[pb.Action]:
        client_id = stream_info.client_id
        size_limit = codec.max_step_bytes(spec, num_envs)
        first = next(incoming, None)
        if first is None:
            return
        # Memory is spent only on a stream that sends Steps (a bare Hello costs nothing).
        first_fields, first_observation = codec.read_step(first, spec, num_envs, size_limit)
        buffer_size = num_envs * rollout_bytes(spec, self.unroll_length)
        self._reserve(client_id, buffer_size)
        try:
            yield from self._act_on_steps(
                incoming, stream_info, spec, num_envs, (first_fields, first_observation)
            )
        finally:
            self._release(buffer_size)

    def _act_on_steps(
        self,
        incoming: Iterator[pb.EnvMessage],
        stream_info: _Stream,
        spec: EnvSpec,
        num_envs: int,
        first_step: tuple[dict[str, np.ndarray], np.ndarray],
    ) -> Iterator[pb.Action]:
        T = self.unroll_length
        client_id, stream = stream_info.client_id, stream_info.serial
        size_limit = codec.max_step_bytes(spec, num_envs)
        # [T+1, E, ...]: the stream's E envs side by side, as the model wants them.
        buffers = {
            key: value.transpose(0, 1).contiguous()
            for key, value in rollout.allocate(spec, T, num_envs).items()
        }
        arrays = {key: value.numpy() for key, value in buffers.items()}  # views, for numpy writes
        core_state = initial_core_state = tuple(
            s.expand(-1, num_envs, -1).contiguous() for s in self.initial_core_state
        )
        t = 0

        def write(index: int, fields: dict[str, np.ndarray], observation: np.ndarray) -> None:
            arrays["frame"][index] = observation  # the one copy out of the message
            for name, values in fields.items():
                arrays[name][index] = values

        write(0, *first_step)
        try:
            while True:
                env_inputs = {key: buffers[key][t : t + 1] for key in rollout.ENV_KEYS}
                agent_output, core_state = self.batcher.compute((env_inputs, core_state))
                actions = agent_output["action"]  # [E]
                yield pb.Action(action=actions.tolist())
                message = next(incoming, None)
                if message is None:
                    break
                # A bad Step raises before t moves on.
                fields, observation = codec.read_step(message, spec, num_envs, size_limit)
                write(t + 1, fields, observation)
                t += 1
                buffers["last_action"][t] = actions
                for key in rollout.AGENT_KEYS:
                    buffers[key][t] = agent_output[key]
                for env in np.flatnonzero(fields["episode_end"]):
                    self.episodes.write(
                        client_id_of(client_id, env, num_envs),
                        float(fields["episode_return"][env]),
                        int(fields["episode_step"][env]),
                        "game",
                    )
                if t == T:
                    self._deliver(stream, buffers, T, initial_core_state)
                    for value in buffers.values():
                        value[0] = value[T]
                    initial_core_state, t = core_state, 0
        finally:  # also when the peer went away (grpc.RpcError): a disconnect
            if not self.stopping.is_set():
                log.info("Stream %s ended %d steps into a rollout.", client_id, t)
            if t > 0 and not self.stopping.is_set() and not stream_info.discard:
                # What the stream sent is still learned from: partial rollouts.
                for env in np.flatnonzero(~arrays["episode_end"][t]):
                    self.episodes.write(
                        client_id_of(client_id, env, num_envs),
                        float(arrays["episode_return"][t, env]),
                        int(arrays["episode_step"][t, env]),
                        "disconnect",
                    )
                try:
                    self._deliver(stream, buffers, t, initial_core_state)
                except Closed:
                    pass

    def _deliver(
        self,
        stream: int,
        buffers: dict[str, torch.Tensor],
        length: int,
        core_state: CoreState,
    ) -> None:
        """Queues each env's rollout: its first ``length`` + 1 steps, zero-padded to T+1,
        with its source: (stream, env)."""
        T1, num_envs = buffers["frame"].shape[:2]
        mask = torch.zeros(T1, dtype=torch.bool)
        mask[: length + 1] = True
        for env in range(num_envs):
            column = {key: value[:, env].clone() for key, value in buffers.items()}
            if length + 1 < T1:  # padding: zeros, which the mask keeps out of every loss
                for value in column.values():
                    value[length + 1 :] = 0
            column["mask"] = mask
            env_state = tuple(s[:, env : env + 1] for s in core_state)
            self.queue.put((column, env_state, (stream, env)))

    def _dial(self, address: str, index: int) -> None:
        """Classic mode: keeps one stream open to an env server, redialling with backoff."""
        backoff = 0.1
        metadata = network.call_metadata(self.poly.network)
        channel = network.create_channel(self.poly.network, address)
        with self.lock:
            self.channels.append(channel)
        stream_env = channel.stream_stream(
            "/torchbeast.polybeast.EnvServer/StreamEnv",
            request_serializer=pb.Action.SerializeToString,
            response_deserializer=codec.parse_env_message,  # logs what it cannot parse
        )
        for attempt in itertools.count():
            if self.stopping.is_set():
                return
            requests: queue.Queue[pb.Action | None] = queue.Queue()  # None: half-close
            # wait_for_ready: a server that is not up (yet, or again) is waited for.
            call = stream_env(iter(requests.get, None), metadata=metadata, wait_for_ready=True)
            try:
                for action in self.serve_env(call, call.cancel):
                    requests.put(action)
                reason = "it closed the stream"
            except grpc.RpcError as error:
                code = error.code()
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    self.fail(f"env server {address} refused the learner: {error.details()}")
                reason = code.name
            except codec.ProtocolError as error:
                reason = f"it sent a bad stream: {error}"
            except OverBudget as error:
                reason = str(error)
            except SpecMismatch as error:  # a misconfigured server: redialling cannot help
                self.fail(f"env server {address}: {error}")
                reason = str(error)
            except Closed:
                return
            finally:
                requests.put(None)
                call.cancel()
            if self.stopping.is_set():
                return
            if backoff == 0.1:
                log.warning("Env server %s: %s; redialling.", address, reason)
            elif attempt % 20 == 0:
                log.info("Still redialling env server %s.", address)
            if self.stopping.wait(backoff):
                return
            # A server that keeps failing streams is retried ever more slowly; one that
            # is just down is waited for by wait_for_ready instead.
            backoff = min(2 * backoff, MAX_BACKOFF_S) if reason != "UNAVAILABLE" else 0.1

    def _watch_env_processes(self) -> None:
        """Stops the run with one line once every env process this command started died."""
        while not self.stopping.wait(1.0):
            codes = [process.exitcode for process in self.env_processes]
            if all(code is not None for code in codes):
                self.fail(
                    f"every env process this command started has exited (exit codes {codes}); "
                    "their errors are in the output above"
                )

    def _watch_connections(self) -> None:
        """Says once when no environment is left, instead of waiting silently."""
        said = False
        while not self.stopping.wait(1.0):
            with self.lock:
                empty = not self.connected
                since = time.monotonic() - self.last_connected
            if empty and since > NO_ENVS_NOTICE_S and not said:
                where = self.poly.serve or ", ".join(self.poly.network.server_addresses())
                log.warning("No environments connected; waiting for them (%s).", where)
                said = True
            elif not empty:
                said = False


def client_id_of(client_id: str, env: int, num_envs: int) -> str:
    """The id an env of a stream is logged under: the client's, plus its index if several."""
    return client_id if num_envs == 1 else f"{client_id}/{env}"


class RateLimitedLog:
    """Warnings about refused peers: at most ``burst`` lines per ``period_s``, then a count,
    so that a flood of bad connections cannot flood the log."""

    def __init__(self, burst: int = 20, period_s: float = 10.0):
        self.burst, self.period_s = burst, period_s
        self.lock = threading.Lock()
        self.window_start = time.monotonic()
        self.logged = self.suppressed = 0

    def warning(self, message: str, *args) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.window_start >= self.period_s:
                if self.suppressed:
                    log.warning(
                        "%d more refused streams in the last %.0f s were not logged.",
                        self.suppressed,
                        now - self.window_start,
                    )
                self.window_start, self.logged, self.suppressed = now, 0, 0
            if self.logged >= self.burst:
                self.suppressed += 1
                return
            self.logged += 1
        log.warning(message, *args)


class LearnerServicer(pb_grpc.LearnerServicer):
    """Inverted mode: env clients dial the learner."""

    def __init__(self, pool: PolyActorPool):
        self.pool = pool
        self.refusals = RateLimitedLog()

    def ConnectEnv(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        try:
            yield from self.pool.serve_env(request_iterator, context.cancel)
        except grpc.RpcError:
            log.info("An env client at %s disconnected.", context.peer())
        except StreamClosed as error:
            self.refusals.warning("Closed a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.ABORTED, str(error))
        except codec.ProtocolError as error:
            self.refusals.warning("Closing a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except SpecMismatch as error:
            self.refusals.warning("Refused a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except OverBudget as error:
            self.refusals.warning("Refused a stream from %s: %s", context.peer(), error)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        except Closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the learner is stopping")
        except Exception as error:  # not the client's fault: say so, keep the traceback here
            log.exception("Serving a stream from %s failed.", context.peer())
            context.abort(grpc.StatusCode.INTERNAL, f"the learner failed: {error!r}")


def add_learner_servicer(server: grpc.Server, servicer: LearnerServicer) -> None:
    """Registers ``servicer`` with a deserializer that lets the stream refuse (and log) a
    message protobuf cannot parse; gRPC's own would close the stream without a word."""
    handlers = {
        "ConnectEnv": grpc.stream_stream_rpc_method_handler(
            servicer.ConnectEnv,
            request_deserializer=codec.parse_env_message,
            response_serializer=pb.Action.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("torchbeast.polybeast.Learner", handlers),)
    )
    server.add_registered_method_handlers("torchbeast.polybeast.Learner", handlers)

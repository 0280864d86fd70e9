"""The learner's end of PolyBeast's env streams: env streams in, batched inference,
rollouts out; the ``Pool`` the shared ``Trainer`` takes batches from.

    env stream (one thread each)          learner
    ----------------------------          -------
    Hello -> spec checked                 StreamInference: one forward pass for all
    Step  -> written into its rollout       streams waiting, on the learner's device
    ask for an action              <--->  RolloutQueue (bounded): learner threads
    every T steps: rollout -> queue         stack B rollouts to [T+1, B, ...]

Classic mode dials ``num_actors`` streams over the env servers' addresses (``dialling``).
Inverted mode (``--serve ADDRESS``) serves any number of env clients up to
``--max_clients`` (``learner_servicer``). The jobs beside this one: the run's env spec
(``run_spec``), what a stream may cost (``stream_limits``), batched inference
(``inference``), rollout assembly (``stream_rollouts``), ``episodes.csv``
(``episodes_log``). A peer can cost only its own stream: rows of a batched inference
that come out non-finite close the streams they came from, and rollouts that make the
loss non-finite close theirs (see ``Trainer``).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.queues import SimpleQueue

import grpc
from torch import nn

from torchbeast.config.settings import Settings
from torchbeast.core.learner import NonFiniteLossError
from torchbeast.core.rollout import rollout_bytes
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec, env_side, network
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly.dialling import Unreachable, dial
from torchbeast.runtime.poly.episodes_log import EpisodeLog
from torchbeast.runtime.poly.inference import StreamInference
from torchbeast.runtime.poly.learner_servicer import LearnerServicer, add_learner_servicer
from torchbeast.runtime.poly.run_spec import RunSpec
from torchbeast.runtime.poly.stream_limits import (
    HELLO_TIMEOUT_S,
    OverBudget,
    StreamMemory,
    StreamWatch,
)
from torchbeast.runtime.poly.stream_rollouts import Rollout, StreamRollouts
from torchbeast.runtime.pool import Pool
from torchbeast.runtime.processes import process_cpu_seconds
from torchbeast.runtime.queues import Batch, Closed, RolloutQueue, stack_rollouts
from torchbeast.runtime.training import TrainingError

log = logging.getLogger("torchbeast")

NO_ENVS_NOTICE_S = 5.0
MAX_CLOSED_STREAM_NAMES = 10_000  # client ids kept for naming the sources of old rollouts


class PolyActorPool(Pool):
    """Env streams on one side, the learner's ``get_batch`` on the other."""

    drops_bad_batches = True  # see Trainer.drop_batch: peers' data must not stop the run

    def __init__(
        self,
        settings: Settings,
        env_processes: list | None = None,
        spec: EnvSpec | None = None,
        env_failures: SimpleQueue | None = None,
        env_options: dict[str, object] | None = None,
        replacements: env_side.Replacements | None = None,
    ):
        """``env_processes``: the env processes this command started, watched for exits;
        ``replacements``: replaces those of them a signal kills;
        ``env_failures``: where their error lines come (``env_side.process_main``);
        ``env_options``: the env family flags the run's environments were made with, if
        known (a resumed run's), as ``spec``.
        ``spec``: the environment the run trains on, if the learner knows it; otherwise the
        first Hello decides it."""
        self.poly = poly = settings.runtime
        self.num_actors = settings.actors.num_actors
        self.envs_per_stream = settings.actors.envs_per_actor  # as the batch was sized
        self.envs_warned: set[int] = set()  # other stream sizes already warned of
        self.batch_size = settings.learner.batch_size
        self.unroll_length = settings.learner.unroll_length
        self.env_processes = env_processes or []
        self.owns_envs = bool(self.env_processes)
        self.has_served = threading.Event()
        self.env_failures = env_failures
        self.replacements = replacements
        self.env_watcher: threading.Thread | None = None
        self.run_spec = RunSpec(spec, env_options, settings.model)
        self.model_ready = threading.Event()
        super().__init__()
        # Stopping the pool closes the queue: learner threads waiting on it are let go.
        self.queue: RolloutQueue[Rollout] = RolloutQueue(poly.max_learner_queue_size, self.stopping)
        self.memory = StreamMemory(poly.stream_memory_mb)
        self.watch = StreamWatch(
            self.stopping, HELLO_TIMEOUT_S if poly.serve else None, poly.stream_timeout_s
        )
        self.lock = threading.Lock()
        self.connected: collections.Counter[str] = collections.Counter()  # streams per id
        # serial -> client id, also of closed streams whose rollouts may still be queued.
        self.client_ids: collections.OrderedDict[int, str] = collections.OrderedDict()
        self.last_connected = time.monotonic()
        self.server: grpc.Server | None = None
        self.port: int | None = None
        self.threads: list[threading.Thread] = []
        self.channels: list[grpc.Channel] = []
        self.inference: StreamInference | None = None
        self.episodes: EpisodeLog | None = None
        self.rollouts: StreamRollouts | None = None

    @property
    def spec(self) -> EnvSpec | None:
        return self.run_spec.spec

    def inference_batch_sizes(self) -> dict[int, int]:
        """Streams per forward pass of the inference batcher -> passes."""
        return {} if self.inference is None else dict(self.inference.batcher.batch_sizes)

    def stage_totals(self) -> dict[str, float]:
        """The env processes this command started: their CPU seconds (envs and gRPC)."""
        return {"env servers": process_cpu_seconds([p.pid for p in self.env_processes])}

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
            self.env_watcher = threading.Thread(target=self._watch_env_processes, daemon=True)
            self.env_watcher.start()
        self.watch.start()
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
            addresses = self._dialled()
            metadata = network.call_metadata(poly.network)
            unreachable = Unreachable()
            for index in range(self.num_actors):
                address = addresses[index % len(addresses)]
                channel = network.create_channel(poly.network, address)
                self.channels.append(channel)
                thread = threading.Thread(
                    target=dial,
                    args=(self, address, channel, metadata, unreachable),
                    name=f"dial-{index}",
                    daemon=True,
                )
                self.threads.append(thread)
                thread.start()
            log.info("Dialling %d env streams over %s.", self.num_actors, ", ".join(addresses))

    def wait_for_spec(self) -> EnvSpec:
        """Blocks until the first environment says what it is."""
        if not self.run_spec.known.wait(2.0):
            log.info("Waiting for the first environment to connect (%s).", self._where())
        while not self.run_spec.known.wait(0.2):
            if self.stopping.is_set():
                raise TrainingError(self.error or "stopped before any environment connected")
        assert self.spec is not None
        return self.spec

    def attach(self, model: nn.Module, config: dict, run_dir: str) -> None:
        """Lets streams act with a copy of ``model`` on its device."""
        assert self.spec is not None
        self.inference = StreamInference(model, config, self.spec, self.poly)
        self.episodes = EpisodeLog(os.path.join(run_dir, "episodes.csv"))
        self.rollouts = StreamRollouts(
            self.unroll_length,
            self.inference,
            self.episodes,
            self.queue,
            self.memory,
            self.stopping,
        )
        self.model_ready.set()
        self.monitor = threading.Thread(target=self._watch_connections, daemon=True)
        self.monitor.start()

    def start(self) -> None:
        """Nothing to do: streams started in ``listen`` and act once ``attach`` ran."""

    def stop(self) -> None:
        self.stopping.set()
        if self.env_watcher is not None:  # no replacement env process after this
            self.env_watcher.join(timeout=10.0)
        self.queue.close()
        if self.inference is not None:
            self.inference.close()
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
        if self.inference is not None:
            self.inference.publish(model)

    # ------------------------------------------------------------------ learner side

    def get_batch(self) -> Batch | None:
        """B rollouts stacked to [T+1, B, ...] (with "mask"), their initial core states
        and the (stream, env) each came from."""
        items = self.queue.get_batch(self.batch_size)
        return None if items is None else stack_rollouts(items)

    def close_streams(self, serials: set[int], reason: str) -> list[str]:
        """Closes the open streams among ``serials``; their partial rollouts are dropped.
        Returns the client ids of the ones closed."""
        return self.watch.close(serials, reason)

    def describe_sources(self, sources: list[tuple[int, int]]) -> str:
        """The client ids (with env index) that rollouts with these sources came from."""
        with self.lock:
            names = {
                f"{self.client_ids.get(serial, f'stream {serial}')}/{env}"
                for serial, env in sources
            }
        return ", ".join(sorted(names))

    # ------------------------------------------------------------------ streams

    def _check_stream_size(self, client_id: str, num_envs: int) -> None:
        """Warns, once per size, of a stream whose envs are not the --envs_per_actor the
        learner's batch and rate were sized for (a polybeast_env --envs_per_stream that
        the learner was not told)."""
        with self.lock:
            if num_envs == self.envs_per_stream or num_envs in self.envs_warned:
                return
            self.envs_warned.add(num_envs)
        log.warning(
            "Env stream %s steps %d envs, not the %d the learner's batch was sized for: "
            "give the learner --envs_per_actor %d (the env side's --envs_per_stream).",
            client_id,
            num_envs,
            self.envs_per_stream,
            num_envs,
        )

    def serve_env(
        self, incoming: Iterator[pb.EnvMessage], cancel: Callable[[], object]
    ) -> Iterator[pb.Action]:
        """Runs one env stream: reads Steps, yields Actions, queues rollouts.

        ``cancel`` ends the stream's RPC (the watchdog's way to close it)."""
        stream = self.watch.open(cancel)
        said_hello = False
        try:
            messages = self.watch.messages(incoming, stream)
            first = next(messages, None)
            if first is not None:
                client_id, spec, num_envs, env_options = codec.read_hello(first)
                self.run_spec.register(client_id, spec, env_options)
                said_hello = True
        finally:
            if not said_hello:  # refused, or closed before its Hello: the watch lets go
                self.watch.forget(stream)
        if not said_hello:
            return
        stream.client_id = client_id
        with self.lock:
            self.connected[client_id] += 1
            self.client_ids[stream.serial] = client_id
            while len(self.client_ids) > MAX_CLOSED_STREAM_NAMES:
                self.client_ids.popitem(last=False)
        log.info("Env stream %s connected (%d envs).", client_id, num_envs)
        self._check_stream_size(client_id, num_envs)
        try:
            while not self.model_ready.wait(0.2):
                if self.stopping.is_set():
                    return
            yield from self.rollouts.act(messages, stream, spec, num_envs)
        except (grpc.RpcError, codec.ProtocolError, Closed, OverBudget):
            raise  # the stream's own end; the caller closes it with the right status
        except NonFiniteLossError as error:  # the learner's weights broke: one line, stop
            with self.lock:
                self.fail(f"stopped: {error}")
            raise Closed("the learner is stopping") from None
        except Exception as error:  # a learner-side failure (e.g. in inference): stop the run
            with self.lock:
                first = self.error is None
                self.fail(f"serving env stream {client_id} failed: {error!r} (see out.log)")
            if first:  # every stream of the batch sees the same error: say it once
                log.exception("Serving env stream %s failed.", client_id)
            raise Closed("the learner is stopping") from None
        finally:
            self.watch.forget(stream)
            with self.lock:
                self.connected[client_id] -= 1
                if self.connected[client_id] <= 0:
                    del self.connected[client_id]
                self.last_connected = time.monotonic()

    def _dialled(self) -> list[str]:
        """The env servers' addresses the streams are dialled over, round robin."""
        return self.poly.network.server_addresses()[: self.num_actors]

    def _where(self) -> str:
        if self.poly.serve:
            return self.poly.serve
        # A server that speaks TLS never answers a plain dial: nothing else would say why.
        dialled = self._dialled()
        over_tcp = any(not address.startswith("unix") for address in dialled)
        plain = over_tcp and not self.poly.network.tls_ca
        return ", ".join(dialled) + ("; one that serves TLS needs --tls_ca here" if plain else "")

    def _stream_size_text(self) -> str:
        if self.spec is None:
            return ""
        per_env = rollout_bytes(self.spec, self.unroll_length)
        return f"; each env of a stream takes {per_env / 2**20:.2f} MiB"

    def _watch_env_processes(self) -> None:
        """Stops the run with one line once every env process this command started died."""
        while not self.stopping.wait(1.0):
            if self.replacements and (failure := self.replacements.replace_killed(self.stopping)):
                self.fail(failure)
                return
            codes = [process.exitcode for process in self.env_processes]
            if all(code is not None for code in codes):
                failures = self.env_failures
                if failures is not None and not failures.empty():
                    self.fail(
                        f"every env process this command started has exited: {failures.get()}"
                    )
                else:
                    self.fail(
                        f"every env process this command started has exited (exit codes "
                        f"{codes}); their errors are in the output above"
                    )

    def _watch_connections(self) -> None:
        """Says once when no environment is left, instead of waiting silently."""
        said = False
        while not self.stopping.wait(1.0):
            with self.lock:
                empty = not self.connected
                since = time.monotonic() - self.last_connected
            if empty and since > NO_ENVS_NOTICE_S and not said:
                log.warning("No environments connected; waiting for them (%s).", self._where())
                said = True
            elif not empty:
                said = False

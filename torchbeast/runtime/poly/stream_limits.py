"""What one env stream may cost the learner: memory for its rollout buffers, out of a
learner-wide budget (``--stream_memory_mb``), and time: a watchdog closes a stream whose
peer sends no Hello within ``HELLO_TIMEOUT_S`` (inverted mode) or no Step for
``--stream_timeout_s``. The learner's own waits (inference, a full queue) do not count.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb

HELLO_TIMEOUT_S = 10.0  # inverted mode: a client must say what it is this soon
WATCH_INTERVAL_S = 0.5


class OverBudget(RuntimeError):
    """A stream's buffers would exceed the learner's memory budget for streams."""


class BeyondBudget(OverBudget):
    """A stream's buffers would exceed the whole budget: waiting cannot help."""


class StreamClosed(codec.ProtocolError):
    """The learner closed a stream: it was idle, or its data cannot be learned from."""


@dataclass
class Stream:
    """One env stream, as the watchdog sees it."""

    serial: int  # a replay source per stream and env
    cancel: Callable[[], object]  # ends the RPC; the stream's thread sees an RpcError
    client_id: str = "?"
    deadline: float | None = None  # while waiting for the peer: when it is too late
    waiting_for: str = ""
    closed_because: str | None = None
    discard: bool = False  # closed for bad data: its partial rollout is not learned from


class StreamMemory:
    """The memory all streams' rollout buffers may take together."""

    def __init__(self, budget_mb: int):
        self.budget = budget_mb << 20
        self.used = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def reserved(self, client_id: str, size: int) -> Iterator[None]:
        """``size`` bytes for ``client_id``'s stream while in the block; ``OverBudget``
        if the budget has not that much left."""
        if size > self.budget:
            raise BeyondBudget(
                f"{client_id}'s stream needs {size / 2**20:.1f} MiB for its rollout buffers, "
                f"more than the learner's memory for all env streams ({self.budget >> 20} MiB): "
                "give the learner a larger --stream_memory_mb, or the stream fewer envs "
                "(--envs_per_stream) or a shorter --unroll_length"
            )
        with self.lock:
            if self.used + size > self.budget:
                raise OverBudget(
                    f"the learner's memory for env streams is spent ({self.used >> 20} "
                    f"of {self.budget >> 20} MiB, --stream_memory_mb); "
                    f"{client_id} needs {size / 2**20:.1f} MiB"
                )
            self.used += size
        try:
            yield
        finally:
            with self.lock:
                self.used -= size


class StreamWatch:
    """The open streams, and the watchdog that closes those kept waiting by their peer."""

    def __init__(
        self, stopping: threading.Event, hello_timeout_s: float | None, step_timeout_s: float
    ):
        """``hello_timeout_s``: None where the learner dials (classic mode), as waiting for
        a server that is not up (yet) is how that mode works."""
        self.stopping = stopping
        self.hello_timeout_s = hello_timeout_s
        self.step_timeout_s = step_timeout_s
        self.lock = threading.Lock()
        self.serials = itertools.count()
        self.streams: dict[int, Stream] = {}  # open streams, by serial

    def start(self) -> None:
        threading.Thread(target=self._watch, name="stream-watchdog", daemon=True).start()

    def open(self, cancel: Callable[[], object]) -> Stream:
        """A new stream, watched until ``forget``; ``cancel`` ends its RPC."""
        stream = Stream(next(self.serials), cancel)
        with self.lock:
            self.streams[stream.serial] = stream
        return stream

    def forget(self, stream: Stream) -> None:
        with self.lock:
            del self.streams[stream.serial]

    def messages(
        self, incoming: Iterator[pb.EnvMessage], stream: Stream
    ) -> Iterator[pb.EnvMessage]:
        """The stream's messages; the watchdog cancels a peer that keeps it waiting too long.

        Only waits for the peer count: not the learner's own (inference, a full queue)."""
        timeout = self.hello_timeout_s
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
            timeout = self.step_timeout_s
            waiting_for = f"sent no Step for {timeout:.0f} s (--stream_timeout_s)"

    def close(self, serials: set[int], reason: str) -> list[str]:
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

    def _watch(self) -> None:
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

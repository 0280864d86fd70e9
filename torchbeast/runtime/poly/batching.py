"""Batched inference for many env streams: stream threads each ask for one inference;
worker threads run one forward pass for whatever requests are waiting (up to
``max_batch_size``, waiting at most ``timeout_s`` for more) and hand every caller its own
slice back. (Finished rollouts meet the learner in ``runtime.queues.RolloutQueue``.)
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from torchbeast.runtime.queues import Closed

In = TypeVar("In")
Out = TypeVar("Out")


class Failed:
    """A result that fails only its own request: ``compute`` returns it in that place."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class _Request(Generic[In, Out]):
    __slots__ = ("payload", "done", "result", "error")

    def __init__(self, payload: In):
        self.payload = payload
        self.done = threading.Event()
        self.result: Out | None = None
        self.error: BaseException | None = None


class DynamicBatcher(Generic[In, Out]):
    """Calls ``compute(list of payloads) -> list of results`` on batches of requests.

    An exception raised by ``compute`` reaches every caller of that batch; a ``Failed``
    result raises its error for its own caller only.
    """

    def __init__(
        self,
        compute: Callable[[list[In]], Sequence[Out]],
        max_batch_size: int,
        timeout_s: float,
        num_threads: int = 1,
    ):
        self.compute_batch = compute
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.pending: collections.deque[_Request[In, Out]] = collections.deque()
        self.condition = threading.Condition()
        self.closed = False
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self.threads = [
            threading.Thread(target=self._work, name=f"inference-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self.threads:
            thread.start()

    def compute(self, payload: In) -> Out:
        """Blocks until the batch holding ``payload`` has been computed."""
        request: _Request[In, Out] = _Request(payload)
        with self.condition:
            if self.closed:
                raise Closed("the inference batcher is closed")
            self.pending.append(request)
            self.condition.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        if isinstance(request.result, Failed):
            raise request.result.error
        return request.result  # type: ignore[return-value]

    def close(self) -> None:
        """Fails the requests still waiting and stops the workers."""
        with self.condition:
            self.closed = True
            waiting = list(self.pending)
            self.pending.clear()
            self.condition.notify_all()
        for request in waiting:
            request.error = Closed("the inference batcher is closed")
            request.done.set()
        for thread in self.threads:
            thread.join()

    def _next_batch(self) -> list[_Request[In, Out]] | None:
        with self.condition:
            while not self.pending and not self.closed:
                self.condition.wait()
            if self.closed:
                return None
            deadline = time.monotonic() + self.timeout_s
            while len(self.pending) < self.max_batch_size and not self.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.condition.wait(remaining)
            count = min(len(self.pending), self.max_batch_size)
            return [self.pending.popleft() for _ in range(count)]

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            if not batch:
                continue  # another worker took them
            self.batch_sizes[len(batch)] += 1
            try:
                results = self.compute_batch([request.payload for request in batch])
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"inference returned {len(results)} results for {len(batch)} requests"
                    )
            except BaseException as error:
                for request in batch:
                    request.error = error
            else:
                for request, result in zip(batch, results, strict=True):
                    request.result = result
            for request in batch:
                request.done.set()

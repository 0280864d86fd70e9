"""Where rollouts that arrive on their own threads (PolyBeast's env streams, RayBeast's
actor results) meet the learner: a bounded queue (a full queue makes producers wait,
backpressure up to the environments) that learner threads take B items at a time from.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Generic, TypeVar

import torch

from torchbeast.core.rollout import stack_columns, stack_core_states
from torchbeast.runtime.batches import Arrivals, Source

In = TypeVar("In")

POLL_S = 0.1


class Closed(RuntimeError):
    """A queue or batcher was closed while a caller waited on it."""


class RolloutQueue(Generic[In]):
    """A bounded queue that learner threads drain ``batch_size`` items at a time.

    With ``per_env`` (``batches.per_env_share``), a batch takes each env's items at most
    that many times while other envs' items can still come, and the oldest items whatever
    their env once the queue is full (its producers then wait for the learner): see
    ``batches``. Without, batches take items in arrival order."""

    def __init__(
        self, maxsize: int, closed: threading.Event | None = None, per_env: int | None = None
    ):
        """``closed``: an event that closes the queue when set (default: its own)."""
        self.maxsize = maxsize
        self.waiting: Arrivals[In] = Arrivals(per_env)
        self.changed = threading.Condition()  # an item came, or a batch made room
        self.batch_lock = threading.Lock()  # one learner thread assembles a batch at a time
        self.closed = closed or threading.Event()

    def put(self, item: In, source: Source = None) -> None:
        """Queues ``item`` from env ``source``; waits while the queue is full, and raises
        ``Closed`` if it closes meanwhile."""
        with self.changed:
            while not self.closed.is_set():
                if len(self.waiting) < self.maxsize:
                    self.waiting.add(item, source)
                    self.changed.notify_all()
                    return
                self.changed.wait(POLL_S)
        raise Closed("the learner queue is closed")

    def get_batch(self, batch_size: int) -> list[In] | None:
        """``batch_size`` items, each env's in arrival order, or None once closed."""
        with self.batch_lock, self.changed:
            batch: list[In] = []
            sources: list[Source] = []
            while len(batch) < batch_size:
                if self.closed.is_set():
                    return None
                taken = self.waiting.take(batch, sources, batch_size)
                if len(batch) < batch_size and len(self.waiting) >= self.maxsize:
                    taken += self.waiting.take(batch, sources, batch_size, any_env=True)
                if taken:
                    self.changed.notify_all()  # room for the producers
                if len(batch) < batch_size:
                    self.changed.wait(POLL_S)
            return batch

    def qsize(self) -> int:
        with self.changed:
            return len(self.waiting)

    def close(self) -> None:
        self.closed.set()


Batch = tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...], list[tuple[int, int]]]


def stack_rollouts(items: Sequence[tuple]) -> Batch:
    """Queued (rollout [T+1, ...], core state [layers, 1, H], source) items as the learner
    takes them: the rollouts stacked to [T+1, B, ...], their core states [layers, B, H], and
    the (stream or actor, env) each came from."""
    return (
        stack_columns([item[0] for item in items]),
        stack_core_states([item[1] for item in items]),
        [item[2] for item in items],
    )

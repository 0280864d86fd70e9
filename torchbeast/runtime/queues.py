"""Where rollouts that arrive on their own threads (PolyBeast's env streams, RayBeast's
actor results) meet the learner: a bounded queue (a full queue makes producers wait,
backpressure up to the environments) that learner threads take B items at a time from.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Generic, TypeVar

import torch

from torchbeast.core.rollout import stack_columns, stack_core_states

In = TypeVar("In")

POLL_S = 0.1


class Closed(RuntimeError):
    """A queue or batcher was closed while a caller waited on it."""


class RolloutQueue(Generic[In]):
    """A bounded queue that learner threads drain ``batch_size`` items at a time."""

    def __init__(self, maxsize: int, closed: threading.Event | None = None):
        """``closed``: an event that closes the queue when set (default: its own)."""
        self.items: queue.Queue[In] = queue.Queue(maxsize)
        self.batch_lock = threading.Lock()  # one learner thread assembles a batch at a time
        self.closed = closed or threading.Event()

    def put(self, item: In) -> None:
        """Waits while the queue is full; raises ``Closed`` if it closes meanwhile."""
        while not self.closed.is_set():
            try:
                self.items.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue
        raise Closed("the learner queue is closed")

    def get_batch(self, batch_size: int) -> list[In] | None:
        """``batch_size`` items in arrival order, or None once closed."""
        with self.batch_lock:
            batch: list[In] = []
            while len(batch) < batch_size:
                if self.closed.is_set():
                    return None
                try:
                    batch.append(self.items.get(timeout=POLL_S))
                except queue.Empty:
                    continue
            return batch

    def qsize(self) -> int:
        return self.items.qsize()

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

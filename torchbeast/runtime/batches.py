"""Which waiting rollouts the learner's next batch takes, in every runtime whose actors
deliver several envs' rollouts at once (MonoBeast's slots, RayBeast's queue).

An actor delivers one rollout of each of its envs at once. When it runs ahead of the others
(niced beside a busy learner, or stepping a faster game), it can deliver its next rollout
before they deliver theirs. A batch that took rollouts in arrival order alone would then
hold that actor's envs twice and the others' not at all: half the envs, steps more alike,
and an older half further off-policy. On 2 cores with a bf16 learner, 12-17% of MonoBeast's
Pong batches and 37% of RayBeast's were such batches (``scripts/batch_mix.py``).

So a batch takes each env's rollout at most ⌈B / envs⌉ times. A later rollout of an env
it already holds that often stays, in arrival order, for the next batch, unless nothing
else can come (every producer waits for the learner to take rollouts): then the batch takes
it, so that actors and learner never wait on each other forever. Each env's rollouts still
leave in the order they came, which LASER's replay relies on.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Source = Hashable  # the env a rollout came from: (actor or stream, env)


def per_env_share(batch_size: int, num_envs: int) -> int:
    """⌈B / envs⌉: the most rollouts of one env a batch needs while all of them come."""
    return -(-batch_size // num_envs)


class Arrivals(Generic[Item]):
    """Waiting items (rollouts, or the slots that hold them) in arrival order, each with the
    env it came from; taken into batches that hold each env at most ``per_env`` times
    (None: in arrival order alone)."""

    def __init__(self, per_env: int | None):
        self.per_env = per_env
        self.items: collections.deque[tuple[Item, Source]] = collections.deque()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Item, source: Source) -> None:
        self.items.append((item, source))

    def take(
        self, batch: list[Item], sources: list[Source], batch_size: int, any_env: bool = False
    ) -> int:
        """Moves the oldest items that the batch (``batch`` and their ``sources``) may take
        into it, until it holds ``batch_size``; with ``any_env``, whatever their env.
        Returns how many it moved."""
        held = collections.Counter(sources)
        kept: collections.deque[tuple[Item, Source]] = collections.deque()
        taken = 0
        while self.items and len(batch) < batch_size:
            item, source = self.items.popleft()
            if any_env or self.per_env is None or held[source] < self.per_env:
                batch.append(item)
                sources.append(source)
                held[source] += 1
                taken += 1
            else:
                kept.append((item, source))
        kept.extend(self.items)
        self.items = kept
        return taken

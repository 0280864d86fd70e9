"""Which full buffer slots MonoBeast's next batch takes.

An actor delivers one rollout of each of its envs at once. When it runs ahead of the others
(niced beside a busy learner, or stepping a faster game), it can deliver its next rollout
before they deliver theirs. A batch that took slots in arrival order alone would then hold
that actor's envs twice and the others' not at all: half the envs, steps more alike, and
an older half further off-policy. On 2 cores beside a bf16 learner, 12-17% of Pong's
batches were such batches (``scripts/batch_mix.py``).

So a batch takes each env's rollout at most ⌈B / envs⌉ times. A later rollout of an env
it already holds that often stays, in arrival order, for the next batch, unless nothing
else can come (no actor holds slots to fill): then the batch takes it, so that actors and
learner never wait on each other forever.
"""

from __future__ import annotations

import collections

Source = tuple[int, int]  # (actor, env) that filled a slot


class FullSlots:
    """Full slots in arrival order, taken into batches of ``batch_size`` that hold each of
    the run's ``num_envs`` envs at most ``per_env`` times."""

    def __init__(self, batch_size: int, num_envs: int):
        self.batch_size = batch_size
        self.per_env = -(-batch_size // num_envs)  # ⌈B / envs⌉
        self.slots: collections.deque[tuple[int, Source]] = collections.deque()

    def __len__(self) -> int:
        return len(self.slots)

    def add(self, slot: int, source: Source) -> None:
        self.slots.append((slot, source))

    def take(self, slots: list[int], sources: list[Source], any_env: bool = False) -> None:
        """Moves the oldest slots that the batch (``slots`` and their ``sources``) may take
        into it, until it holds ``batch_size``; with ``any_env``, regardless of their env."""
        held = collections.Counter(sources)
        kept: collections.deque[tuple[int, Source]] = collections.deque()
        while self.slots and len(slots) < self.batch_size:
            slot, source = self.slots.popleft()
            if any_env or held[source] < self.per_env:
                slots.append(slot)
                sources.append(source)
                held[source] += 1
            else:
                kept.append((slot, source))
        kept.extend(self.slots)
        self.slots = kept

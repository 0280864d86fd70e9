"""LASER's shared experience replay (Schmitt, Hessel & Simonyan, 2019).

Every actor's rollouts go into one replay shared by all actors and learner threads. Whole
trajectories are kept: each env stream (a *source*) forms a *chain* of segments, one per
rollout, and each step is stored once: a rollout's index 0 repeats the previous rollout's
index T, so a segment that continues its chain stores only its new steps (its *transitions*)
and takes its index 0 from the segment before it. The first segment of a chain also stores
its index 0, as the chain's *head*.

When the replay is full it forgets the oldest *episode* (FIFO by episode): the chain holding
the oldest transition loses its steps up to and including the step that ends that episode.
Replayed columns are segments drawn uniformly at random and rebuilt exactly as the learner
saw them online, ``[T+1]`` steps with the overlap step first, zero-padded and masked when
the segment is shorter than T.

With an LSTM this is stale-state replay: a replayed sequence starts from the core state
stored with its rollout, computed by the older policy that acted, not recomputed by the
current one. A segment whose start was evicted begins at an episode start, where the model
resets its state anyway, so it replays from zeros.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

# A step's identity, checked before a rollout is stitched to its source's chain.
IDENTITY_KEYS = ("frame", "episode_step")


FILE_BYTES_PER_TENSOR = 320  # torch.save's own bytes for each tensor of a file, and some


@dataclass(eq=False)
class _Segment:
    """One rollout of one source: its new steps and the core state the rollout started from.

    Index 0 of the column comes from ``head`` (a chain's first segment, or one whose start
    was evicted) or else from the last step of ``previous``.
    """

    source: Hashable
    steps: dict[str, torch.Tensor]  # [n, ...] the transitions, n >= 1
    core_state: tuple[torch.Tensor, ...]  # each [layers, 1, H]
    head: dict[str, torch.Tensor] | None = None  # [1, ...]
    previous: _Segment | None = None
    next: _Segment | None = None

    def __len__(self) -> int:
        return self.steps["done"].shape[0]

    def first_step(self) -> dict[str, torch.Tensor]:
        """The step before the first transition (the column's index 0), [1, ...]."""
        if self.head is not None:
            return self.head
        return {key: tensor[-1:] for key, tensor in self.previous.steps.items()}


class Replay:
    """A FIFO-by-episode replay of rollouts shared by all actors; see the module docstring.

    ``capacity`` is the most transitions (new steps; overlap steps do not count) it holds;
    ``sample`` returns None until ``min(learn_start, capacity)`` transitions are stored.
    Thread-safe: ``add`` and ``sample`` may be called from several threads.
    """

    def __init__(self, capacity: int, learn_start: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be at least 1, got {capacity}")
        if learn_start < 0:
            raise ValueError(f"learn_start must not be negative, got {learn_start}")
        self.capacity = capacity
        self.learn_start = min(learn_start, capacity)
        self.episodes_evicted = 0  # evictions, each an episode or the stored part of one
        self._transitions = 0
        self._segments: list[_Segment] = []  # live segments, oldest first
        self._tails: dict[Hashable, _Segment] = {}  # source -> its open chain's last segment
        self._layout: dict[str, tuple[torch.Size, torch.dtype]] | None = None  # key -> step
        self._unroll_length = 0
        self._lock = threading.Lock()

    @property
    def transitions(self) -> int:
        """Number of stored transitions."""
        return self._transitions

    @property
    def stored_steps(self) -> int:
        """Number of steps held in memory: transitions plus heads, counted from the tensors."""
        with self._lock:
            return sum(
                len(segment) + (0 if segment.head is None else segment.head["done"].shape[0])
                for segment in self._segments
            )

    def add(
        self,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        sources: Sequence[Hashable],
    ) -> None:
        """Stores the real new steps of each column of ``batch``.

        ``batch``: CPU tensors [T+1, B, ...] holding at least "frame" and "done", optionally
        "mask" (bool [T+1, B], a prefix of real steps per column). ``core_state``: tensors
        [layers, B, H], the state each rollout started from. ``sources``: B ids, the env
        stream of each column.
        """
        with self._lock:
            self._check_layout(batch, sources)
            mask = batch.get("mask")  # [T+1, B] or None
            for column, source in enumerate(sources):
                length = self._unroll_length
                if mask is not None:
                    length = self._real_new_steps(mask[:, column], column)
                self._add_column(batch, core_state, column, source, length)
            while self._transitions > self.capacity:
                self._evict_oldest_episode()

    def sample(
        self, count: int, generator: torch.Generator | None = None
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]] | None:
        """``count`` segments drawn uniformly with replacement, or None before learn_start.

        Returns the batch, [T+1, count, ...] with "mask" (bool [T+1, count]), and the core
        state, each [layers, count, H].
        """
        if count < 1:
            raise ValueError(f"sample count must be at least 1, got {count}")
        with self._lock:
            if not self._segments or self._transitions < self.learn_start:
                return None
            indices = torch.randint(len(self._segments), (count,), generator=generator)
            return self._columns([self._segments[index] for index in indices.tolist()])

    def mix_into(
        self, batch: dict[str, torch.Tensor], core_state: tuple[torch.Tensor, ...], ratio: int
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        """An online batch [T+1, B, ...] with B * ``ratio`` replayed rollouts appended after
        its B columns (and a "mask"), as ``Learner.learn`` takes it; the batch as it is
        before learn_start."""
        num_online = batch["reward"].shape[1]
        replayed = self.sample(num_online * ratio)
        if replayed is None:  # fewer than learn_start transitions so far
            return batch, core_state
        replayed_batch, replayed_core_state = replayed
        if "mask" not in batch:
            batch = batch | {"mask": torch.ones(batch["reward"].shape, dtype=torch.bool)}
        batch = {key: torch.cat([batch[key], replayed_batch[key]], dim=1) for key in batch}
        core_state = tuple(
            torch.cat([online, old], dim=1)
            for online, old in zip(core_state, replayed_core_state, strict=True)
        )
        return batch, core_state

    def contents(self) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]] | None:
        """Every stored segment as a column, oldest first (for inspection), or None if empty."""
        with self._lock:
            if not self._segments:
                return None
            return self._columns(self._segments)

    def bytes_per_transition(self) -> int:
        """The memory one stored step takes (0 before the first rollout)."""
        return sum(shape.numel() * dtype.itemsize for shape, dtype in (self._layout or {}).values())

    def file_bytes_per_transition(self) -> int:
        """What one stored step takes in a saved file (``state_dict``), at most: its own
        bytes, and torch.save's bytes for each tensor (~260, measured) of its segment (its
        steps, an LSTM state, and the first step of its chain) spread over the segment's
        steps. For small observations these are most of the file (CartPole's took 9 times
        its estimate once; later, with a column more, 1.007 times, where half the kept
        segments began a saved chain and so carried a first step)."""
        columns = len(self._layout or {})
        tensors_per_segment = 2 * columns + 2  # steps, a chain's first step, an LSTM state
        overhead = FILE_BYTES_PER_TENSOR * tensors_per_segment // max(1, self._unroll_length)
        return self.bytes_per_transition() + overhead

    def state_dict(self, max_transitions: int) -> dict:
        """The newest segments, up to ``max_transitions`` transitions, as plain values and
        tensors (for a file beside the checkpoint); oldest first, each naming the saved
        segment it continues. Stored tensors are never changed in place, so only taking
        the references needs the lock."""
        with self._lock:
            kept: list[_Segment] = []
            total = 0
            for segment in reversed(self._segments):
                if total + len(segment) > max_transitions:
                    break
                kept.append(segment)
                total += len(segment)
            kept.reverse()
            index = {id(segment): position for position, segment in enumerate(kept)}
            segments = []
            for segment in kept:
                previous = index.get(id(segment.previous), -1)
                head = segment.head
                if head is None and previous < 0:  # its chain's start is not saved
                    head = {key: tensor.clone() for key, tensor in segment.first_step().items()}
                segments.append(
                    {
                        "steps": segment.steps,
                        "core_state": list(segment.core_state),
                        "head": head,
                        "previous": previous,
                    }
                )
            return {
                "unroll_length": self._unroll_length,
                "layout": {
                    key: (list(shape), str(dtype).removeprefix("torch."))
                    for key, (shape, dtype) in (self._layout or {}).items()
                },
                "segments": segments,
            }

    def load_state_dict(
        self,
        state: dict,
        layout: dict[str, tuple[torch.Size, torch.dtype]],
        unroll_length: int,
        core_state_shapes: Sequence[torch.Size],
    ) -> None:
        """Holds the segments of ``state`` (``state_dict``'s) instead of its own; they
        must be rollouts of this run's ``layout`` (key -> one step's shape and dtype),
        ``unroll_length`` and core state (each [layers, 1, H]): ValueError (and the
        replay unchanged) where they are not. Their chains end
        (the episodes in progress then are not resumed) and take sources of their own;
        beyond the capacity, the oldest episodes are evicted as usual."""
        saved_layout = {
            key: (torch.Size(shape), getattr(torch, dtype))
            for key, (shape, dtype) in state["layout"].items()
        }
        if state["segments"] and saved_layout == without_added_columns(layout):
            state = with_added_columns(state, layout)  # saved by an older release
            saved_layout = layout
        if state["segments"] and saved_layout != layout:
            raise ValueError("its rollouts hold other keys, shapes or dtypes")
        if state["segments"] and state["unroll_length"] != unroll_length:
            raise ValueError(
                f"its rollouts are of --unroll_length {state['unroll_length']}, not {unroll_length}"
            )
        restored: list[_Segment] = []
        for position, saved in enumerate(state["segments"]):
            previous = restored[saved["previous"]] if 0 <= saved["previous"] < position else None
            check_saved_segment(saved, layout, unroll_length, core_state_shapes, previous)
            segment = _Segment(
                source=("restored", position if previous is None else previous.source[1]),
                steps=dict(saved["steps"]),
                core_state=tuple(saved["core_state"]),
                head=None if previous is not None else dict(saved["head"]),
                previous=previous,
            )
            if previous is not None:
                previous.next = segment
            restored.append(segment)
        with self._lock:
            self._layout, self._unroll_length = layout, unroll_length
            self._segments, self._tails = restored, {}
            self._transitions = sum(len(segment) for segment in restored)
            while self._transitions > self.capacity:
                self._evict_oldest_episode()

    def forget(self, sources: set[Hashable]) -> None:
        """Drops every stored step of these sources (rollouts that broke an update)."""
        with self._lock:
            kept = []
            for segment in self._segments:
                if segment.source in sources:
                    self._transitions -= len(segment)
                else:
                    kept.append(segment)
            self._segments = kept
            for source in sources:
                self._tails.pop(source, None)

    def _check_layout(self, batch: dict[str, torch.Tensor], sources: Sequence[Hashable]) -> None:
        if len(sources) != batch["frame"].shape[1]:
            raise ValueError(f"{len(sources)} sources for {batch['frame'].shape[1]} columns")
        layout = {
            key: (tensor.shape[2:], tensor.dtype) for key, tensor in batch.items() if key != "mask"
        }
        if self._layout is None:
            self._layout = layout
            self._unroll_length = batch["frame"].shape[0] - 1
        elif layout != self._layout:
            raise ValueError(
                f"batch keys, shapes or dtypes {layout} differ from the first batch's "
                f"{self._layout}; every actor must write the same rollout spec"
            )
        if batch["frame"].shape[0] != self._unroll_length + 1:
            raise ValueError(
                f"batch has {batch['frame'].shape[0]} steps, the replay holds rollouts of "
                f"{self._unroll_length + 1} (unroll_length + 1)"
            )

    @staticmethod
    def _real_new_steps(mask: torch.Tensor, column: int) -> int:
        """L, the number of real new steps of a column given its mask [T+1]."""
        real = int(mask.sum())
        if real == 0 or not bool(mask[:real].all()):
            raise ValueError(
                f"mask of column {column} is not a prefix of real steps starting at index 0"
            )
        return real - 1

    def _add_column(
        self,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        column: int,
        source: Hashable,
        length: int,
    ) -> None:
        tail = self._tails.pop(source, None)
        if length == 0:
            return  # nothing new; the chain ends here
        segment = _Segment(
            source=source,
            steps={key: batch[key][1 : length + 1, column].clone() for key in self._layout},
            core_state=tuple(state[:, column : column + 1].clone() for state in core_state),
        )
        if tail is not None and self._continues(tail, batch, column):
            segment.previous, tail.next = tail, segment
        else:
            segment.head = {key: batch[key][0:1, column].clone() for key in self._layout}
        self._segments.append(segment)
        self._transitions += length
        if length == self._unroll_length:
            self._tails[source] = segment  # a cut-short rollout ends its chain

    @staticmethod
    def _continues(tail: _Segment, batch: dict[str, torch.Tensor], column: int) -> bool:
        """Whether the column's index 0 is the tail's last step (not a restarted actor)."""
        return all(
            torch.equal(tail.steps[key][-1], batch[key][0, column])
            for key in IDENTITY_KEYS
            if key in tail.steps
        )

    def _evict_oldest_episode(self) -> None:
        """Drops the oldest chain's steps up to the end of its first episode, or all of them."""
        segment = self._segments[0]
        while segment is not None:
            ends = torch.nonzero(segment.steps["done"]).flatten()  # [episode ends]
            if len(ends) > 0:
                self._drop_prefix(segment, int(ends[0]))
                break
            following = segment.next
            self._remove(segment)
            segment = following
        self.episodes_evicted += 1

    def _drop_prefix(self, segment: _Segment, end: int) -> None:
        """Drops transitions 0..end of a chain's first segment; step ``end`` becomes a head."""
        # Clone so the dropped steps' memory is freed; the done step moves, it is not copied.
        head = {key: tensor[end : end + 1].clone() for key, tensor in segment.steps.items()}
        if end + 1 == len(segment):
            following = segment.next
            self._remove(segment)
            if following is not None:
                following.head = head
            return
        self._transitions -= end + 1
        segment.steps = {key: tensor[end + 1 :].clone() for key, tensor in segment.steps.items()}
        segment.head = head
        # It now starts at an episode start, where the model resets its state.
        segment.core_state = tuple(torch.zeros_like(state) for state in segment.core_state)

    def _remove(self, segment: _Segment) -> None:
        """Forgets a chain's first segment; its successor, if any, becomes the first."""
        self._segments.remove(segment)
        self._transitions -= len(segment)
        if segment.next is not None:
            segment.next.previous = None
        elif self._tails.get(segment.source) is segment:
            del self._tails[segment.source]  # the chain is empty: the next rollout starts anew

    def _columns(
        self, segments: Sequence[_Segment]
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        """Segments rebuilt as columns: batch [T+1, N, ...] with "mask", core state."""
        steps, count = self._unroll_length + 1, len(segments)
        batch = {
            key: torch.zeros((steps, count, *shape), dtype=dtype)
            for key, (shape, dtype) in self._layout.items()
        }
        mask = torch.zeros((steps, count), dtype=torch.bool)  # [T+1, N]
        for column, segment in enumerate(segments):
            first, length = segment.first_step(), len(segment)
            for key, tensor in batch.items():
                tensor[0, column] = first[key][0]
                tensor[1 : length + 1, column] = segment.steps[key]
            mask[: length + 1, column] = True
        batch["mask"] = mask
        core_state = tuple(
            torch.cat(states, dim=1)  # [layers, N, H]
            for states in zip(*(segment.core_state for segment in segments), strict=True)
        )
        return batch, core_state


# Columns that rollouts have gained since a replay file could first be saved, with the value
# their older rollouts had in effect: truncation_value 0, a time limit's end learned as a
# game's end (as it was).
ADDED_COLUMNS = {"truncation_value": 0.0}


def without_added_columns(layout: dict) -> dict:
    """``layout`` as an older release saved it: without ``ADDED_COLUMNS``."""
    return {key: value for key, value in layout.items() if key not in ADDED_COLUMNS}


def with_added_columns(state: dict, layout: dict[str, tuple[torch.Size, torch.dtype]]) -> dict:
    """A saved replay (``Replay.state_dict``'s) of an older release's rollouts, with each
    of ``ADDED_COLUMNS`` filled in, in every segment's steps and head, as ``layout`` has it."""
    added = {key: (layout[key], value) for key, value in ADDED_COLUMNS.items() if key in layout}

    def filled(tensors: dict | None) -> dict | None:
        if not isinstance(tensors, dict) or not tensors:
            return tensors
        steps = next(iter(tensors.values())).shape[0]
        return tensors | {
            key: torch.full((steps, *shape), value, dtype=dtype)
            for key, ((shape, dtype), value) in added.items()
        }

    segments = [
        saved | {"steps": filled(saved.get("steps")), "head": filled(saved.get("head"))}
        for saved in state["segments"]
    ]
    return state | {"segments": segments}


def check_saved_segment(
    saved: dict,
    layout: dict[str, tuple[torch.Size, torch.dtype]],
    unroll_length: int,
    core_state_shapes: Sequence[torch.Size],
    previous: _Segment | None,
) -> None:
    """Refuses (ValueError) a saved segment that is not one of this run's rollouts: its
    steps, head and core state must have the run's keys, shapes and dtypes."""

    def fits(tensors: dict, steps: range) -> bool:
        return (
            isinstance(tensors, dict)
            and set(tensors) == set(layout)
            and all(
                isinstance(tensor, torch.Tensor)
                and tensor.shape[1:] == layout[key][0]
                and tensor.dtype == layout[key][1]
                and tensor.shape[0] in steps
                for key, tensor in tensors.items()
            )
            and len({tensor.shape[0] for tensor in tensors.values()}) == 1
        )

    core_state = saved.get("core_state")
    if not (
        fits(saved.get("steps"), range(1, unroll_length + 1))
        and (previous is not None or fits(saved.get("head"), range(1, 2)))
        and isinstance(core_state, list)
        and [getattr(state, "shape", None) for state in core_state] == list(core_state_shapes)
    ):
        raise ValueError("a segment's steps or core state do not fit this run's rollouts")

"""Which rollouts MonoBeast's batches hold: each env's at most ⌈B / envs⌉ times while other
envs' rollouts are on their way, and never a batch that waits forever."""

from __future__ import annotations

import collections
import threading

import pytest

from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_mono_parser
from torchbeast.config.settings import build_settings
from torchbeast.runtime.mono import MonoTrainer
from torchbeast.runtime.mono_batches import FullSlots


def test_a_later_rollout_of_an_env_the_batch_holds_waits_for_the_next_batch():
    full = FullSlots(batch_size=4, num_envs=4)
    for slot, source in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1)]):
        full.add(slot, source)
    slots, sources = [], []
    full.take(slots, sources)
    assert slots == [0, 1, 4, 5]
    assert sources == [(0, 0), (0, 1), (1, 0), (1, 1)]
    slots, sources = [], []
    full.take(slots, sources)  # the set-aside rollouts come first, in arrival order
    assert slots == [2, 3]
    assert len(full) == 0


def test_a_batch_waits_for_envs_it_lacks_and_takes_no_more_than_it_needs():
    full = FullSlots(batch_size=2, num_envs=2)
    full.add(7, (0, 0))
    full.add(8, (0, 0))
    slots, sources = [], []
    full.take(slots, sources)
    assert slots == [7]  # the batch still lacks env (1, 0)
    full.add(9, (1, 0))
    full.add(10, (1, 0))
    full.take(slots, sources)
    assert slots == [7, 9]
    assert [slot for slot, _ in full.slots] == [8, 10]


def test_with_fewer_envs_than_the_batch_each_env_fills_its_share():
    full = FullSlots(batch_size=5, num_envs=2)  # ⌈5 / 2⌉ = 3 per env
    for slot in range(4):
        full.add(slot, (0, 0))
    full.add(4, (1, 0))
    full.add(5, (1, 0))
    slots, sources = [], []
    full.take(slots, sources)
    assert slots == [0, 1, 2, 4, 5]
    assert collections.Counter(sources) == {(0, 0): 3, (1, 0): 2}


def test_any_env_takes_the_oldest_slots_whatever_their_env():
    full = FullSlots(batch_size=3, num_envs=3)
    for slot in range(4):
        full.add(slot, (0, 0))
    slots, sources = [], []
    full.take(slots, sources)
    full.take(slots, sources, any_env=True)
    assert slots == [0, 1, 2]
    assert [slot for slot, _ in full.slots] == [3]


def batches_of(argv: list[str], count: int, after=lambda sources: True) -> list[list]:
    """The (actor, env) sources of a real MonoBeast pool's ``count`` batches from the first
    for which ``after`` holds; a pool that has not given them all within a minute fails
    the test instead of hanging it."""
    settings = build_settings(parse_flags(argv, make_mono_parser()), "mono")
    pool = MonoTrainer(settings).create_pool()
    pool.start()
    deadline = threading.Timer(60, pool.fail, ["no batch within 60 s"])
    deadline.start()
    try:
        batches: list[list] = []
        while len(batches) < count:
            got = pool.get_batch()
            assert got is not None, pool.error
            if batches or after(got[2]):
                batches.append(got[2])
        return batches
    finally:
        deadline.cancel()
        pool.stop()


SLOW_SECOND_ACTOR = [
    "--env",
    "tests.envs_for_tests:SlowFromSeed-v0",
    "--seed",
    "0",
    "--num_actors",
    "2",
    "--envs_per_actor",
    "2",
    "--unroll_length",
    "5",
    "--disable_cuda",
]


def test_an_actor_that_runs_ahead_does_not_fill_a_batch_alone():
    # Actor 0 steps 20 ms faster per step: in arrival order alone, it would deliver
    # several rollouts for each of actor 1's. (While actor 1 starts, actor 0's rollouts
    # are all there is: the batches before actor 1's first hold them alone.)
    argv = [*SLOW_SECOND_ACTOR, "--batch_size", "4"]
    batches = batches_of(argv, count=12, after=lambda sources: (1, 0) in sources)
    for sources in batches:
        assert sorted(sources) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("num_buffers", ["4", "8"])
def test_with_fewer_envs_than_the_batch_batches_keep_coming(num_buffers):
    # 3 envs (the third slow), B = 4: each env at most twice per batch. With 4 buffers,
    # a fast actor's third rollout is often all a batch can take once every actor waits
    # for slots.
    argv = [*SLOW_SECOND_ACTOR, "--num_actors", "3", "--envs_per_actor", "1", "--batch_size", "4"]
    batches = batches_of([*argv, "--num_buffers", num_buffers], count=8)
    assert len(batches) == 8
    assert all(len(sources) == 4 for sources in batches)

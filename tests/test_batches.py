"""Which rollouts a batch holds (MonoBeast's slots, RayBeast's queue): each env's at most
⌈B / envs⌉ times while other envs' rollouts are on their way, and never a batch that waits
forever."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_mono_parser
from torchbeast.config.settings import build_settings
from torchbeast.runtime.batches import Arrivals, per_env_share
from torchbeast.runtime.mono import MonoTrainer
from torchbeast.runtime.queues import RolloutQueue


def test_a_later_rollout_of_an_env_the_batch_holds_waits_for_the_next_batch():
    full: Arrivals[int] = Arrivals(per_env_share(batch_size=4, num_envs=4))
    for slot, source in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1)]):
        full.add(slot, source)
    slots, sources = [], []
    assert full.take(slots, sources, 4) == 4
    assert slots == [0, 1, 4, 5]
    assert sources == [(0, 0), (0, 1), (1, 0), (1, 1)]
    slots, sources = [], []
    full.take(slots, sources, 4)  # the set-aside rollouts come first, in arrival order
    assert slots == [2, 3]
    assert len(full) == 0


def test_a_batch_waits_for_envs_it_lacks_and_takes_no_more_than_it_needs():
    full: Arrivals[int] = Arrivals(per_env_share(batch_size=2, num_envs=2))
    full.add(7, (0, 0))
    full.add(8, (0, 0))
    slots, sources = [], []
    full.take(slots, sources, 2)
    assert slots == [7]  # the batch still lacks env (1, 0)
    full.add(9, (1, 0))
    full.add(10, (1, 0))
    full.take(slots, sources, 2)
    assert slots == [7, 9]
    assert [slot for slot, _ in full.items] == [8, 10]


def test_with_fewer_envs_than_the_batch_each_env_fills_its_share():
    full: Arrivals[int] = Arrivals(per_env_share(batch_size=5, num_envs=2))  # 3 per env
    for slot in range(4):
        full.add(slot, (0, 0))
    full.add(4, (1, 0))
    full.add(5, (1, 0))
    slots, sources = [], []
    full.take(slots, sources, 5)
    assert slots == [0, 1, 2, 4, 5]
    assert collections.Counter(sources) == {(0, 0): 3, (1, 0): 2}


def test_any_env_takes_the_oldest_slots_whatever_their_env():
    full: Arrivals[int] = Arrivals(per_env_share(batch_size=3, num_envs=3))
    for slot in range(4):
        full.add(slot, (0, 0))
    slots, sources = [], []
    assert full.take(slots, sources, 3) == 1
    assert full.take(slots, sources, 3, any_env=True) == 2
    assert slots == [0, 1, 2]
    assert [slot for slot, _ in full.items] == [3]


def test_without_a_share_a_batch_takes_items_in_arrival_order():
    waiting: Arrivals[int] = Arrivals(per_env=None)
    for item in range(5):
        waiting.add(item, (0, 0))
    batch, sources = [], []
    waiting.take(batch, sources, 3)
    assert batch == [0, 1, 2]


def test_the_queue_holds_a_later_item_of_an_env_back_until_another_env_comes():
    # RayBeast's queue: env (0, 0) delivered twice before env (1, 0) once.
    items: RolloutQueue[str] = RolloutQueue(maxsize=10, per_env=per_env_share(2, num_envs=2))
    items.put("first of env 0", (0, 0))
    items.put("second of env 0", (0, 0))
    batches: list = []
    learner = threading.Thread(target=lambda: batches.append(items.get_batch(2)))
    learner.start()
    time.sleep(0.3)
    assert learner.is_alive()  # the batch waits for env (1, 0)
    items.put("first of env 1", (1, 0))
    learner.join(5)
    assert batches == [["first of env 0", "first of env 1"]]
    assert items.get_batch(1) == ["second of env 0"]


def test_a_full_queue_gives_its_oldest_items_whatever_their_env():
    # Only env (0, 0) delivers: once it waits on a full queue, nothing else can come.
    items: RolloutQueue[int] = RolloutQueue(maxsize=3, per_env=per_env_share(2, num_envs=2))
    producer = threading.Thread(target=lambda: [items.put(i, (0, 0)) for i in range(6)])
    producer.start()
    try:
        assert items.get_batch(2) == [0, 1]
        assert items.get_batch(2) == [2, 3]
    finally:
        items.close()
        producer.join(5)


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

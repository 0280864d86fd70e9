"""The dynamic batcher and the learner queue, under concurrency, with exact counts."""

import threading
import time

import pytest

from torchbeast.runtime.poly.batching import DynamicBatcher, Failed
from torchbeast.runtime.queues import Closed, RolloutQueue


def run_threads(target, count: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_every_caller_gets_its_own_result_and_every_request_is_computed_once():
    computed: list[int] = []

    def compute(payloads):
        computed.extend(payloads)
        return [2 * p for p in payloads]

    batcher = DynamicBatcher(compute, max_batch_size=8, timeout_s=0.001, num_threads=2)
    wrong: list[tuple[int, int]] = []

    def caller(i):
        for j in range(200):
            payload = i * 1000 + j
            result = batcher.compute(payload)
            if result != 2 * payload:
                wrong.append((payload, result))

    run_threads(caller, 16)
    batcher.close()
    assert wrong == []
    assert sorted(computed) == sorted(i * 1000 + j for i in range(16) for j in range(200))
    assert sum(size * n for size, n in batcher.batch_sizes.items()) == 16 * 200


def test_batches_hold_waiting_requests_together_up_to_the_maximum():
    sizes: list[int] = []
    release = threading.Event()

    def compute(payloads):
        sizes.append(len(payloads))
        release.wait(5)  # the first batch holds the worker so that the others queue up
        return payloads

    batcher = DynamicBatcher(compute, max_batch_size=4, timeout_s=0.05, num_threads=1)
    threads = [threading.Thread(target=batcher.compute, args=(i,)) for i in range(11)]
    threads[0].start()
    wait_until(lambda: sizes == [1])  # the first request forms a batch of one alone
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: len(batcher.pending) == 10)  # the others queue behind it
    release.set()
    for thread in threads:
        thread.join(10)
    batcher.close()
    assert sizes == [1, 4, 4, 2]


def test_an_error_in_a_batch_reaches_every_caller_of_that_batch():
    def compute(payloads):
        raise ValueError(f"bad batch of {len(payloads)}")

    batcher = DynamicBatcher(compute, max_batch_size=64, timeout_s=0.05)
    errors: list[str] = []

    def caller(i):
        with pytest.raises(ValueError, match="bad batch") as info:
            batcher.compute(i)
        errors.append(str(info.value))

    run_threads(caller, 10)
    batcher.close()
    assert len(errors) == 10


def test_a_failed_result_fails_only_its_own_caller():
    def compute(payloads):
        return [Failed(ValueError(f"bad {p}")) if p % 3 == 0 else p * 10 for p in payloads]

    batcher = DynamicBatcher(compute, max_batch_size=64, timeout_s=0.05)
    outcomes: dict[int, object] = {}

    def caller(i):
        try:
            outcomes[i] = batcher.compute(i)
        except ValueError as error:
            outcomes[i] = str(error)

    run_threads(caller, 10)
    batcher.close()
    assert outcomes == {i: f"bad {i}" if i % 3 == 0 else i * 10 for i in range(10)}


def test_closing_fails_callers_still_waiting_and_refuses_new_ones():
    started = threading.Event()

    def compute(payloads):
        started.set()
        wait_until(lambda: batcher.closed)  # the batch is still computing when it closes
        return payloads

    batcher = DynamicBatcher(compute, max_batch_size=1, timeout_s=0.0)
    outcomes: list[str] = []

    def caller(i):
        try:
            batcher.compute(i)
            outcomes.append("result")
        except Closed:
            outcomes.append("closed")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    started.wait(5)
    batcher.close()
    for thread in threads:
        thread.join(5)
    assert sorted(outcomes) == ["closed", "closed", "result"]
    with pytest.raises(Closed):
        batcher.compute(0)


def test_the_queue_delivers_every_item_once_in_batches_of_b():
    items: RolloutQueue[tuple[int, int]] = RolloutQueue(maxsize=5)
    batches: list[list[tuple[int, int]]] = []
    lock = threading.Lock()

    def producer(i):
        for j in range(60):
            items.put((i, j))

    def consumer(_):
        while (batch := items.get_batch(4)) is not None:
            with lock:
                batches.append(batch)
                if sum(map(len, batches)) == 8 * 60:
                    items.close()

    consumers = [threading.Thread(target=consumer, args=(i,)) for i in range(2)]
    for thread in consumers:
        thread.start()
    run_threads(producer, 8)
    for thread in consumers:
        thread.join(10)
    assert all(len(batch) == 4 for batch in batches)
    delivered = [item for batch in batches for item in batch]
    assert sorted(delivered) == [(i, j) for i in range(8) for j in range(60)]
    # Each producer's items arrive in the order it put them.
    for i in range(8):
        assert [j for p, j in delivered if p == i] == list(range(60))


def test_a_full_queue_makes_producers_wait_until_the_learner_takes_a_batch():
    items: RolloutQueue[int] = RolloutQueue(maxsize=2)
    items.put(1)
    items.put(2)
    third = threading.Thread(target=items.put, args=(3,))
    third.start()
    time.sleep(0.3)
    assert third.is_alive() and items.qsize() == 2  # backpressure: bounded, waiting
    assert items.get_batch(2) == [1, 2]
    third.join(5)
    assert not third.is_alive()
    assert items.get_batch(1) == [3]


def test_closing_the_queue_releases_waiting_producers_and_consumers():
    full: RolloutQueue[int] = RolloutQueue(maxsize=1)
    full.put(1)
    empty: RolloutQueue[int] = RolloutQueue(maxsize=1)
    outcomes: list[str] = []

    def producer():
        try:
            full.put(2)
        except Closed:
            outcomes.append("producer released")

    def consumer():
        outcomes.append(f"consumer got {empty.get_batch(1)}")

    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert all(thread.is_alive() for thread in threads)
    full.close()
    empty.close()
    for thread in threads:
        thread.join(5)
    assert sorted(outcomes) == ["consumer got None", "producer released"]

"""SharedWeights: versioned weights that a reader never sees half-written."""

import threading
import time

import pytest
import torch
from torch import nn

from torchbeast.runtime.mono_weights import SharedWeights


def filled_model(value: float) -> nn.Module:
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 64))
    model.register_buffer("policy_version", torch.zeros((), dtype=torch.int64), persistent=False)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)
    return model


def test_read_copies_published_weights_and_returns_the_version():
    weights = SharedWeights(filled_model(0.0))
    weights.publish(filled_model(3.0))
    reader = filled_model(0.0)

    version = weights.read_into(reader, -1)

    assert version == 2
    assert all(torch.all(p == 3.0) for p in reader.parameters())


def test_read_of_a_known_version_copies_nothing():
    weights = SharedWeights(filled_model(0.0))
    weights.publish(filled_model(3.0))
    reader = filled_model(7.0)

    assert weights.read_into(reader, 2) == 2
    assert all(torch.all(p == 7.0) for p in reader.parameters())


@pytest.mark.parametrize("staged", [False, True], ids=["straight", "through a staging buffer"])
def test_reader_never_sees_a_mix_of_two_publications(staged):
    weights = SharedWeights(filled_model(0.0))
    staging = torch.empty_like(weights.flat) if staged else None
    writers_models = [filled_model(float(k)) for k in range(1, 6)]
    stop = threading.Event()

    def keep_publishing():
        k = 0
        while not stop.is_set():
            weights.publish(writers_models[k % len(writers_models)])
            k += 1
            # A learner pauses between updates. A writer that never pauses can starve
            # readers forever (a seqlock allows that), which made this test hang.
            time.sleep(0.0002)

    writer = threading.Thread(target=keep_publishing)
    writer.start()
    reader, mixed, version = filled_model(0.0), 0, -1
    try:
        for _ in range(300):
            # A copy every time: straight, it waits out a write; through the staging
            # buffer, only a reader holding nothing (-1) does.
            version = weights.read_into(reader, -1 if staged else version - 1, staging)
            values = torch.cat([p.flatten() for p in reader.parameters()])
            mixed += int(not torch.all(values == values[0]))
    finally:
        stop.set()
        writer.join()
    assert version > 0 and version % 2 == 0
    assert mixed == 0


def test_a_read_through_a_staging_buffer_brings_the_weights_and_their_policy_version():
    weights = SharedWeights(filled_model(0.0))
    writer = filled_model(3.0)
    writer.policy_version.fill_(11)
    weights.publish(writer)
    reader, staging = filled_model(0.0), torch.empty_like(weights.flat)

    assert weights.read_into(reader, -1, staging) == 2
    assert all(torch.all(p == 3.0) for p in reader.parameters())
    assert int(reader.policy_version) == 11
    assert torch.all(staging == 3.0)


def test_a_reader_through_a_staging_buffer_keeps_its_weights_while_the_learner_writes():
    """It does not wait for the learner: mid-write, it keeps what it holds (untouched) and
    reads the next time; a reader with nothing yet waits for the write to end."""
    weights = SharedWeights(filled_model(0.0))
    weights.publish(filled_model(3.0))
    reader, staging = filled_model(0.0), torch.empty_like(weights.flat)
    assert weights.read_into(reader, -1, staging) == 2
    weights.version += 1  # the learner starts writing 5.0 ...
    weights.flat.fill_(5.0)

    assert weights.read_into(reader, 2, staging) == 2  # at once
    assert all(torch.all(p == 3.0) for p in reader.parameters())

    finish = threading.Timer(0.2, lambda: weights.version.add_(1))  # ... and is done
    fresh = filled_model(0.0)
    started = time.monotonic()  # before the timer starts: it cannot end the write sooner
    finish.start()
    assert weights.read_into(fresh, -1, staging) == 4
    assert time.monotonic() - started >= 0.15
    assert all(torch.all(p == 5.0) for p in fresh.parameters())
    assert weights.read_into(reader, 2, staging) == 4
    assert all(torch.all(p == 5.0) for p in reader.parameters())

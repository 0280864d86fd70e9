"""Which rollouts MonoBeast's batches hold: trains with the given flags, then prints how many
distinct actors each batch's rollouts came from, and how many of a batch's columns repeat
an env that the batch already holds (a second, later rollout of it).

    python scripts/batch_mix.py --env PongNoFrameskip-v4 --total_steps 50000
    python scripts/batch_mix.py --env PongNoFrameskip-v4 --total_steps 50000 --precision auto
"""

from __future__ import annotations

import collections
import sys

from torchbeast import monobeast
from torchbeast.runtime import mono

actors_per_batch: collections.Counter[int] = collections.Counter()
repeated_columns: collections.Counter[int] = collections.Counter()
get_batch = mono.ActorPool.get_batch


def counted_get_batch(pool: mono.ActorPool):
    got = get_batch(pool)
    if got is not None:
        sources = got[2]  # (actor, env) of each column
        actors_per_batch[len({actor for actor, _ in sources})] += 1
        repeated_columns[len(sources) - len(set(sources))] += 1
    return got


def shares(counter: collections.Counter[int]) -> str:
    total = sum(counter.values()) or 1
    return ", ".join(f"{key}: {count / total:.1%}" for key, count in sorted(counter.items()))


if __name__ == "__main__":  # not in the actors, which import this module as they spawn
    mono.ActorPool.get_batch = counted_get_batch
    try:
        code = monobeast.main(sys.argv[1:])
    finally:
        print(f"batches: {sum(actors_per_batch.values())}")
        print(f"distinct actors per batch: {shares(actors_per_batch)}")
        print(f"columns repeating an env of the same batch: {shares(repeated_columns)}")
    sys.exit(code)

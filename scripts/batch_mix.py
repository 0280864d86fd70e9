"""Which rollouts a runtime's batches hold: trains with the given flags, then prints how
many distinct actors (PolyBeast: streams) each batch's rollouts came from, and how many
of a batch's columns repeat an env that the batch already holds (a second, later rollout
of it).

    python scripts/batch_mix.py --env PongNoFrameskip-v4 --total_steps 50000
    python scripts/batch_mix.py --env PongNoFrameskip-v4 --total_steps 50000 --precision auto
    python scripts/batch_mix.py ray --env PongNoFrameskip-v4 --total_steps 50000
    python scripts/batch_mix.py poly --env PongNoFrameskip-v4 --total_steps 50000

The first word names the runtime (mono, poly or ray; mono if none); the rest are that
runtime's flags.
"""

from __future__ import annotations

import collections
import importlib
import sys

from torchbeast.runtime.registry import RUNTIMES

batch_actors: list[int] = []  # distinct actors of each batch, in order
repeated_columns: list[int] = []  # columns of each batch that repeat an env it holds

# The pool whose get_batch hands each runtime's learner its batches.
POOLS = {
    "mono": ("torchbeast.runtime.mono", "ActorPool"),
    "poly": ("torchbeast.runtime.poly.learner_end", "PolyActorPool"),
    "ray": ("torchbeast.runtime.ray.actor_pool", "RayActorPool"),
}


def count_batches(pool_class: type) -> None:
    """Wraps ``pool_class.get_batch`` to count what each batch's columns came from."""
    get_batch = pool_class.get_batch

    def counted_get_batch(pool):
        got = get_batch(pool)
        if got is not None:
            sources = got[2]  # (actor or stream, env) of each column
            batch_actors.append(len({actor for actor, _ in sources}))
            repeated_columns.append(len(sources) - len(set(sources)))
        return got

    pool_class.get_batch = counted_get_batch


def shares(values: list[int]) -> str:
    counter = collections.Counter(values)
    total = len(values) or 1
    return ", ".join(f"{key}: {count / total:.1%}" for key, count in sorted(counter.items()))


if __name__ == "__main__":  # not in the actors, which import this module as they spawn
    argv = sys.argv[1:]
    runtime = argv.pop(0) if argv and argv[0] in POOLS else "mono"
    pool_module, pool_name = POOLS[runtime]
    if runtime == "ray":  # Ray reads these as it is imported: a Ray on this machine
        from torchbeast.runtime.ray.prepare import prepare_ray_environment

        prepare_ray_environment(None)
    count_batches(getattr(importlib.import_module(pool_module), pool_name))
    try:
        code = importlib.import_module(RUNTIMES[runtime].entry_point).main(argv)
    finally:
        print(f"batches: {len(batch_actors)}")
        print(f"distinct actors per batch: {shares(batch_actors)}")
        print(f"columns repeating an env of the same batch: {shares(repeated_columns)}")
        # Before every actor has delivered, a batch can only hold the ones that have.
        most = max(batch_actors, default=0)
        first = batch_actors.index(most) if batch_actors else 0
        fewer = [i for i, count in enumerate(batch_actors) if i > first and count < most]
        print(
            f"batches with fewer actors after the first with {most}: {len(fewer)} "
            f"(batch numbers {fewer[:10]}{'...' if len(fewer) > 10 else ''}); "
            f"the first with {most} was batch {first}"
        )
    sys.exit(code)

"""The seam between the shared ``Trainer`` and a runtime: everything a trainer asks of the
pool that delivers its rollouts. A runtime's pool subclasses ``Pool``; what it does not
override is what a pool of the user's own actors does (MonoBeast's and RayBeast's)."""

from __future__ import annotations

from collections.abc import Hashable

from torchbeast.runtime.queues import Batch
from torchbeast.runtime.supervision import Supervised


class Pool(Supervised):
    """Where rollouts come from. ``stopping`` and ``error`` (``Supervised``) end the run."""

    # Whether a batch that makes the loss non-finite is skipped (its streams closed)
    # rather than ending the run: PolyBeast's, whose data comes from network peers.
    drops_bad_batches = False

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stops whatever the pool started, by a deadline."""
        raise NotImplementedError

    def get_batch(self) -> Batch | None:
        """B rollouts [T+1, B, ...] on the CPU, their initial core states [layers, B, H],
        and which source (actor or env stream, and env) each column came from; None when
        stopping."""
        raise NotImplementedError

    def stage_totals(self) -> dict[str, float]:
        """CPU seconds so far outside the learner process, by stage, for the benchmark."""
        return {}

    def actor_wall_seconds(self) -> dict[str, float]:
        """The actors' wall-clock seconds so far in each of ACTOR_TIME_PARTS, summed over
        actors ("in all" their whole time), for the benchmark; {} where not counted."""
        return {}

    def inference_batch_sizes(self) -> dict[int, int]:
        """Where one forward pass serves several actors or streams: how many passes served
        how many of them (the benchmark's mean inference batch); {} where actors run their
        own."""
        return {}

    def inference_seconds(self) -> dict[str, float]:
        """Where one server answers every actor's inference (MonoBeast's
        ``--central_inference``): its wall-clock seconds so far idle ("waiting") and in each
        part of its passes (``mono_inference.PASS_PARTS``), and its CPU seconds ("cpu");
        {} elsewhere."""
        return {}

    def describe_sources(self, sources: list[Hashable]) -> str:
        """Who sent the columns with these sources, in words."""
        return ", ".join(map(str, sources))

    def close_streams(self, serials: set[int], reason: str) -> list[str]:
        """Closes the streams ``serials`` (``drops_bad_batches`` pools); returns their names."""
        return []


# What an actor's wall-clock time goes to (MonoBeast's actors count it): the last is its
# whole time, of which the rest is writing rollouts and handing them over.
ACTOR_TIME_PARTS = ("stepping envs", "choosing actions", "waiting for slots", "in all")


def actor_stage_totals(timings) -> dict[str, float]:
    """The stages of actors that run their own inference, from their summed (env,
    inference, all CPU seconds, agent steps)."""
    env_cpu, inference_cpu, actor_cpu, _ = (float(value) for value in timings)
    return {
        "env": env_cpu,
        "inference": inference_cpu,
        "actor other": actor_cpu - env_cpu - inference_cpu,
    }

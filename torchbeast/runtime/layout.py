"""How a run spreads over the machine it runs on: the learner process's threads per op,
and the threads a CPU learner's torso splits its batches over."""

from __future__ import annotations

import os

import torch


def machine_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def omp_thread_limit() -> int | None:
    """OMP_NUM_THREADS where it is a whole number of at least 1 (a study gives each cell
    its CPUs' worth; a user may set it too), else None."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) >= 1 else None


# Niceness of MonoBeast's actor processes beside a bf16 learner on the CPU: the learner, the
# stage that bounds the recipe, runs first when it has work and the actors take the cores it
# leaves (2 cores, bf16: 569-593 SPS with equal priority, 691-735 with the actors at 5-10).
# Beside an fp32 learner it bought nothing measurable (500-507 SPS at equal priority,
# 507-533 niced) and changes the policy lag that the defaults' Pong runs learned with.
ACTOR_NICENESS = 10


def actor_niceness(bf16_learner_on_cpu: bool) -> int:
    """How much lower the actors' priority is than the learner's (see ACTOR_NICENESS)."""
    return ACTOR_NICENESS if bf16_learner_on_cpu else 0


def torso_threads(cores: int, splittable: bool) -> int:
    """Threads a CPU learner's torso splits each batch's rows over (``core.torso_chunks``;
    ``splittable``: a CPU learner, a convolutional torso, no other threads running ops),
    each running the whole torso forward and backward on its rows: two where there are
    two cores or more. The threads meet twice per pass, not at each of its few hundred ops
    (where an op's threads wait for the slowest of them): on 2 cores, in five paired runs
    of the training recipe each, 2.8% faster in fp32 (mean 497 -> 511 SPS) and 4.5% in
    bf16 (695 -> 727) than the same cores splitting each op. Measured on 2 cores only;
    on more, the two threads share the learner's cores per op. 1 where not splittable."""
    return min(2, cores) if splittable else 1


def threads_per_op(
    cores: int, concurrent_ops: int, bf16: bool = False, torso_threads: int = 1
) -> int:
    """Threads each op of the learner process may use: its share of the cores, divided
    among the threads that run ops at the same time (updates, which are serialised, count
    once; PolyBeast's inference threads each count; a torso split over threads counts each
    of them). At least 1.

    The learner's update is the one stage that cannot be spread over processes, so in fp32
    it gets every core: on 2 cores, one thread per op left the learner the bottleneck at
    268 SPS where two ran 300. A bf16 torso's kernels are short enough that a second
    thread per op costs more than it gives (2 cores: 691-714 SPS with one thread per op,
    636-652 with two), so in bf16 the learner's ops take half the cores, the half the
    default layout leaves it (its torso split over two threads of one thread per op each
    takes both of 2 cores, which measured faster still: ``torso_threads``). Threads
    waiting for work sleep (``OMP_WAIT_POLICY``, set in ``torchbeast/__init__.py``), so
    the actors get the cores back between ops."""
    share = max(1, cores // 2) if bf16 else cores
    return max(1, share // max(1, concurrent_ops) // max(1, torso_threads))


def learner_cores() -> tuple[int, str]:
    """The cores the learner process may spread over (OMP_NUM_THREADS bounds them), and
    how the log says so."""
    cores, limit = machine_cores(), omp_thread_limit()
    limited = f", of them {limit} by OMP_NUM_THREADS" if limit and limit < cores else ""
    return min(cores, limit or cores), f"{cores} cores{limited}"


def limit_learner_threads(concurrent_ops: int, bf16: bool = False, torso_threads: int = 1) -> str:
    """Sets the learner process's threads per op (see ``threads_per_op``); returns a line
    for the run's log that says how many and why."""
    cores, described = learner_cores()
    threads = threads_per_op(cores, concurrent_ops, bf16, torso_threads)
    torch.set_num_threads(threads)
    split = (
        f", and its torso's passes split each batch over {torso_threads} threads"
        if torso_threads > 1
        else ""
    )
    return (
        f"PyTorch uses {threads} thread(s) per op in the learner process{split} ({described}, "
        f"{concurrent_ops} thread(s) running ops at once; idle ones sleep: "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})."
    )

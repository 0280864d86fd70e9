"""How a run spreads over the machine it runs on: the learner process's threads per op."""

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


def threads_per_op(cores: int, concurrent_ops: int, bf16: bool = False) -> int:
    """Threads each op of the learner process may use: its share of the cores, divided
    among the threads that run ops at the same time (updates, which are serialised, count
    once; PolyBeast's inference threads each count). At least 1.

    The learner's update is the one stage that cannot be spread over processes, so in fp32
    it gets every core: on 2 cores, one thread per op left the learner the bottleneck at
    268 SPS where two ran 300. A bf16 torso's kernels are short enough that a second
    thread costs more than it gives (2 cores: 691-714 SPS with one thread per op, 636-652
    with two), so in bf16 the learner takes half the cores, the half the default layout
    leaves it. Threads waiting for work sleep (``OMP_WAIT_POLICY``, set in
    ``torchbeast/__init__.py``), so the actors get the cores back between ops."""
    share = max(1, cores // 2) if bf16 else cores
    return max(1, share // max(1, concurrent_ops))


def limit_learner_threads(concurrent_ops: int, bf16: bool = False) -> str:
    """Sets the learner process's threads per op (see ``threads_per_op``); returns a line
    for the run's log that says how many and why."""
    cores = machine_cores()
    limit = omp_thread_limit()
    threads = threads_per_op(min(cores, limit or cores), concurrent_ops, bf16)
    torch.set_num_threads(threads)
    limited = f", of them {limit} by OMP_NUM_THREADS" if limit and limit < cores else ""
    return (
        f"PyTorch uses {threads} thread(s) per op in the learner process ({cores} cores{limited}, "
        f"{concurrent_ops} thread(s) running ops at once; idle ones sleep: "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})."
    )

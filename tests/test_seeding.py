"""Seeds of the environments: one formula for every runtime, distinct for every worker
of a run, and derived from --seed alone so that a seeded run can be reproduced."""

from __future__ import annotations

import subprocess
import sys

from tests.test_polybeast import REPO
from torchbeast.config.flags import parse_flags
from torchbeast.config.settings import build_settings
from torchbeast.envs import worker_seed
from torchbeast.runtime.acting import actor_seed, seed_global_generators
from torchbeast.runtime.mono import actor_context


def env_seeds(first: int | None, num_envs: int) -> set[int]:
    assert first is not None
    return set(range(first, first + num_envs))


def test_no_seed_gives_no_seed():
    assert worker_seed(None, 3, 8) is None


def test_actors_and_their_restarts_seed_disjoint_envs():
    flags = parse_flags(["--num_actors", "2", "--envs_per_actor", "8", "--seed", "1"])
    settings = build_settings(flags, "mono")
    seen: set[int] = set()
    for incarnation in range(3):
        for actor in range(2):
            seeds = env_seeds(actor_seed(settings, actor, incarnation), 8)
            assert not seeds & seen
            seen |= seeds
    assert len(seen) == 3 * 2 * 8


def draw_after_seeding(seed, queue) -> None:
    import random

    import numpy as np
    import torch

    seed_global_generators(seed)
    queue.put((float(np.random.random()), random.random(), float(torch.rand(())), seed))


def test_forked_actors_draw_apart_from_the_global_generators_and_alike_from_one_seed():
    # Forked from one server, the actors shared numpy's global state: an env drawing from
    # np.random drew the same numbers in each.
    context = actor_context()
    assert context.get_start_method() == "forkserver"
    queue = context.Queue()
    processes = [context.Process(target=draw_after_seeding, args=(seed, queue))
                 for seed in (None, None, 7, 7)]  # fmt: skip
    for process in processes:
        process.start()
    draws = [queue.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    unseeded = [draw[:3] for draw in draws if draw[3] is None]
    seeded = [draw[:3] for draw in draws if draw[3] == 7]
    assert all(a != b for a, b in zip(*unseeded, strict=True))  # numpy, random and torch
    assert seeded[0] == seeded[1]


def test_other_runs_seeds_start_elsewhere():
    assert worker_seed(1, 0, 8) != worker_seed(2, 0, 8)


CLIENT_SEEDS = """
import sys
import threading
from torchbeast.runtime.poly import env_side
from torchbeast.config.poly import poly_env_settings
from torchbeast.config.parsers import make_env_parser

settings = poly_env_settings(make_env_parser().parse_args(
    ["--connect", "unix:/nonexistent", "--seed", "5", "--num_servers", "2",
     "--clients_per_process", "2", "--envs_per_stream", "3"]
))
seeds = []

def session(settings, stub, client_id, seed, stop):  # stands in for the learner: 2 sessions
    seeds.append(seed)
    if len(seeds) % 2 == 0:
        stop.set()

env_side.connect_once = session
for process in range(2):
    for client in range(2):
        env_side.run_client(settings, process, client, threading.Event(), [], int(sys.argv[1]))
print(seeds)
"""


def inverted_client_seeds(incarnation: int = 0) -> list[int]:
    """The seeds of 2 processes x 2 clients, each connecting twice, in that order
    (``incarnation``: as processes that replaced killed ones)."""
    result = subprocess.run(
        [sys.executable, "-c", CLIENT_SEEDS, str(incarnation)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [int(seed) for seed in result.stdout.strip()[1:-1].split(",")]


def test_inverted_clients_seed_the_same_envs_in_every_run():
    # Their seeds once depended on the process id, so a seeded run could not be repeated.
    first, second = inverted_client_seeds(), inverted_client_seeds()
    assert first == second
    assert first[0] == 5 * 100_003


def test_inverted_clients_of_all_processes_and_redials_seed_disjoint_envs():
    seen: set[int] = set()
    for seed in inverted_client_seeds():
        seeds = env_seeds(seed, 3)
        assert not seeds & seen
        seen |= seeds
    assert len(seen) == 2 * 2 * 2 * 3


def test_env_processes_that_replace_killed_ones_seed_envs_their_predecessors_did_not():
    # A replacement numbered its sessions from 0 again: its envs replayed the first ones'.
    seen = {seed for seed in inverted_client_seeds(0)}
    replaced = inverted_client_seeds(1)
    assert len(replaced) == len(seen) and not {
        env for seed in replaced for env in env_seeds(seed, 3)
    } & {env for seed in seen for env in env_seeds(seed, 3)}

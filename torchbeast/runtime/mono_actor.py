"""MonoBeast's actor process and what it shares with the learner: the weights, published
in shared memory under a seqlock (``runtime.mono_weights``), and the rollout buffers it
fills (see ``runtime.mono``)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
import traceback

import torch

from torchbeast.config.settings import Settings
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.acting import Unroller, actor_seed
from torchbeast.runtime.mono_inference import InferenceSlots, RemotePolicy
from torchbeast.runtime.mono_weights import SharedWeights
from torchbeast.runtime.processes import die_with_parent
from torchbeast.runtime.supervision import STOP_SIGNALS

# --------------------------------------------------------------------------- actor


@dataclasses.dataclass
class ActorShared:
    """What every actor process receives: settings and the shared-memory tensors."""

    settings: Settings
    env_spec: EnvSpec
    config: dict
    buffers: dict[str, torch.Tensor]  # name -> [num_buffers, T+1, ...]
    initial_core_states: tuple[torch.Tensor, ...]  # [num_buffers, layers, H] each
    weights: SharedWeights
    timings: torch.Tensor  # [num_actors, 4]: env, inference, all CPU seconds; steps
    # [num_actors, 4]: wall-clock seconds stepping envs, choosing actions, waiting for
    # slots, and in all (pool.ACTOR_TIME_PARTS)
    walls: torch.Tensor
    inference: InferenceSlots | None = None  # with --central_inference
    niceness: int = 0  # added to the actors' niceness (layout.actor_niceness)


def actor_process(
    actor_index: int,
    incarnation: int,
    shared: ActorShared,
    conn: mp.connection.Connection,
    inference_conn: mp.connection.Connection | None = None,
) -> None:
    """Steps ``envs_per_actor`` envs and fills the buffer slots the learner hands out;
    with ``inference_conn`` the inference process chooses the actions."""
    # The learner decides when actors stop, also when a signal hits the process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while it started
    die_with_parent()
    torch.set_num_threads(1)
    os.nice(shared.niceness)  # the learner first, where that pays (layout.actor_niceness)
    try:
        run_actor(actor_index, incarnation, shared, conn, inference_conn)
    except (EOFError, BrokenPipeError):
        pass  # the learner went away: nothing left to do
    except Exception:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, EOFError):
            pass
        raise SystemExit(1) from None


def run_actor(
    actor_index: int,
    incarnation: int,
    shared: ActorShared,
    conn: mp.connection.Connection,
    inference_conn: mp.connection.Connection | None,
) -> None:
    settings = shared.settings
    seed = actor_seed(settings, actor_index, incarnation)
    remote = inference_conn is not None and shared.inference is not None
    policy = RemotePolicy(shared.inference, actor_index, inference_conn) if remote else None
    unroller = Unroller(settings, shared.env_spec, shared.config, seed, policy)
    version = -1 if remote else shared.weights.read_into(unroller.model, -1)
    cpu_mark = time.process_time()
    conn.send(("ready", []))

    while True:
        wall_mark = time.perf_counter()
        slots = conn.recv()
        if slots is None:
            break
        waited = time.perf_counter() - wall_mark
        unroller.unroll(shared.buffers, torch.tensor(slots), shared.initial_core_states)
        now = time.process_time()
        env_time, inference_time = unroller.take_times()
        shared.timings[actor_index] += torch.tensor(
            [env_time, inference_time, now - cpu_mark, unroller.unroll_length * len(slots)],
            dtype=torch.float64,
        )
        cpu_mark = now
        env_wall, inference_wall = unroller.take_walls()
        shared.walls[actor_index] += torch.tensor(
            [env_wall, inference_wall, waited, time.perf_counter() - wall_mark],
            dtype=torch.float64,
        )
        conn.send(("full", slots))
        if not remote:
            version = shared.weights.read_into(unroller.model, version)
    unroller.close()

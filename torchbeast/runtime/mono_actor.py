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
    inference_conns: list[mp.connection.Connection] | None = None,
) -> None:
    """Steps ``envs_per_actor`` envs and fills the buffer slots the learner hands out;
    with ``inference_conns`` (one per env group) the inference process chooses the
    actions."""
    # The learner decides when actors stop, also when a signal hits the process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while it started
    die_with_parent()
    torch.set_num_threads(1)
    os.nice(shared.niceness)  # the learner first, where that pays (layout.actor_niceness)
    try:
        run_actor(actor_index, incarnation, shared, conn, inference_conns)
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
    inference_conns: list[mp.connection.Connection] | None,
) -> None:
    settings = shared.settings
    seed = actor_seed(settings, actor_index, incarnation)
    unroller: Unroller | TakingTurns
    if inference_conns and shared.inference is not None:
        unroller = TakingTurns.build(
            settings,
            shared.env_spec,
            shared.config,
            shared.inference,
            actor_index,
            seed,
            inference_conns,
        )
        version = -1  # the weights are the server's
    else:
        unroller = Unroller(settings, shared.env_spec, shared.config, seed)
        version = shared.weights.read_into(unroller.model, -1)
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
        if isinstance(unroller, Unroller):
            version = shared.weights.read_into(unroller.model, version)
    unroller.close()


class TakingTurns:
    """An actor's envs in groups that take turns, each group an ``Unroller`` that asks the
    inference process for its actions through a row of its own: while the server chooses
    one group's actions, the actor steps the others' envs (Sample Factory's double-buffered
    sampling). A group asks for its next actions as soon as it has stepped, also after a
    rollout's last step, so that the server works while the actor hands the rollout over
    and waits for new slots."""

    def __init__(self, groups: list[Unroller]):
        self.groups = groups
        self.unroll_length = groups[0].unroll_length
        self.asked = False  # whether each group has asked for its next actions

    @classmethod
    def build(
        cls,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        slots: InferenceSlots,
        actor_index: int,
        seed: int | None,
        conns: list[mp.connection.Connection],
    ) -> TakingTurns:
        """The groups of actor ``actor_index``: group g steps envs [g * E/G, (g + 1) * E/G)
        of its E, seeded as those envs would be in one group, and asks through row
        ``actor_index * G + g`` of ``slots`` and ``conns[g]``."""
        count = len(conns)
        envs_each = settings.actors.envs_per_actor // count
        groups = []
        for group, conn in enumerate(conns):
            group_seed = None if seed is None else seed + group * envs_each
            policy = RemotePolicy(slots, actor_index * count + group, conn)
            groups.append(Unroller(settings, env_spec, config, group_seed, policy, envs_each))
        return cls(groups)

    def unroll(
        self,
        buffers: dict[str, torch.Tensor],
        index: torch.Tensor,
        initial_core_states: tuple[torch.Tensor, ...],
    ) -> None:
        """As ``Unroller.unroll``: env i's rollout to ``buffers[key][index[i]]``."""
        parts = index.chunk(len(self.groups))  # [E/G] each: the groups' envs, in order
        for group, part in zip(self.groups, parts, strict=True):
            group.begin(buffers, part, initial_core_states)
        if not self.asked:
            for group in self.groups:
                group.ask()
            self.asked = True
        for t in range(1, self.unroll_length + 1):
            for group, part in zip(self.groups, parts, strict=True):
                group.receive()
                group.step(buffers, part, t)
                group.ask()  # after step T: the next rollout's first actions

    def take_times(self) -> tuple[float, float]:
        """(env, inference) CPU seconds since the last call, all groups'."""
        times = [group.take_times() for group in self.groups]
        return sum(env for env, _ in times), sum(inference for _, inference in times)

    def take_walls(self) -> tuple[float, float]:
        """(env, inference) wall-clock seconds since the last call, all groups'."""
        walls = [group.take_walls() for group in self.groups]
        return sum(env for env, _ in walls), sum(inference for _, inference in walls)

    def close(self) -> None:
        for group in self.groups:
            group.close()

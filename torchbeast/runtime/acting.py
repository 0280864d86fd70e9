"""What an actor does in every runtime that runs the model next to its environments.

An actor steps ``envs_per_actor`` environments with a CPU copy of the model, one batched
forward pass for all of them per step, and writes rollouts of T+1 steps: index 0 repeats
the last step of its previous rollout. MonoBeast's actors write into shared memory,
RayBeast's into buffers they return through Ray's object store.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

from torchbeast import envs
from torchbeast.core import rollout
from torchbeast.core.models import create_model
from torchbeast.core.precision import compute_dtype
from torchbeast.core.spec import EnvSpec

if TYPE_CHECKING:
    from torchbeast.config.settings import Settings

# (inputs [1, E, ...], core state) -> (outputs [1, E, ...], core state): the model's call.
Policy = Callable[[dict[str, torch.Tensor], tuple], tuple[dict[str, torch.Tensor], tuple]]


@runtime_checkable
class SplitPolicy(Protocol):
    """A policy that chooses elsewhere (MonoBeast's central inference), asked in two halves
    so that the actor can step other envs in between."""

    def __call__(
        self, inputs: dict[str, torch.Tensor], core_state: tuple
    ) -> tuple[dict[str, torch.Tensor], tuple]: ...

    def ask(self, inputs: dict[str, torch.Tensor], core_state: tuple) -> None:
        """Hands over inputs [1, E, ...] and the core state."""

    def answer(self) -> tuple[dict[str, torch.Tensor], tuple]:
        """Waits for the last ask's outputs [1, E, ...] and next core state."""


def act(
    policy: Policy, env_output: dict[str, torch.Tensor], core_state: tuple
) -> tuple[dict[str, torch.Tensor], tuple]:
    """One batched forward pass over the E envs' last outputs ([E, ...] each): the agent's
    outputs [E, ...] (action, logits, baseline, ...) and the next core state."""
    with torch.inference_mode():
        inputs = {k: v.unsqueeze(0) for k, v in env_output.items()}  # [1, E, ...]
        outputs, core_state = policy(inputs, core_state)
    return {k: v[0] for k, v in outputs.items()}, core_state


def truncation_values(
    policy: Policy, env_output: dict[str, torch.Tensor], core_state: tuple
) -> torch.Tensor:
    """[E]: the value of the state each env's episode stopped in where a time limit cut
    it short in this step (``env_output["truncated"]``, its ``final_frame`` [K, ...]), 0
    elsewhere. One forward pass of all E envs (the shape the policy takes), the others on
    their new frames, from the core state the new frames would be read with; its actions
    and next state are thrown away."""
    truncated = env_output["truncated"]
    frame = env_output["frame"].clone()
    frame[truncated] = env_output["final_frame"]
    inputs = dict(
        frame=frame,
        reward=env_output["reward"],
        done=torch.zeros_like(truncated),  # the state goes on into the final frame
        last_action=env_output["last_action"],
    )
    outputs, _ = act(policy, inputs, core_state)
    return torch.where(truncated, outputs["baseline"].float(), 0.0)


def as_tensors(step: dict) -> dict[str, torch.Tensor]:
    """An env step's numpy arrays as tensors (sharing their memory)."""
    return {k: torch.from_numpy(v) for k, v in step.items()}


def seed_global_generators(seed: int | None) -> None:
    """Seeds torch's, numpy's and Python's global generators with ``seed``, or from the OS
    where it is None: every new process starts from torch's one fixed seed, and actors
    forked from one server (MonoBeast's) share numpy's state, so an env that draws from
    ``np.random`` drew the same numbers in every actor."""
    if seed is None:
        torch.seed()
        np.random.seed()
        random.seed()
    else:
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)


def actor_seed(settings: Settings, actor_index: int, incarnation: int) -> int | None:
    """A distinct seed for each actor and each restart of it, derived from ``--seed``."""
    actors = settings.actors
    worker = incarnation * actors.num_actors + actor_index
    return envs.worker_seed(settings.env.seed, worker, actors.envs_per_actor)


class Unroller:
    """An actor's environments and model; ``unroll`` writes one rollout of each env.

    ``env_time`` and ``inference_time`` accumulate CPU seconds for the benchmark, and
    ``env_wall`` and ``inference_wall`` wall-clock seconds (choosing the actions includes
    waiting for them, with central inference).
    """

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        seed: int | None,
        policy: Policy | None = None,
        num_envs: int | None = None,
    ):
        """``policy``: what chooses the actions (default: this actor's copy of the model);
        ``num_envs``: how many envs it steps (default: ``--envs_per_actor``), the first
        seeded with ``seed`` and the others with the seeds after it."""
        seed_global_generators(seed)
        self.unroll_length = settings.learner.unroll_length
        self.env_keys = rollout.env_keys(env_spec)  # with the env's episode extras
        num_envs = num_envs or settings.actors.envs_per_actor
        self.env = envs.create_env(settings.env, num_envs=num_envs, num_threads=1)
        dtype = compute_dtype(settings.model.precision, "cpu", config["kind"])
        self.model = create_model(
            config,
            env_spec.observation_shape,
            env_spec.num_actions,
            compute_dtype=dtype,
            inference_only=True,
        )
        self.model.train()  # sample actions
        self.policy: Policy = policy or self.model
        self.split = policy if isinstance(policy, SplitPolicy) else None  # for ask, receive
        # [E]: what a step writes where no time limit ended an episode (never written to).
        self.no_truncation_values = torch.zeros(num_envs)
        self.env_output = as_tensors(self.env.reset(seed=seed))
        self.env_output[rollout.TRUNCATION_KEY] = self.no_truncation_values
        self.agent_output = rollout.first_agent_output(num_envs, env_spec.num_actions)
        self.core_state = self.model.initial_state(num_envs)
        self.env_time = self.inference_time = 0.0
        self.env_wall = self.inference_wall = 0.0

    def unroll(
        self,
        buffers: dict[str, torch.Tensor],
        index: torch.Tensor,
        initial_core_states: tuple[torch.Tensor, ...],
    ) -> None:
        """Writes env i's rollout to ``buffers[key][index[i]]`` ([T+1, ...]) and the core
        state it starts from to ``initial_core_states[k][index[i]]`` ([layers, H])."""
        self.begin(buffers, index, initial_core_states)
        for t in range(1, self.unroll_length + 1):
            start, start_wall = time.process_time(), time.perf_counter()
            self.agent_output, self.core_state = act(self.policy, self.env_output, self.core_state)
            self.inference_time += time.process_time() - start
            self.inference_wall += time.perf_counter() - start_wall
            self.step(buffers, index, t)

    def begin(
        self,
        buffers: dict[str, torch.Tensor],
        index: torch.Tensor,
        initial_core_states: tuple[torch.Tensor, ...],
    ) -> None:
        """Writes a rollout's step 0, which repeats the last step of the previous one, and
        the core state the rollout starts from."""
        rollout.write_step(buffers, (index, 0), self.env_keys, self.env_output, self.agent_output)
        for stored, state in zip(initial_core_states, self.core_state, strict=True):
            stored[index] = state.transpose(0, 1)  # [E, layers, H]

    def ask(self) -> None:
        """Asks the split policy for the actions of the envs' last outputs; ``receive``
        takes them."""
        assert self.split is not None, "ask needs a SplitPolicy"
        start, start_wall = time.process_time(), time.perf_counter()
        inputs = {k: v.unsqueeze(0) for k, v in self.env_output.items()}  # [1, E, ...]
        self.split.ask(inputs, self.core_state)
        self.inference_time += time.process_time() - start
        self.inference_wall += time.perf_counter() - start_wall

    def receive(self) -> None:
        """Takes the actions (and outputs, and next core state) of the last ``ask``."""
        assert self.split is not None, "receive needs a SplitPolicy"
        start, start_wall = time.process_time(), time.perf_counter()
        outputs, self.core_state = self.split.answer()
        self.agent_output = {k: v[0] for k, v in outputs.items()}
        self.inference_time += time.process_time() - start
        self.inference_wall += time.perf_counter() - start_wall

    def step(self, buffers: dict[str, torch.Tensor], index: torch.Tensor, t: int) -> None:
        """Steps the envs with the actions in ``agent_output`` and writes step ``t``."""
        start, start_wall = time.process_time(), time.perf_counter()
        step = self.env.step(self.agent_output["action"].numpy())
        self.env_output = as_tensors(step)
        self.env_time += time.process_time() - start
        self.env_wall += time.perf_counter() - start_wall
        values = self.no_truncation_values
        if step["truncated"].any():  # rare: once per episode at most
            start, start_wall = time.process_time(), time.perf_counter()
            values = truncation_values(self.policy, self.env_output, self.core_state)
            self.inference_time += time.process_time() - start
            self.inference_wall += time.perf_counter() - start_wall
        self.env_output[rollout.TRUNCATION_KEY] = values
        rollout.write_step(buffers, (index, t), self.env_keys, self.env_output, self.agent_output)

    def take_times(self) -> tuple[float, float]:
        """(env, inference) CPU seconds since the last call."""
        times = (self.env_time, self.inference_time)
        self.env_time = self.inference_time = 0.0
        return times

    def take_walls(self) -> tuple[float, float]:
        """(env, inference) wall-clock seconds since the last call."""
        walls = (self.env_wall, self.inference_wall)
        self.env_wall = self.inference_wall = 0.0
        return walls

    def close(self) -> None:
        self.env.close()

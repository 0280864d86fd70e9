"""The rollout spec: what one actor's unroll holds, shared by every runtime.

A rollout is ``unroll_length + 1`` steps: index 0 repeats the last step of the previous
rollout (so the learner can bootstrap and line up actions), indices 1..T are new. An
environment's episode extras (``EnvSpec.episode_extras``) add one float column each,
``episode_<name>``, summed over the episode like ``episode_return``.

``truncation_value`` is the behaviour model's value (its baseline head's output) of the
last state of an episode that a time limit cut short, at the step the episode ended (its
frame is then the next episode's first), and 0 at every other step: the learner
bootstraps that step's target from it instead of ending the return there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from torchbeast.core.spec import STORED_DTYPES, EnvSpec


def torch_dtype(env_spec: EnvSpec) -> torch.dtype:
    name = env_spec.observation_dtype.name
    if name not in STORED_DTYPES:
        raise ValueError(f"{env_spec.env_id}: observation dtype {name} is not supported")
    return getattr(torch, name)


def rollout_spec(env_spec: EnvSpec, unroll_length: int) -> dict[str, tuple[tuple, torch.dtype]]:
    """Name -> (shape, dtype) of each tensor in one rollout, [T+1, ...]."""
    T1 = unroll_length + 1
    return dict(
        frame=((T1, *env_spec.observation_shape), torch_dtype(env_spec)),
        reward=((T1,), torch.float32),
        done=((T1,), torch.bool),
        episode_return=((T1,), torch.float32),
        **{key: ((T1,), torch.float32) for key in env_spec.extra_keys},
        episode_step=((T1,), torch.int32),
        episode_end=((T1,), torch.bool),
        last_action=((T1,), torch.int64),
        truncation_value=((T1,), torch.float32),
        policy_logits=((T1, env_spec.num_actions), torch.float32),
        baseline=((T1,), torch.float32),
        action=((T1,), torch.int64),
        policy_version=((T1,), torch.int64),
    )


def rollout_bytes(env_spec: EnvSpec, unroll_length: int) -> int:
    """The memory one rollout of ``unroll_length`` + 1 steps takes."""
    return sum(
        math.prod(shape) * dtype.itemsize
        for shape, dtype in rollout_spec(env_spec, unroll_length).values()
    )


def allocate(
    env_spec: EnvSpec, unroll_length: int, num_rollouts: int, shared: bool = False
) -> dict[str, torch.Tensor]:
    """Zeroed storage for ``num_rollouts`` rollouts: name -> [N, T+1, ...]."""
    buffers = {}
    for name, (shape, dtype) in rollout_spec(env_spec, unroll_length).items():
        tensor = torch.zeros((num_rollouts, *shape), dtype=dtype)
        buffers[name] = tensor.share_memory_() if shared else tensor
    return buffers


ENV_KEYS = (
    "frame",
    "reward",
    "done",
    "episode_return",
    "episode_step",
    "episode_end",
    "last_action",
)
AGENT_KEYS = ("policy_logits", "baseline", "action", "policy_version")
# What the model reads of a step (the others are statistics, or the agent's own).
MODEL_KEYS = ("frame", "reward", "done", "last_action")


def probe_step(env_spec: EnvSpec) -> dict[str, torch.Tensor]:
    """A first step ([1, 1, ...] of ENV_KEYS, done) that no environment or peer chose:
    a fixed random frame of values a sound model takes (pixels in 0-255, other integers
    0 or 1, floats from a standard normal), reward 0, last action 0."""
    step = {key: tensor[:, :1] for key, tensor in allocate(env_spec, 0, 1).items()}
    step["done"].fill_(True)
    frame, generator = step["frame"], torch.Generator().manual_seed(0)
    if frame.is_floating_point():
        frame.copy_(torch.randn(frame.shape, generator=generator))
    else:
        high = 256 if frame.dtype == torch.uint8 else 2
        frame.copy_(torch.randint(0, high, frame.shape, generator=generator))
    return {key: step[key] for key in ENV_KEYS}


TRUNCATION_KEY = "truncation_value"


def env_keys(env_spec: EnvSpec) -> tuple[str, ...]:
    """What an actor writes of an environment step into a rollout: ENV_KEYS, the env's
    episode extras and the truncation value."""
    return (*ENV_KEYS, *env_spec.extra_keys, TRUNCATION_KEY)


Array = np.ndarray | torch.Tensor


def first_agent_output(num_envs: int, num_actions: int) -> dict[str, torch.Tensor]:
    """The agent output at step 0 of an actor's first rollout: none chosen yet, zeros."""
    return {
        "policy_logits": torch.zeros(num_envs, num_actions),
        "baseline": torch.zeros(num_envs),
        "action": torch.zeros(num_envs, dtype=torch.int64),
        "policy_version": torch.zeros(num_envs, dtype=torch.int64),
    }


def write_step(
    buffers: Mapping[str, Array],
    where: int | tuple,
    keys: Sequence[str],
    env_output: Mapping[str, Array],
    agent_output: Mapping[str, Array],
) -> None:
    """Writes one step of E rollouts side by side, at ``where`` in ``buffers`` (``t`` for
    [T+1, E, ...] buffers, ``(rows, t)`` for [N, T+1, ...] ones): the env's output
    ``keys`` after the step ([E, ...] each) and the agent output that chose its action.

    Step t holds what the env returned at t and the action (with its logits, baseline and
    policy version) chosen at t - 1 that led there; step 0 of a rollout is written with the
    last step of the previous one, so every runtime's rollouts overlap by one step."""
    for key in keys:
        buffers[key][where] = env_output[key]
    for key in AGENT_KEYS:
        buffers[key][where] = agent_output[key]


def ended_episodes(
    batch: Mapping[str, torch.Tensor], extra_keys: Sequence[str]
) -> tuple[list[float], list[tuple[float, ...]]]:
    """The return and extras (``extra_keys``' values) of each episode that ended in the
    batch's real steps ([T+1, B], step 0 being the previous rollout's last): the episodes
    the learner's ``mean_episode_*`` figures average. An env without extras: []."""
    ended = batch["episode_end"][1:]
    if "mask" in batch:
        ended = ended & batch["mask"][1:]
    returns = batch["episode_return"][1:][ended].tolist()
    extras = list(zip(*(batch[key][1:][ended].tolist() for key in extra_keys), strict=True))
    return returns, extras  # no extras: []


def without_columns(batch: Mapping[str, torch.Tensor], columns: Sequence[int]) -> dict:
    """``batch`` ([T+1, B, ...]) with ``columns`` emptied: zeros, marked by ``"mask"`` as
    rollouts of no steps (only index 0 real), so that they add nothing to an update (its
    losses, gradient, step count, episode figures) while the batch keeps its shape."""
    kept = {key: value.clone() for key, value in batch.items()}
    if "mask" not in kept:
        kept["mask"] = torch.ones(
            batch["reward"].shape[:2], dtype=torch.bool, device=batch["reward"].device
        )
    for value in kept.values():
        value[:, list(columns)] = 0
    kept["mask"][0, list(columns)] = True
    return kept


def without_state_columns(core_state: Sequence[torch.Tensor], columns: Sequence[int]) -> tuple:
    """An LSTM's initial state ([layers, B, H] each) with ``columns`` zeroed, as
    ``without_columns`` empties a batch's."""
    kept = tuple(state.clone() for state in core_state)
    for state in kept:
        state[:, list(columns)] = 0
    return kept


def _join(values: Sequence[Array], dim: int, stack: bool) -> torch.Tensor:
    """``values`` stacked (or concatenated) along ``dim`` in one copy: numpy arrays by numpy,
    then wrapped as they are; tensors by torch."""
    if isinstance(values[0], np.ndarray):
        joined = np.stack(values, axis=dim) if stack else np.concatenate(values, axis=dim)
        return torch.from_numpy(joined)
    return torch.stack(values, dim=dim) if stack else torch.cat(values, dim=dim)


def stack_columns(columns: Sequence[Mapping[str, Array]]) -> dict[str, torch.Tensor]:
    """B rollouts, name -> [T+1, ...] each (numpy arrays or tensors), as one batch:
    name -> [T+1, B, ...]. One copy per name."""
    return {key: _join([column[key] for column in columns], 1, stack=True) for key in columns[0]}


def stack_core_states(states: Sequence[Sequence[Array]]) -> tuple[torch.Tensor, ...]:
    """B rollouts' initial core states, [layers, 1, H] each, as [layers, B, H]."""
    return tuple(
        _join([state[i] for state in states], 1, stack=False) for i in range(len(states[0]))
    )

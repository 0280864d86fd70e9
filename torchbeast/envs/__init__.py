"""Environments: ``create_env(settings)`` for any Gymnasium id, stepped N at a time.

The id's family (``envs.family``: Atari in ``envs.atari``, MinAtar, PixelCue, Gymnasium's
own, or a package's through an entry point) makes its envs. Atari ids run on ale-py's
``AtariVectorEnv`` with the DeepMind preprocessing TorchBeast used; other ids (CartPole-v1,
MinAtar/Breakout-v1, ...) run on Gymnasium's ``SyncVectorEnv``.

Every step returns numpy arrays with a leading [N] dimension, TorchBeast style: when an
episode ends the env resets at once, so ``frame`` is the new episode's first frame while
``reward``/``done`` describe the step that ended the old one.

An environment may report extra per-episode figures besides its return: it declares them
in its metadata, ``metadata["episode_extras"] = {name: info_key}``, and each step's
``info[info_key]`` adds up over the episode as ``episode_<name>``, as the reward adds up
to ``episode_return`` (Riverraid with a reward proxy declares two).

The N envs' episode bookkeeping is ``envs.batched``'s; looking an id up, ``envs.registry``'s.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator

import gymnasium as gym

from torchbeast.core.errors import UserError
from torchbeast.core.spec import EnvSpec
from torchbeast.envs.atari import make_single_atari
from torchbeast.envs.batched import BatchedEnv
from torchbeast.envs.family import EnvFamily, Preset, check_foreign_flags, families, family_of
from torchbeast.envs.registry import EnvError, gym_spec
from torchbeast.envs.settings import EnvSettings

__all__ = [
    "BatchedEnv",
    "EnvError",
    "EnvFamily",
    "EnvSettings",
    "Preset",
    "create_env",
    "env_spec",
    "environment_errors",
    "families",
    "family_of",
    "gym_spec",
    "make_single_atari",
    "worker_seed",
]


# Worker seeds wrap below 2**31 - 2**20: ale-py takes 32-bit seeds, and a worker's envs
# take the seeds after its first (--seed 30000 overflowed before).
SEED_RANGE = 2**31 - 2**20


def worker_seed(seed: int | None, worker: int, num_envs: int) -> int | None:
    """The seed of a worker's first environment (its other ``num_envs`` - 1 take the next
    seeds): distinct for every worker of a run and derived from ``--seed`` alone, so that
    a seeded run can be reproduced. ``worker`` numbers the run's workers from 0 (actors and
    their restarts, env streams and their redials); None without a seed."""
    if seed is None:
        return None
    return (seed * 100_003 + worker * num_envs) % SEED_RANGE


def create_env(
    settings: EnvSettings | str,
    num_envs: int = 1,
    seed: int | None = None,
    num_threads: int = 1,
    render: str | None = None,
) -> BatchedEnv:
    """Creates ``num_envs`` copies of ``settings.env`` (or of the id given, with the
    defaults) as one BatchedEnv.

    ``num_threads`` is the number of C++ threads stepping Atari games (ignored otherwise);
    ``render`` Gymnasium's render mode: "human" (a window), "rgb_array" (``frame()``).
    Call ``reset(seed)`` on the result before stepping it.
    """
    if isinstance(settings, str):
        settings = EnvSettings(settings)
    return checked_family(settings).make(settings, num_envs, num_threads, render)


def checked_family(settings: EnvSettings) -> EnvFamily:
    """The family of ``settings.env``, once it has checked that its flags apply to it
    (EnvError where they do not)."""
    family = family_of(settings.env)
    check_foreign_flags(settings, family)
    family.check(settings)
    return family


def reward_description(settings: EnvSettings) -> str | None:
    """What trains the agent where it is not the env's own reward (a Riverraid reward
    proxy), or None."""
    return family_of(settings.env).reward_description(settings)


def log_training_reward(settings: EnvSettings, reward_clipping: str) -> None:
    """Says which reward trains the agent where it is not the env's own (a Riverraid reward
    proxy), with a warning where ``reward_clipping`` hides it."""
    family_of(settings.env).log_training_reward(settings, reward_clipping)


@contextlib.contextmanager
def environment_errors(doing: str = "failed") -> Iterator[None]:
    """What the environment's own code raises as one line (EnvError), its traceback logged
    above it, as training says an actor's failure; ``doing`` says when: "failed as it
    was made"."""
    try:
        yield
    # Ours (an EnvError, a picture --video cannot take) or a package to install: one line.
    except (UserError, gym.error.DependencyNotInstalled, KeyboardInterrupt):
        raise
    except Exception as error:
        logging.getLogger("torchbeast").error(
            "The environment %s:\n%s", doing, traceback.format_exc()
        )
        raise EnvError(
            f"the environment {doing}: {type(error).__name__}: {error} (traceback above)"
        ) from error


def env_spec(settings: EnvSettings | str) -> EnvSpec:
    """Observation shape/dtype and number of actions, from one throwaway env."""
    with environment_errors("failed as it was made"):
        env = create_env(settings, num_envs=1)
    try:
        return env.spec
    finally:
        env.close()

"""What the learner needs to know about an environment (no torch here: env servers use it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchbeast.core.errors import shown

# The rollout's own per-episode columns (episode_return, ...), logs.csv's mean_episode_length,
# eval's own figures (episode_length, proxy_return, each return's *_per_step) and eval.json's
# other fields (an extra's figure sits beside them, and took their place): no extra may take
# their names.
RESERVED_EXTRA_NAMES = frozenset(
    ("return", "step", "end", "length", "episode_length", "proxy_return")
    + ("xpid", "env", "num_episodes", "policy", "actions", "parameters", "episodes")
    + ("reward_proxy", "trained_with_reward_proxy")
)
MAX_EXTRA_NAME_LENGTH = 64
# The observation dtypes a rollout stores and an env stream sends; an env's float64
# observations are accepted and stored as float32.
STORED_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float32", "bool")
ACCEPTED_DTYPES = (*STORED_DTYPES, "float64")


@dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an environment.

    ``episode_extras``: the names of the extra per-episode figures the environment reports
    besides its return (Riverraid with a reward proxy: its true return and move). Each
    travels in the rollout as ``episode_<name>`` and is logged as ``mean_episode_<name>``.
    """

    env_id: str
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    num_actions: int
    episode_extras: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "episode_extras", tuple(self.episode_extras))
        problem = _extras_problem(self.episode_extras)
        if problem is not None:
            raise ValueError(f"{self.env_id}: {problem}")

    @property
    def extra_keys(self) -> tuple[str, ...]:
        """The rollout columns of the episode extras: ``episode_<name>`` each."""
        return tuple(extra_key(name) for name in self.episode_extras)


def extra_key(name: str) -> str:
    """The rollout column of the episode extra ``name``."""
    return f"episode_{name}"


def _extras_problem(names: tuple[str, ...]) -> str | None:
    """Why ``names`` cannot be an environment's episode extras, or None if they can: each
    becomes a column name, in rollouts and in logs.csv."""
    for name in names:
        if not (
            isinstance(name, str)
            and name.isidentifier()
            and name.isascii()
            and len(name) <= MAX_EXTRA_NAME_LENGTH
        ):
            return (
                f"episode extra {shown(name)} is not a name of at most {MAX_EXTRA_NAME_LENGTH} "
                "ASCII letters, digits and underscores"
            )
        base = name.removesuffix("_per_step")  # eval's figure of each return per step
        if name in RESERVED_EXTRA_NAMES or (
            base != name and (base == "return" or base.endswith("_return"))
        ):
            return (
                f"episode extra {shown(name)} would clash with a figure of torchbeast's own "
                "(episode_return, episode_length, proxy_return, *_return_per_step, eval.json's "
                "fields): rename it"
            )
    if len(set(names)) != len(names):
        return f"episode extras {shown(', '.join(names))} name one figure twice"
    return None

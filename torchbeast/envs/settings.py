"""What the environments of a run are: built once from the flags at the edge
(``torchbeast.config``), and small enough to hand to every actor and env process."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvSettings:
    """The env flags of the same names. ``env`` is None only where the run's checkpoint
    names it (a PolyBeast learner resuming, test and eval modes): the command resolves it
    into a new EnvSettings before it makes an environment."""

    env: str | None
    seed: int | None = None
    no_fire_on_life_loss: bool = False
    # Riverraid's reward proxy (envs.riverraid); None: not given.
    fuel_multiplier: float | None = None
    move_penalty: float | None = None
    true_move_penalty: float | None = None

"""What the environments of a run are: built once from the flags at the edge
(``torchbeast.config``), and small enough to hand to every actor and env process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from torchbeast.core.settings import RUN, flag


@dataclass(frozen=True)
class EnvSettings:
    """The env flags of the same names. ``env`` is None only where the run's checkpoint
    names it (a PolyBeast learner resuming, test and eval modes): the command resolves it
    into a new EnvSettings before it makes an environment.

    ``options``: the flags the environment families add (``envs.family``), by name, every
    family's (the env id may come from a checkpoint later); a mapping is kept as sorted
    (name, value) pairs."""

    flags_group: ClassVar[str] = RUN

    env: str | None = flag("PongNoFrameskip-v4", "Gymnasium environment id.")
    seed: int | None = flag(
        None,
        "(new) Seed for the environments and the model (default: drawn at random in "
        "training, and recorded in meta.json and the log, so that a run can be repeated).",
        check="seed",
    )
    options: tuple[tuple[str, object], ...] | Mapping[str, object] = ()

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))

    def option(self, name: str, default: object = None) -> object:
        """The family flag ``name`` (``default`` where the command had no such flag)."""
        return dict(self.options).get(name, default)

"""A training run's checkpoint: resuming from the xpid's model.tar (refusing one of another
run) and saving the learner's state into it with what the run was trained with."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from torchbeast.core import checkpoint
from torchbeast.core.errors import RunFolderError, os_error_in, write_failure

if TYPE_CHECKING:
    import torch

    from torchbeast.config.settings import Settings
    from torchbeast.core.learner import Learner
    from torchbeast.core.spec import EnvSpec
    from torchbeast.runtime.progress import Progress

log = logging.getLogger("torchbeast")

# Settings that shape only what a new run starts from: a resumed run's model and optimizer
# state come from its checkpoint.
ONLY_AT_START = ("weight_init", "rmsprop_init")


def not_restored_line(replays: bool) -> str:
    """What a resumed run does not get back from its checkpoint, for its log."""
    parts = [
        "the episodes in progress (each env starts a new one)",
        "the random generators' states",
    ]
    if replays:
        parts.insert(0, "LASER's replay (it starts empty: on-policy batches until it holds "
                     "--learn_start transitions)")  # fmt: skip
    return "Not restored from the checkpoint: " + ", ".join(parts) + "."


def learning_settings(settings: Settings) -> dict[str, object]:
    """The run's settings that shape what it learns, by flag name: the learner's (loss,
    optimizer, batch shape, length), the replay's, the model's starting weights and the env
    family's options (e.g. a reward proxy)."""
    values: dict[str, object] = dict(settings.env.options)
    for part in (settings.learner, settings.replay, settings.model):
        values.update(
            (field.name, getattr(part, field.name))
            for field in dataclasses.fields(part)
            if "flag" in field.metadata
        )
    return values


def changes_line(saved_flags: dict, settings: Settings) -> str | None:
    """The line that says which settings of a resumed run differ from those its checkpoint
    was trained with, and what becomes of them; None where none differ."""
    changed = {
        name: (saved_flags[name], value)
        for name, value in learning_settings(settings).items()
        if name in saved_flags and saved_flags[name] != value
    }
    if not changed:
        return None

    def listed(names: list[str]) -> str:
        return ", ".join(f"--{name} {changed[name][1]} (was {changed[name][0]})" for name in names)

    applied = [name for name in changed if name not in ONLY_AT_START]
    ignored = [name for name in changed if name in ONLY_AT_START]
    parts = []
    if applied:
        parts.append(f"{listed(applied)}: this run uses them")
    if ignored:
        parts.append(f"{listed(ignored)}: only a new run starts from them, no effect")
    return "Resumed with settings other than the checkpoint's: " + "; ".join(parts) + "."


class RunCheckpoint:
    """A training run's checkpoint at ``path``: the learner's state, resumed from and
    saved to with what the run trains on (env, spec, model, flags)."""

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        config: dict,
        learner: Learner,
        progress: Progress,
        path: str,
    ):
        self.settings = settings
        self.progress = progress
        self.run = settings.run
        self.env_spec = env_spec
        self.config = config
        self.learner = learner
        self.path = path
        self.changes: str | None = None  # after a resume: the settings the command changed
        self.saved_step: int | None = None  # the step the checkpoint on disk holds

    def resume_if_possible(self, device: torch.device) -> bool:
        """Loads model.tar of this xpid if there is one; refuses one of another run."""
        if not os.path.exists(self.path):
            return False
        state = checkpoint.load(self.path, map_location=device)
        checkpoint.check_compatible(state, self.env_spec.env_id, self.config, self.path)
        checkpoint.check_spec(state, self.env_spec, self.path)
        checkpoint.check_optimizer(state, self.settings.learner.optimizer, self.path)
        try:
            self.learner.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as error:  # e.g. another number of actions
            first_line = str(error).strip().splitlines()[0]
            raise checkpoint.CheckpointError(
                f"checkpoint {self.path} does not fit this run's model ({first_line}): "
                "use the environment and flags it was trained with, or another --xpid"
            ) from None
        self.changes = changes_line(state.get("flags", {}), self.settings)
        self.progress.load_state_dict(state.get("progress", {}))
        self.saved_step = self.learner.step
        return True

    def save(self) -> None:
        if self.run.disable_checkpoint:
            return
        with self.learner.lock:
            state = self.learner.state_dict()
            state.update(
                flags=self.run.recorded_flags(self.env_spec.env_id),
                env=self.env_spec.env_id,
                env_spec=checkpoint.spec_state(self.env_spec),
                model_config=self.config,
                progress=self.progress.state_dict(),
            )
            log.info("Saving checkpoint to %s (step %d)", self.path, self.learner.step)
            try:
                checkpoint.save(self.path, state)
            except (OSError, RuntimeError) as error:  # torch wraps a failed write in its own
                if os_error_in(error) is None:
                    raise
                raise RunFolderError(
                    f"cannot write the checkpoint {self.path} ({write_failure(error)})"
                ) from None
            self.saved_step = self.learner.step

    def on_disk(self) -> str:
        """What the checkpoint on disk holds, for the line that stops a run."""
        if self.saved_step is None:
            return "no checkpoint could be written"
        return f"the checkpoint {self.path} holds step {self.saved_step}"

"""A training run's checkpoint: resuming from the xpid's model.tar (refusing one of another
run) and saving the learner's state into it with what the run was trained with."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from torchbeast.core import checkpoint

if TYPE_CHECKING:
    import torch

    from torchbeast.config.settings import RunSettings, Settings
    from torchbeast.core.learner import Learner
    from torchbeast.core.spec import EnvSpec

log = logging.getLogger("torchbeast")


class Checkpointing:
    """The Trainer's checkpoint at ``checkpoint_path``; the Trainer sets these attributes."""

    settings: Settings
    run: RunSettings
    env_spec: EnvSpec
    config: dict
    device: torch.device
    learner: Learner
    checkpoint_path: str

    def resume_if_possible(self) -> bool:
        """Loads model.tar of this xpid if there is one; refuses one of another run."""
        if not os.path.exists(self.checkpoint_path):
            return False
        state = checkpoint.load(self.checkpoint_path, map_location=self.device)
        checkpoint.check_compatible(state, self.env_spec.env_id, self.config, self.checkpoint_path)
        checkpoint.check_spec(state, self.env_spec, self.checkpoint_path)
        checkpoint.check_optimizer(state, self.settings.learner.optimizer, self.checkpoint_path)
        try:
            self.learner.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as error:  # e.g. another number of actions
            first_line = str(error).strip().splitlines()[0]
            raise checkpoint.CheckpointError(
                f"checkpoint {self.checkpoint_path} does not fit this run's model ({first_line}): "
                "use the environment and flags it was trained with, or another --xpid"
            ) from None
        return True

    def save_checkpoint(self) -> None:
        if self.run.disable_checkpoint:
            return
        with self.learner.lock:
            state = self.learner.state_dict()
            state.update(
                flags=self.run.recorded_flags(self.env_spec.env_id),
                env=self.env_spec.env_id,
                env_spec=checkpoint.spec_state(self.env_spec),
                model_config=self.config,
            )
            log.info("Saving checkpoint to %s (step %d)", self.checkpoint_path, self.learner.step)
            checkpoint.save(self.checkpoint_path, state)

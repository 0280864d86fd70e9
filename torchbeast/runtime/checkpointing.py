"""A training run's checkpoint: resuming from the xpid's model.tar (refusing one of another
run) and saving the learner's state into it with what the run was trained with."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from torchbeast.core import checkpoint

if TYPE_CHECKING:
    import torch

    from torchbeast.config.settings import Settings
    from torchbeast.core.learner import Learner
    from torchbeast.core.spec import EnvSpec

log = logging.getLogger("torchbeast")


class RunCheckpoint:
    """A training run's checkpoint at ``path``: the learner's state, resumed from and
    saved to with what the run trains on (env, spec, model, flags)."""

    def __init__(
        self, settings: Settings, env_spec: EnvSpec, config: dict, learner: Learner, path: str
    ):
        self.settings = settings
        self.run = settings.run
        self.env_spec = env_spec
        self.config = config
        self.learner = learner
        self.path = path

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
            )
            log.info("Saving checkpoint to %s (step %d)", self.path, self.learner.step)
            checkpoint.save(self.path, state)

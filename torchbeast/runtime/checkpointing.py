"""A training run's checkpoint: resuming from the xpid's model.tar (refusing one of another
run) and saving the learner's state into it with what the run was trained with: the
weights and optimizer, the progress line's episode window, the learner process's random
generator (it draws LASER's replayed rollouts) and how many times the run has started
(each start's actors take seeds no earlier start used). LASER's replay goes into a file
beside it, replay.tar, bounded by ``--replay_checkpoint_gib``."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from torchbeast import envs
from torchbeast.core import checkpoint
from torchbeast.core.errors import (
    RunFolderError,
    first_line,
    os_error_in,
    shown,
    write_failure,
)
from torchbeast.core.rollout import rollout_spec
from torchbeast.core.weights import model_is_sound

if TYPE_CHECKING:
    from torchbeast.config.settings import Settings
    from torchbeast.core.learner import Learner
    from torchbeast.core.replay import Replay
    from torchbeast.core.spec import EnvSpec
    from torchbeast.runtime.progress import Progress

log = logging.getLogger("torchbeast")

# Settings that shape only what a new run starts from: a resumed run's model and optimizer
# state come from its checkpoint.
ONLY_AT_START = ("weight_init", "rmsprop_init")


REPLAY_FILE_NAME = "replay.tar"  # LASER's replay, beside model.tar

# A run's n-th start numbers its actors' incarnations from (n - 1) times this, so that its
# actors' seeds (``runtime.acting.actor_seed``) differ from every earlier start's.
INCARNATIONS_PER_START = 2**16

NOT_RESTORED_LINE = (
    "Not restored from the checkpoint: the episodes in progress (each env starts a new "
    "one, from seeds no earlier start of this run used)."
)


def learning_settings(settings: Settings) -> dict[str, object]:
    """The run's settings that shape what it learns, by flag name, but its env's: the
    learner's (loss, optimizer, batch shape, length), the replay's and the model's
    starting weights."""
    values: dict[str, object] = {}
    for part in (settings.learner, settings.replay, settings.model):
        values.update(
            (field.name, getattr(part, field.name))
            for field in dataclasses.fields(part)
            if "flag" in field.metadata
        )
    return values


def changes_line(
    saved_flags: dict, settings: Settings, env_id: str, run_flags: Mapping[str, object]
) -> str | None:
    """The line that says which settings of a resumed run differ from those its checkpoint
    was trained with, and what becomes of them; None where none differ. The env family's
    flags (a reward proxy) are those the run's envs are made with, from ``run_flags`` (a
    PolyBeast learner told no --env: its checkpoint's), compared as the family compares
    them (``EnvFamily.compared_options``: ``--move_penalty 0`` is ``--fuel_multiplier 1
    --move_penalty 0``)."""
    changed = {
        name: (saved_flags[name], value)
        for name, value in learning_settings(settings).items()
        if name in saved_flags and saved_flags[name] != value
    }
    names = [name for name, _ in settings.env.options]
    compared = envs.family_of(env_id).compared_options
    before, now = (
        compared({name: flags[name] for name in names if flags.get(name) is not None})
        for flags in (saved_flags, run_flags)
    )
    changed.update(
        (name, (before.get(name), now.get(name)))
        for name in names
        if name in saved_flags and before.get(name) != now.get(name)
    )
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


# What a run resumes from (``Learner.load_state_dict``); the other fields are newer.
RESUMED_FIELDS = ("model_state_dict", "optimizer_state_dict", "scheduler_state_dict", "step")


def read_resumable(
    path: str, settings: Settings, env_spec: EnvSpec, config: dict, device: torch.device
) -> dict | None:
    """The checkpoint at ``path`` that the run resumes from, or None where there is none;
    one of another run (env, observations, model, optimizer) or damaged is refused here,
    before the run builds its learner or starts a process (whether it fits the model is
    known only once the learner loads it)."""
    if not os.path.exists(path):
        return None
    state = checkpoint.load(path, map_location=device)
    checkpoint.check_compatible(state, env_spec.env_id, config, path)
    checkpoint.check_spec(state, env_spec, path)
    checkpoint.check_optimizer(state, settings.learner.optimizer, path)
    if missing := [key for key in RESUMED_FIELDS if key not in state]:
        raise checkpoint.CheckpointError(
            f"{path} is damaged: it has no {missing[0]}: {checkpoint.RESTORE_IT}"
        )
    return state


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
        flags: dict[str, object],
        replay: Replay | None = None,
        saved_state: dict | None = None,
    ):
        """``flags``: what the checkpoint records as the run's flags (``Trainer``'s
        ``recorded_flags``); ``saved_state``: the checkpoint at ``path`` as
        :func:`read_resumable` read and checked it (None where there is none)."""
        self.settings = settings
        self.progress = progress
        self.run = settings.run
        self.env_spec = env_spec
        self.config = config
        self.learner = learner
        self.path = path
        self.replay = replay  # LASER's, saved beside the checkpoint
        self.replay_path = os.path.join(os.path.dirname(path), REPLAY_FILE_NAME)
        self.changes: str | None = None  # after a resume: the settings the command changed
        self.replay_line: str | None = None  # after a resume: what became of the replay
        self.flags = flags
        self.saved_step: int | None = None  # the step the checkpoint on disk holds
        self.starts = 1  # this start of the run is its n-th
        self.saved_state = saved_state
        self.resumed = False  # from saved_state

    def first_incarnation(self) -> int:
        """Where this start numbers its actors' incarnations from."""
        return (self.starts - 1) * INCARNATIONS_PER_START

    def summary(self) -> str:
        """What a resumed run goes on from, as the checkpoint's lines say it (saved and
        resumed alike): "step 1200, mean return 21.5 (last 100 episodes), learning rate
        0.000632"."""
        return (
            f"step {self.learner.step}, {self.progress.window_text()}, "
            f"learning rate {self.learner.optimizer.param_groups[0]['lr']:.6g}"
        )

    def resume_if_possible(self) -> bool:
        """Resumes from the checkpoint ``read_resumable`` read, if there was one (once:
        a second call says whether the first resumed)."""
        state, self.saved_state = self.saved_state, None  # held no longer than needed
        if state is None:
            return self.resumed
        try:
            self.learner.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as error:  # e.g. another number of actions
            raise checkpoint.CheckpointError(
                f"checkpoint {self.path} does not fit this run's model ({first_line(error)}): "
                "use the environment and flags it was trained with, or another --xpid"
            ) from None
        saved_flags = state.get("flags", {})
        self.changes = changes_line(saved_flags, self.settings, self.env_spec.env_id, self.flags)
        # What the run started from stays its record: a later start told nothing would
        # otherwise read "--weight_init pytorch (was ...)" of a flag that had no effect.
        started_from = {name: saved_flags[name] for name in ONLY_AT_START if name in saved_flags}
        self.flags = {**self.flags, **started_from}
        self.progress.load_state_dict(state.get("progress", {}))
        restore_random_state(state.get("rng", {}))
        self.starts = int(state.get("starts", 1)) + 1
        self.saved_step = self.learner.step
        if self.replay is not None:
            self.replay_line = self.restore_replay()
        self.resumed = True
        return True

    def restore_replay(self) -> str:
        """Fills LASER's replay from the file beside the checkpoint; the line that says
        what it holds, or why it starts empty (the replay is worth keeping, not worth
        stopping a run for)."""
        empty = "LASER's replay starts empty (on-policy batches until it holds --learn_start)"
        if self.settings.replay.replay_checkpoint_gib == 0:  # a file there is an older start's
            return f"{empty}: --replay_checkpoint_gib 0."
        if not os.path.exists(self.replay_path):
            return f"{empty}: no {REPLAY_FILE_NAME} beside the checkpoint."
        spec = rollout_spec(self.env_spec, self.settings.learner.unroll_length)
        layout = {key: (torch.Size(shape[1:]), dtype) for key, (shape, dtype) in spec.items()}
        shapes = [tensor.shape for tensor in self.learner.model.initial_state(1)]
        try:
            if damaged := checkpoint.damaged_entry(self.replay_path):
                raise ValueError(f"its {damaged} does not match its checksum")
            state = torch.load(self.replay_path, weights_only=True)
            self.replay.load_state_dict(state, layout, self.settings.learner.unroll_length, shapes)
        except Exception as error:  # a damaged file, another run's rollouts
            reason = shown(first_line(error, "unreadable"))
            return f"{empty}: {self.replay_path} does not fit this run ({reason})."
        transitions = self.replay.transitions
        return f"Restored LASER's replay from {self.replay_path}: {transitions} transitions."

    def save(self) -> None:
        if self.run.disable_checkpoint:
            return
        with self.learner.lock:
            if not model_is_sound(self.learner.model, self.env_spec):  # the last good one stays
                log.warning(
                    "Not saving the checkpoint: the model's weights or outputs are non-finite "
                    "(%s).",
                    self.good_one(),
                )
                return
            state = self.learner.state_dict()
            state.update(
                flags=self.flags,
                env=self.env_spec.env_id,
                env_spec=checkpoint.spec_state(self.env_spec),
                model_config=self.config,
                progress=self.progress.state_dict(),
                rng=random_state(),
                starts=self.starts,
            )
            log.info("Saving checkpoint to %s (%s).", self.path, self.summary())
            write(self.path, state, "the checkpoint")
            self.saved_step = self.learner.step
        if self.replay is not None:
            self.save_replay()
        elif os.path.exists(self.replay_path):  # an earlier start's: stale beside this one
            os.unlink(self.replay_path)
            log.info("Removed %s, an earlier start's: this one has no replay.", self.replay_path)

    def save_replay(self) -> None:
        """Saves LASER's newest transitions, up to --replay_checkpoint_gib, beside the
        checkpoint; with 0, removes an earlier start's file, which would be stale."""
        limit = self.settings.replay.replay_checkpoint_gib
        if limit == 0:
            if os.path.exists(self.replay_path):
                os.unlink(self.replay_path)
            return
        per_transition = max(1, self.replay.file_bytes_per_transition())
        state = self.replay.state_dict(int(limit * 2**30 // per_transition))
        saved = sum(len(segment["steps"]["done"]) for segment in state["segments"])
        write(self.replay_path, state, "LASER's replay")
        log.info(
            "Saved LASER's replay beside it: %d of its %d transitions (%.1f MiB).",
            saved,
            self.replay.transitions,
            os.path.getsize(self.replay_path) / 2**20,
        )

    def good_one(self) -> str:
        """What stays on disk where the weights broke: "the checkpoint ... holds step N,
        its last good weights", or that there is none."""
        if self.saved_step is None:
            return "no checkpoint was written before the weights broke"
        return f"{self.on_disk()}, its last good weights"

    def on_disk(self) -> str:
        """What the checkpoint on disk holds, for the line that stops a run: with
        --disable_checkpoint, none, or the one this run resumed from, as it was."""
        if self.saved_step is None:
            if self.run.disable_checkpoint:
                return "no checkpoint (--disable_checkpoint)"
            return "no checkpoint could be written"
        if self.run.disable_checkpoint:
            return (
                f"the checkpoint {self.path} holds step {self.saved_step}, where this run "
                "resumed (--disable_checkpoint saved nothing since)"
            )
        return f"the checkpoint {self.path} holds step {self.saved_step}"


def write(path: str, state: dict, what: str) -> None:
    """Writes ``state`` atomically to ``path``; RunFolderError where the folder cannot
    take it (e.g. a full disk): the file there before stays whole."""
    try:
        checkpoint.save(path, state)
    except (OSError, RuntimeError) as error:  # torch wraps a failed write in its own
        if os_error_in(error) is None:
            raise
        raise RunFolderError(f"cannot write {what} {path} ({write_failure(error)})") from None


def random_state() -> dict[str, object]:
    """The learner process's random generators (CPU, and CUDA where it is used)."""
    state: dict[str, object] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_random_state(state: dict) -> None:
    """Goes on with the checkpoint's random generators where they fit this process (a
    checkpoint of a CUDA run resumed on the CPU keeps only the CPU's). The states may
    arrive on the learner's device (the checkpoint is loaded there); PyTorch takes them
    only from the CPU."""
    generator = state.get("torch")
    current = torch.get_rng_state()
    if (
        isinstance(generator, torch.Tensor)
        and generator.dtype == current.dtype
        and generator.shape == current.shape
    ):
        torch.set_rng_state(generator.cpu())
    devices = state.get("cuda")
    if (
        isinstance(devices, list)
        and torch.cuda.is_available()
        and len(devices) == torch.cuda.device_count()
    ):
        torch.cuda.set_rng_state_all([device_state.cpu() for device_state in devices])

"""Checkpoints: written atomically, loaded with ``weights_only=True``."""

from __future__ import annotations

import dataclasses
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from torchbeast.core.errors import SHOWN_CHARS, UserError, first_line, shown
from torchbeast.core.files import replaced_whole
from torchbeast.core.spec import EnvSpec

FILE_NAME = "model.tar"  # in the run's folder, savedir/xpid


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, unreadable, or belongs to another env or model."""


def path_in(run_dir: str) -> str:
    """The checkpoint of the run whose folder is ``run_dir``."""
    return os.path.join(run_dir, FILE_NAME)


def saved_env_id(state: dict, path: str) -> str:
    """The env id a checkpoint records; one clear error for a file that has none."""
    if "env" not in state:
        raise CheckpointError(f"{path} is not a torchbeast checkpoint (no env)")
    env_id = state["env"]
    if not (isinstance(env_id, str) and env_id.isprintable() and len(env_id) <= SHOWN_CHARS):
        # What follows names the env id in its lines: it must be a name, not a page.
        raise CheckpointError(f"{path} is damaged: its env id {shown(env_id)} is not a name")
    return env_id


def save(path: str, state: dict) -> None:
    """Writes ``state`` to ``path`` whole or not at all (``files.replaced_whole``), on disk
    before it takes the old file's place; readable as the run's other files are (the
    umask's mode, not a temporary file's 0600: a colleague evaluates it too)."""
    with replaced_whole(Path(path)) as temporary, open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def load(path: str, map_location: str | torch.device = "cpu") -> dict:
    if not os.path.exists(path):
        raise CheckpointError(
            f"no checkpoint at {path}: train first (--mode train with the same --xpid "
            "and --savedir), or pass the --xpid/--savedir of a trained run"
        )
    try:
        if damaged := damaged_entry(path):
            raise CheckpointError(f"its {shown(damaged)} does not match its checksum")
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        # torch's advice on this one would run the file's code
        if "Weights only load failed" in str(error):
            reason = "it holds objects other than tensors and plain values"
        else:
            reason = first_line(error)
        raise CheckpointError(
            f"{path} is not a torchbeast checkpoint or is damaged ({reason}): restore it from "
            "a copy, or move it away to start the run anew (do not load it with "
            "weights_only=False, which would run any code it holds)"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a torchbeast checkpoint (not a dictionary)")
    for key, kind in FIELD_TYPES.items():
        if key in state and not is_a(state[key], kind):
            raise CheckpointError(
                f"{path} is damaged: its {key} is {type(state[key]).__name__}, not "
                f"{kind.__name__}: {RESTORE_IT}"
            )
    return state


def damaged_entry(path: str) -> str | None:
    """The first entry of the archive at ``path`` whose bytes do not match the CRC-32 that
    torch.save wrote for them, or None. torch.load does not check these: a file with
    bytes zeroed inside (a bad disk, a copy cut and patched) loads with wrong weights. A
    file that is no zip archive is left to torch.load to refuse (or to read, if it is one
    of torch's older formats)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except zipfile.BadZipFile:
        return None


# A checkpoint's fields and their types (older checkpoints lack some): a field of another
# type is one line as the file loads, not a traceback where the field is first used.
FIELD_TYPES: dict[str, type] = {
    **dict.fromkeys(("model_state_dict", "optimizer_state_dict", "scheduler_state_dict"), dict),
    **dict.fromkeys(("flags", "env_spec", "model_config", "progress", "rng", "value_scale"), dict),
    **dict.fromkeys(("step", "updates", "starts"), int),
    "env": str,
}
RESTORE_IT = "restore it from a copy, or move it away to start the run anew"


def is_a(value: object, kind: type) -> bool:
    """isinstance, where a bool is no int."""
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def spec_state(spec: EnvSpec) -> dict:
    """The env spec as plain values, for a checkpoint."""
    return dict(
        env_id=spec.env_id,
        observation_shape=list(spec.observation_shape),
        observation_dtype=np.dtype(spec.observation_dtype).name,
        num_actions=spec.num_actions,
        episode_extras=list(spec.episode_extras),
    )


def saved_spec(state: dict, path: str = "the checkpoint") -> EnvSpec | None:
    """The env spec a checkpoint was trained on (None for checkpoints older than the field;
    no episode extras for those older than that field: see ``saves_episode_extras``);
    CheckpointError for one that cannot be read (``path``: the file, for the line)."""
    saved = state.get("env_spec")
    if saved is None:
        return None
    try:
        return EnvSpec(
            str(saved["env_id"]),
            tuple(int(size) for size in saved["observation_shape"]),
            np.dtype(saved["observation_dtype"]),
            int(saved["num_actions"]),
            tuple(str(name) for name in saved.get("episode_extras", ())),
        )
    except (KeyError, TypeError, ValueError) as error:
        reason = shown(first_line(error, type(error).__name__), quote=False)
        raise CheckpointError(
            f"{path} is damaged: its env spec cannot be read ({reason}): {RESTORE_IT}"
        ) from None


def saves_episode_extras(state: dict) -> bool:
    """Whether the checkpoint's env spec names the env's episode extras (older ones do not)."""
    return "episode_extras" in state.get("env_spec", {})


def check_spec(state: dict, spec: EnvSpec, path: str) -> None:
    """Refuses a checkpoint trained on an environment with other observations or actions.
    (The episode extras may differ: they are logged, not learned from.)"""
    saved = saved_spec(state, path)
    if saved is not None and dataclasses.replace(saved, episode_extras=spec.episode_extras) != spec:
        raise CheckpointError(
            f"checkpoint {path} was trained on {describe_spec(saved)}, but the environment "
            f"now is {describe_spec(spec)}: use the environment and flags it was trained "
            "with, or another --xpid"
        )


def describe_spec(spec: EnvSpec) -> str:
    """``CartPole-v1 (float32 [4], 2 actions)``, with ``, episode extras a, b`` if any."""
    names = shown(", ".join(spec.episode_extras), quote=False)  # a checkpoint's, maybe
    extras = f", episode extras {names}" if spec.episode_extras else ""
    return (
        f"{shown(spec.env_id, quote=False)} ({np.dtype(spec.observation_dtype).name} "
        f"{list(spec.observation_shape)}, {spec.num_actions} actions{extras})"
    )


def check_optimizer(state: dict, optimizer: str, path: str) -> None:
    """Refuses to resume with another optimizer: its saved state would not fit."""
    saved = state.get("flags", {}).get("optimizer", "rmsprop")  # older checkpoints: RMSprop
    if saved != optimizer:
        saved = shown(saved, quote=False)
        raise CheckpointError(
            f"checkpoint {path} was trained with --optimizer {saved}, not {optimizer}: "
            f"pass --optimizer {saved}, or another --xpid"
        )


def check_compatible(state: dict, env_id: str, model_config: dict, path: str) -> None:
    """Refuses a checkpoint trained on another environment or with another model."""
    if "env" not in state or "model_config" not in state:
        raise CheckpointError(f"{path} is not a torchbeast checkpoint (no env or model config)")
    saved_env = state["env"]
    if saved_env != env_id:
        saved_env = shown(saved_env, quote=False)  # the file's: bounded, on one line
        raise CheckpointError(
            f"checkpoint {path} was trained on {saved_env}, not {env_id}: "
            f"pass --env {saved_env}, or another --xpid"
        )
    saved_model = state["model_config"]
    if not isinstance(saved_model, dict):
        raise CheckpointError(f"{path} is damaged: its model config is no table: {RESTORE_IT}")
    if saved_model != model_config:
        keys = sorted({*model_config, *map(str, saved_model)})  # a key of the file's alone too
        differences = ", ".join(
            f"{shown(key, quote=False)} {shown(saved_model.get(key), quote=False)} "
            f"(given {model_config.get(key)})"
            for key in keys
            if saved_model.get(key) != model_config.get(key)
        )
        raise CheckpointError(
            f"checkpoint {path} holds another model: {differences}; "
            "pass the model flags it was trained with (--use_lstm, --use_resnet, --torso, "
            "--hidden_size, --num_layers)"
        )

"""Specification of checkpoints: round trip, clear errors, compatibility, atomic writes."""

import dataclasses
import os
import zipfile

import numpy as np
import pytest
import torch

from tests.settings_for_tests import learner_settings
from torchbeast.core import checkpoint
from torchbeast.core.checkpoint import CheckpointError
from torchbeast.core.errors import first_line
from torchbeast.core.learner import Learner
from torchbeast.core.models import create_model, model_config
from torchbeast.core.settings import ModelSettings
from torchbeast.core.spec import EnvSpec

OBSERVATION_SHAPE = (4,)


def training_state() -> dict:
    """A checkpoint as a training run writes it: learner state, flags, env, model config."""
    config = model_config(ModelSettings(use_lstm=True), OBSERVATION_SHAPE)
    torch.manual_seed(0)
    learner = Learner(learner_settings(), create_model(config, OBSERVATION_SHAPE, 2))
    flags = dict(env="CartPole-v1", use_lstm=True, optimizer="rmsprop")  # as recorded
    return dict(learner.state_dict(), flags=flags, env="CartPole-v1", model_config=config)


def assert_same_state(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        if isinstance(expected[key], torch.Tensor):
            assert torch.equal(actual[key], expected[key]), key
        elif isinstance(expected[key], dict):
            assert_same_state(actual[key], expected[key])
        else:
            assert actual[key] == expected[key], key


def test_save_then_load_gives_the_state_back(tmp_path):
    path = str(tmp_path / "model.tar")
    state = training_state()
    checkpoint.save(path, state)
    assert_same_state(checkpoint.load(path), state)


def test_save_replaces_an_older_checkpoint(tmp_path):
    path = str(tmp_path / "model.tar")
    checkpoint.save(path, dict(step=1))
    checkpoint.save(path, dict(step=2))
    assert checkpoint.load(path) == dict(step=2)


def test_a_checkpoint_is_readable_as_the_runs_other_files_are(tmp_path):
    # It was written as a temporary file (mode 0600): a colleague could not evaluate it.
    previous = os.umask(0o022)
    try:
        checkpoint.save(str(tmp_path / "model.tar"), training_state())
        (tmp_path / "logs.csv").write_text("")
    finally:
        os.umask(previous)
    mode = os.stat(tmp_path / "model.tar").st_mode & 0o777
    assert mode == os.stat(tmp_path / "logs.csv").st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp_path)) == ["logs.csv", "model.tar"]  # no temporary file


def test_loaded_state_restores_a_learner(tmp_path):
    path = str(tmp_path / "model.tar")
    state = training_state()
    checkpoint.save(path, state)
    config = model_config(ModelSettings(use_lstm=True), OBSERVATION_SHAPE)
    learner = Learner(learner_settings(), create_model(config, OBSERVATION_SHAPE, 2))
    learner.load_state_dict(checkpoint.load(path))
    assert_same_state(learner.state_dict()["model_state_dict"], state["model_state_dict"])


def test_load_of_a_missing_path_names_it_and_the_fix(tmp_path):
    path = str(tmp_path / "run" / "model.tar")
    with pytest.raises(CheckpointError) as error:
        checkpoint.load(path)
    assert f"no checkpoint at {path}" in str(error.value)
    assert "train first" in str(error.value)
    assert "--xpid" in str(error.value)


def test_load_of_a_file_that_is_not_a_checkpoint_says_it_is_damaged(tmp_path):
    path = tmp_path / "model.tar"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="damaged") as error:
        checkpoint.load(str(path))
    assert str(path) in str(error.value)


def test_load_of_a_truncated_checkpoint_says_it_is_damaged(tmp_path):
    path = tmp_path / "model.tar"
    checkpoint.save(str(path), training_state())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged"):
        checkpoint.load(str(path))


def zero_bytes_inside_a_tensor(path) -> None:
    """Zeroes 64 bytes in the middle of the checkpoint's largest stored tensor, as a bad
    disk or a patched copy would: the archive's layout stays as it was."""
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
        header = 30 + len(entry.filename.encode()) + len(entry.extra)
        start = entry.header_offset + header + entry.file_size // 2
    data = bytearray(path.read_bytes())
    data[start : start + 64] = bytes(64)
    path.write_bytes(bytes(data))


def test_load_of_a_checkpoint_with_bytes_zeroed_inside_says_it_is_damaged(tmp_path):
    path = tmp_path / "model.tar"
    checkpoint.save(str(path), training_state())
    zero_bytes_inside_a_tensor(path)
    damaged = path.read_bytes()
    # torch.load alone takes it, with the zeroed weights:
    torch.load(str(path), weights_only=True)
    with pytest.raises(CheckpointError) as error:
        checkpoint.load(str(path))
    message = str(error.value)
    assert "\n" not in message and f"{path} is not a torchbeast checkpoint or is damaged" in message
    assert "does not match its checksum" in message and checkpoint.RESTORE_IT in message
    assert path.read_bytes() == damaged  # left as it is


class RunsCode:
    """Unpickling this would create ``path``: what a malicious checkpoint does."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_load_refuses_pickled_code_with_one_line_that_does_not_advise_unsafe_loading(tmp_path):
    # weights_only: a checkpoint from elsewhere cannot run code when loaded.
    path, marker = tmp_path / "model.tar", tmp_path / "code-ran"
    torch.save(dict(step=1, payload=RunsCode(str(marker))), str(path))
    with pytest.raises(CheckpointError) as error:
        checkpoint.load(str(path))
    message = str(error.value)
    assert not marker.exists()
    assert "\n" not in message
    assert "is not a torchbeast checkpoint" in message
    assert "do not load it with weights_only=False" in message
    assert "trust" not in message  # torch's own advice, which would run the code


def test_check_spec_refuses_a_checkpoint_of_another_observation_or_action_count():
    cartpole = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 2)
    state = {"env_spec": checkpoint.spec_state(cartpole)}
    checkpoint.check_spec(state, cartpole, "model.tar")
    checkpoint.check_spec({}, cartpole, "model.tar")  # older checkpoints: nothing to check
    with pytest.raises(CheckpointError) as error:
        checkpoint.check_spec(state, EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 3), "m")
    assert "trained on CartPole-v1 (float32 [4], 2 actions)" in str(error.value)
    assert "now is CartPole-v1 (float32 [4], 3 actions)" in str(error.value)


def test_saved_spec_reads_back_what_spec_state_wrote():
    pong = EnvSpec("PongNoFrameskip-v4", (4, 84, 84), np.dtype("uint8"), 6)
    assert checkpoint.saved_spec({"env_spec": checkpoint.spec_state(pong)}) == pong


PLAIN = EnvSpec("tests.envs_for_tests:Coins-v0", (3,), np.dtype("float32"), 2)
WITH_EXTRAS = dataclasses.replace(PLAIN, episode_extras=("coins", "gems"))


def test_saved_spec_reads_back_the_episode_extras():
    state = {"env_spec": checkpoint.spec_state(WITH_EXTRAS)}
    assert checkpoint.saved_spec(state) == WITH_EXTRAS
    assert checkpoint.saves_episode_extras(state)


def test_a_checkpoint_older_than_the_episode_extras_still_loads_its_spec():
    older = checkpoint.spec_state(PLAIN)
    del older["episode_extras"]
    assert checkpoint.saved_spec({"env_spec": older}) == PLAIN
    assert not checkpoint.saves_episode_extras({"env_spec": older})
    assert not checkpoint.saves_episode_extras({})
    checkpoint.check_spec({"env_spec": older}, WITH_EXTRAS, "model.tar")


def test_check_spec_lets_a_run_resume_with_other_episode_extras():
    # They are logged, not learned from (e.g. Riverraid resumed without its proxy flags).
    state = {"env_spec": checkpoint.spec_state(WITH_EXTRAS)}
    checkpoint.check_spec(state, PLAIN, "model.tar")


@pytest.mark.parametrize(
    "env_spec",
    [
        {"env_id": "CartPole-v1", "observation_dtype": "float32", "num_actions": 2},
        {**checkpoint.spec_state(PLAIN), "observation_dtype": "no dtype"},
        "CartPole-v1",
    ],
)
def test_a_checkpoint_whose_env_spec_is_damaged_is_one_line(env_spec):
    # A missing key was a KeyError's traceback, in resume, play and PolyBeast's learner.
    with pytest.raises(CheckpointError) as error:
        checkpoint.check_spec({"env_spec": env_spec}, PLAIN, "run/model.tar")
    message = str(error.value)
    assert message.startswith("run/model.tar is damaged: its env spec cannot be read (")
    assert message.endswith(checkpoint.RESTORE_IT) and "\n" not in message


def test_a_model_config_key_only_the_checkpoint_has_is_named():
    # "holds another model: ; pass the model flags": the key was the file's alone.
    state = training_state()
    config = dict(state["model_config"])
    state["model_config"] = {**config, "width": 3}
    with pytest.raises(CheckpointError, match="holds another model: width 3 \\(given None\\);"):
        checkpoint.check_compatible(state, "CartPole-v1", config, "model.tar")


# A checkpoint is only used for the env and model it was trained with.


def test_check_compatible_accepts_the_same_env_and_model():
    state = training_state()
    checkpoint.check_compatible(state, "CartPole-v1", dict(state["model_config"]), "model.tar")


def test_check_compatible_refuses_another_env():
    state = training_state()
    with pytest.raises(CheckpointError) as error:
        checkpoint.check_compatible(state, "Acrobot-v1", state["model_config"], "run/model.tar")
    assert str(error.value) == (
        "checkpoint run/model.tar was trained on CartPole-v1, not Acrobot-v1: "
        "pass --env CartPole-v1, or another --xpid"
    )


def test_check_compatible_refuses_another_model_naming_the_difference():
    state = training_state()
    given = dict(state["model_config"], use_lstm=False, hidden_size=32)
    with pytest.raises(CheckpointError) as error:
        checkpoint.check_compatible(state, "CartPole-v1", given, "run/model.tar")
    message = str(error.value)
    assert "hidden_size 64 (given 32), use_lstm True (given False)" in message
    assert "--use_lstm" in message


# Saving is atomic.


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_failed_save_keeps_the_old_checkpoint_and_leaves_no_temp_file(tmp_path):
    path = str(tmp_path / "model.tar")
    old = training_state()
    checkpoint.save(path, old)
    broken = dict(training_state(), step=123, extra=Unpicklable())
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        checkpoint.save(path, broken)
    assert os.listdir(tmp_path) == ["model.tar"]
    assert_same_state(checkpoint.load(path), old)


def test_failed_first_save_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        checkpoint.save(str(tmp_path / "model.tar"), dict(extra=Unpicklable()))
    assert os.listdir(tmp_path) == []


def test_save_to_a_relative_path_writes_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint.save("model.tar", dict(step=5))
    assert os.listdir(tmp_path) == ["model.tar"]
    assert checkpoint.load(str(tmp_path / "model.tar")) == dict(step=5)


def test_a_checkpoints_own_strings_reach_a_refusal_bounded_and_on_one_line():
    state = training_state()
    state["env"] = "Forged\n[ERROR] another line" + "x" * 2**20
    with pytest.raises(CheckpointError) as error:
        checkpoint.check_compatible(state, "CartPole-v1", state["model_config"], "run/model.tar")
    message = str(error.value)
    assert "\n" not in message and len(message) < 700
    assert "Forged\\n[ERROR] another line" in message and f"({len(state['env'])} chars)" in message


def test_a_checkpoint_whose_env_id_is_not_a_name_is_refused_in_one_bounded_line():
    state = training_state()
    state["env"] = "CartPole-v1\n" * 100_000
    with pytest.raises(CheckpointError) as error:
        checkpoint.saved_env_id(state, "run/model.tar")
    message = str(error.value)
    assert message.startswith("run/model.tar is damaged: its env id 'CartPole-v1\\nCartPole")
    assert "\n" not in message and len(message) < 400


def test_a_damaged_checkpoint_is_one_line_saying_how_to_go_on(tmp_path):
    path = tmp_path / "model.tar"
    for damaged in (b"", b"garbage" * 10):
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError) as error:
            checkpoint.load(str(path))
        message = str(error.value)
        assert "\n" not in message and "is damaged" in message
        assert "restore it from a copy, or move it away to start the run anew" in message
        assert path.read_bytes() == damaged  # left as it is


def test_an_errors_reason_is_its_first_line_or_its_type_where_it_says_nothing():
    # An empty message (KeyError()) was an IndexError where a checkpoint did not fit.
    assert first_line(RuntimeError("size mismatch for fc.weight\n\tcopying a param")) == (
        "size mismatch for fc.weight"
    )
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("  \n "), "unreadable") == "unreadable"

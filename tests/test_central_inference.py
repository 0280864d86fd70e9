"""MonoBeast's central inference (--central_inference): the learner process chooses every
actor's actions in one batched forward pass; real actor processes, real environments."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.test_monobeast import (
    REPO,
    SMALL_RUN,
    monobeast,
    read_rows,
)
from torchbeast.core.models import create_model
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.mono_inference import PASS_PARTS, InferenceServer, InferenceSlots

SPEC = EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2)
LSTM = dict(kind="mlp", hidden_size=8, num_layers=1, use_lstm=True)


def test_the_server_answers_each_actor_with_the_models_outputs_for_its_own_envs():
    torch.manual_seed(0)
    learner_model = create_model(LSTM, SPEC.observation_shape, SPEC.num_actions)
    learner_model.policy_version.fill_(7)
    slots = InferenceSlots.allocate(SPEC, learner_model, num_actors=3, envs_per_actor=4)
    slots.inputs["frame"].normal_()
    slots.inputs["reward"].normal_()
    slots.inputs["last_action"].random_(0, 2)
    slots.inputs["done"][:, 1] = True
    for state in slots.core_state:
        state.normal_()
    before = {key: value.clone() for key, value in slots.outputs.items()}
    states_before = [state.clone() for state in slots.core_state]
    failures = []
    server = InferenceServer(learner_model, LSTM, SPEC, slots, failures.append)

    server.infer([2, 0])  # actors 2 and 0 ask; actor 1 does not

    for actor in (0, 2):
        inputs = {key: value[actor][None] for key, value in slots.inputs.items()}
        state = tuple(s[actor] for s in states_before)
        with torch.no_grad():
            expected, expected_state = learner_model(inputs, state, act=False)
        torch.testing.assert_close(
            slots.outputs["policy_logits"][actor], expected["policy_logits"][0]
        )
        torch.testing.assert_close(slots.outputs["baseline"][actor], expected["baseline"][0])
        assert slots.outputs["policy_version"][actor].tolist() == [7] * 4
        assert set(slots.outputs["action"][actor].tolist()) <= {0, 1}
        for got, want in zip(slots.core_state, expected_state, strict=True):
            torch.testing.assert_close(got[actor], want)
    for key, value in slots.outputs.items():  # actor 1's row is untouched
        assert torch.equal(value[1], before[key][1])
    assert torch.equal(slots.core_state[0][1], states_before[0][1])
    assert failures == []


def test_each_pass_answers_only_its_own_actors_from_the_rows_they_wrote():
    """The server stages a pass's rows in buffers it reuses: a smaller pass after a larger
    one reads and writes its own rows, and the earlier answers stay as they were."""
    torch.manual_seed(0)
    learner_model = create_model(LSTM, SPEC.observation_shape, SPEC.num_actions)
    slots = InferenceSlots.allocate(SPEC, learner_model, num_actors=3, envs_per_actor=4)
    slots.inputs["frame"].normal_()
    server = InferenceServer(learner_model, LSTM, SPEC, slots, lambda message: None)
    server.infer([2, 0, 1])
    first = {key: value.clone() for key, value in slots.outputs.items()}
    slots.inputs["frame"][1].normal_()  # actor 1 asks again with new frames
    inputs = {key: value[1][None] for key, value in slots.inputs.items()}
    state = tuple(s[1].clone() for s in slots.core_state)

    server.infer([1])

    with torch.no_grad():
        expected, expected_state = learner_model(inputs, state, act=False)
    torch.testing.assert_close(slots.outputs["baseline"][1], expected["baseline"][0])
    for got, want in zip(slots.core_state, expected_state, strict=True):
        torch.testing.assert_close(got[1], want)
    for actor in (0, 2):
        assert torch.equal(slots.outputs["baseline"][actor], first["baseline"][actor])
    assert server.batch_sizes == {3: 1, 1: 1}


def test_the_server_times_each_part_of_its_passes_and_its_waits():
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
    slots = InferenceSlots.allocate(SPEC, learner_model, num_actors=2, envs_per_actor=2)
    server = InferenceServer(learner_model, config, SPEC, slots, lambda message: None)
    actor_end, server_end = multiprocessing.Pipe()
    server.add(0, server_end)
    server.start()
    try:
        for _ in range(3):
            actor_end.send_bytes(b"?")
            assert actor_end.recv_bytes() == b"!"
    finally:
        server.stop()
    assert server.batch_sizes == {1: 3}
    seconds = server.seconds
    assert set(seconds) == {*PASS_PARTS, "cpu"}
    assert all(seconds[part] > 0 for part in PASS_PARTS), seconds
    assert 0 < seconds["cpu"] <= sum(seconds[part] for part in PASS_PARTS) + 0.05


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
def test_published_weights_are_the_ones_the_next_answers_use(device):
    """On a GPU the server's forward passes run on a stream of their own: a pass after a
    publish still sees the weights published."""
    torch.manual_seed(0)
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions).to(device)
    slots = InferenceSlots.allocate(SPEC, learner_model, num_actors=1, envs_per_actor=2)
    slots.inputs["frame"].normal_()
    server = InferenceServer(learner_model, config, SPEC, slots, lambda message: None)
    server.infer([0])
    first = slots.outputs["baseline"].clone()
    with torch.no_grad():
        learner_model.baseline.bias.add_(1.0)
        learner_model.policy_version.fill_(3)
        if device == "cuda":  # the learner's stream busy a while before the publish
            torch.cuda._sleep(50_000_000)
    server.infer([0])
    assert torch.equal(slots.outputs["baseline"], first)  # not published yet
    server.publish(learner_model)
    server.infer([0])
    torch.testing.assert_close(slots.outputs["baseline"], first + 1.0)
    assert slots.outputs["policy_version"].tolist() == [[3, 3]]


def test_monobeast_trains_with_central_inference(tmp_path):
    args = [*SMALL_RUN, "--central_inference", "--total_steps", "4000", "--xpid", "run"]
    result = monobeast(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert int(rows[-1]["step"]) >= 4000
    # The actions came from weights a few updates old at most (the server's copy).
    lags = [float(row["policy_lag"]) for row in rows[5:]]
    assert lags and max(lags) < 20
    assert "Learning finished" in (tmp_path / "run" / "out.log").read_text()


def test_an_lstm_trains_with_central_inference(tmp_path):
    args = [*SMALL_RUN, "--central_inference", "--use_lstm", "--total_steps", "1000"]
    result = monobeast(tmp_path, *args, "--xpid", "run")
    assert result.returncode == 0, result.stderr
    assert int(read_rows(tmp_path / "run" / "logs.csv")[-1]["step"]) >= 1000


@pytest.mark.parametrize("runtime", ["poly", "ray"])
def test_central_inference_belongs_to_monobeast(runtime):
    command = [sys.executable, "-m", "torchbeast.bench", "--runtime", runtime]
    command.append("--central_inference")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--central_inference is MonoBeast's" in result.stderr.strip().splitlines()[-1]


def test_central_inference_is_off_unless_asked_for():
    from torchbeast.config.flags import parse_flags
    from torchbeast.config.parsers import make_mono_parser
    from torchbeast.config.settings import build_settings

    mono = make_mono_parser()
    assert build_settings(parse_flags([], mono), "mono").runtime.central_inference is False
    asked = parse_flags(["--central_inference"], mono)
    assert build_settings(asked, "mono").runtime.central_inference is True
    # The flags of every runtime have no such flag: the settings keep its default.
    assert build_settings(parse_flags([]), "mono").runtime.central_inference is False


def test_the_server_samples_from_its_own_generator():
    """Its thread samples beside the learner's, which on a GPU captures its update as a
    CUDA graph, and owns the device's default generator meanwhile: the server draws from
    a generator of its own, seeded from the process's seed, and from no other."""
    config = dict(LSTM, use_lstm=False)
    actions = []
    for other_draws in (0, 5):
        torch.manual_seed(0)
        learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
        slots = InferenceSlots.allocate(SPEC, learner_model, num_actors=2, envs_per_actor=64)
        server = InferenceServer(learner_model, config, SPEC, slots, lambda message: None)
        torch.rand(other_draws)  # the default generator moves on; the server's does not
        default_state = torch.get_rng_state()
        server.infer([0, 1])
        assert torch.equal(torch.get_rng_state(), default_state)
        actions.append(slots.outputs["action"].clone())
    assert torch.equal(actions[0], actions[1])
    assert len(set(actions[0].flatten().tolist())) == 2  # sampled, not one action

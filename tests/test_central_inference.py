"""MonoBeast's central inference (--central_inference): the learner process chooses every
actor's actions in one batched forward pass; real actor processes, real environments."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading

import numpy as np
import pytest
import torch

from tests import warm_start
from tests.test_monobeast import (
    SMALL_RUN,
    actor_pids,
    alive,
    inference_pid,
    monobeast,
    read_rows,
    start_monobeast,
    wait_for,
    wait_for_rows,
)
from torchbeast.core.models import create_model
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.mono_inference import (
    PASS_PARTS,
    CentralInference,
    InferenceFigures,
    InferenceProcess,
    InferenceServer,
    InferenceSlots,
)
from torchbeast.runtime.mono_weights import SharedWeights

SPEC = EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2)
LSTM = dict(kind="mlp", hidden_size=8, num_layers=1, use_lstm=True)


def serve(
    learner_model: torch.nn.Module,
    config: dict,
    num_actors: int,
    envs_per_actor: int,
    device: str = "cpu",
) -> tuple[InferenceServer, InferenceSlots, SharedWeights]:
    """A server for ``learner_model``'s actors, with its weights published as the learner
    publishes them for actors."""
    slots = InferenceSlots.allocate(SPEC, learner_model, num_actors, envs_per_actor)
    weights = SharedWeights(learner_model)
    weights.publish(learner_model)
    model = create_model(config, SPEC.observation_shape, SPEC.num_actions, inference_only=True)
    figures = InferenceFigures.allocate(num_actors)
    return InferenceServer(model.to(device), slots, figures, weights), slots, weights


def test_the_server_answers_each_actor_with_the_models_outputs_for_its_own_envs():
    torch.manual_seed(0)
    learner_model = create_model(LSTM, SPEC.observation_shape, SPEC.num_actions)
    learner_model.policy_version.fill_(7)
    server, slots, _ = serve(learner_model, LSTM, num_actors=3, envs_per_actor=4)
    slots.inputs["frame"].normal_()
    slots.inputs["reward"].normal_()
    slots.inputs["last_action"].random_(0, 2)
    slots.inputs["done"][:, 1] = True
    for state in slots.core_state:
        state.normal_()
    before = {key: value.clone() for key, value in slots.outputs.items()}
    states_before = [state.clone() for state in slots.core_state]

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


def test_each_pass_answers_only_its_own_actors_from_the_rows_they_wrote():
    """The server stages a pass's rows in buffers it reuses: a smaller pass after a larger
    one reads and writes its own rows, and the earlier answers stay as they were."""
    torch.manual_seed(0)
    learner_model = create_model(LSTM, SPEC.observation_shape, SPEC.num_actions)
    server, slots, _ = serve(learner_model, LSTM, num_actors=3, envs_per_actor=4)
    slots.inputs["frame"].normal_()
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
    assert server.passes.tolist() == [0, 1, 0, 1]  # one pass of 1 actor, one of 3


def test_a_row_taken_over_by_a_new_actor_is_served_through_its_pipe_alone():
    """An actor that died with a request pending leaves it in its pipe; its successor's
    request comes through a new pipe. The server serves the row once, for the successor."""
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
    server, _, _ = serve(learner_model, config, num_actors=2, envs_per_actor=2)
    dead_end, dead_server_end = multiprocessing.Pipe()
    server.add(0, dead_server_end)
    dead_end.send_bytes(b"?")  # asked, then died
    new_end, new_server_end = multiprocessing.Pipe()
    server.add(0, new_server_end)
    new_end.send_bytes(b"?")

    rows, answers = server._requests()

    assert rows == [0] and answers == [new_server_end]
    assert dead_server_end.closed


def test_the_server_times_each_part_of_its_passes_and_its_waits():
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
    server, _, _ = serve(learner_model, config, num_actors=2, envs_per_actor=2)
    actor_end, server_end = multiprocessing.Pipe()
    server.add(0, server_end)
    thread = threading.Thread(target=server.serve)
    thread.start()
    try:
        for _ in range(3):
            actor_end.send_bytes(b"?")
            assert actor_end.recv_bytes() == b"!"
    finally:
        server.stopping.set()
        thread.join()
    with pytest.raises(EOFError):  # stopping closed the actors' pipes
        actor_end.recv_bytes()
    figures = InferenceFigures(torch.from_numpy(server.seconds), torch.from_numpy(server.passes))
    assert figures.batch_sizes() == {1: 3}
    seconds = figures.seconds_by_part()
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
    """The server reads the weights the learner publishes for actors before each pass, to
    its own device."""
    torch.manual_seed(0)
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions).to(device)
    server, slots, weights = serve(learner_model, config, 1, 2, device)
    slots.inputs["frame"].normal_()
    server.infer([0])
    first = slots.outputs["baseline"].clone()
    with torch.no_grad():
        learner_model.baseline.bias.add_(1.0)
        learner_model.policy_version.fill_(3)
    server.infer([0])
    assert torch.equal(slots.outputs["baseline"], first)  # not published yet
    weights.publish(learner_model)
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


def test_inference_runs_in_a_process_of_its_own_and_its_death_ends_the_run(tmp_path):
    """Killed, it takes no actor's data with it: the run ends with one line naming it and
    the checkpoint of the last update, and leaves no process behind."""
    args = [*SMALL_RUN, "--central_inference", "--total_steps", "10000000", "--xpid", "run"]
    process = start_monobeast(tmp_path, *args)
    try:
        logs = tmp_path / "run" / "logs.csv"
        wait_for_rows(logs, 3)
        server = inference_pid(tmp_path / "run" / "out.log")
        children = actor_pids(process.pid)
        assert server in children and len(children) == 3  # two actors and the server
        os.kill(server, signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, output
    assert output.strip().splitlines()[-1] == (
        "error: the central inference process died (exit code -9); see out.log, and check memory"
    )
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["step"] == int(read_rows(logs)[-1]["step"]) > 0
    wait_for(lambda: not any(alive(pid) for pid in children), 10, "the actors to exit")


def one_actor_central(device: str) -> tuple[torch.nn.Module, CentralInference]:
    """A feed-forward learner model and central inference for one actor of 2 envs."""
    config = dict(LSTM, use_lstm=False)
    learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
    central = CentralInference(
        slots=InferenceSlots.allocate(SPEC, learner_model, 1, 2),
        figures=InferenceFigures.allocate(1),
        config=config,
        env_spec=SPEC,
        device=device,
        compute_dtype=torch.float32,
        seed=1,
    )
    return learner_model, central


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_server_that_cannot_start_says_why_in_one_line():
    """Its process builds the model on the learner's device; where that fails (here: a
    CUDA device on a machine without one), starting it gives the error's last line."""
    learner_model, central = one_actor_central("cuda:0")
    server = InferenceProcess(
        multiprocessing.get_context("spawn"), central, SharedWeights(learner_model)
    )
    try:
        failure = server.start()
    finally:
        server.stop()
    assert failure is not None and failure.startswith("central inference failed: ")
    assert "CUDA" in failure and failure.endswith("(traceback in out.log)")
    assert not server.process.is_alive()


def test_an_actor_that_lost_its_server_blames_the_server_not_itself():
    """The run's dispatcher asks ``gone()`` when an actor fails: while the server serves,
    the actor's own error stands (None); once it died, its death is the cause."""
    learner_model, central = one_actor_central("cpu")
    weights = SharedWeights(learner_model)
    weights.publish(learner_model)
    server = InferenceProcess(multiprocessing.get_context("spawn"), central, weights)
    try:
        assert server.start() is None
        assert server.gone() is None
        os.kill(server.process.pid, signal.SIGKILL)
        assert server.gone() == (
            "the central inference process died (exit code -9); see out.log, and check memory"
        )
    finally:
        server.stop()


def test_an_lstm_trains_with_central_inference(tmp_path):
    args = [*SMALL_RUN, "--central_inference", "--use_lstm", "--total_steps", "1000"]
    result = monobeast(tmp_path, *args, "--xpid", "run")
    assert result.returncode == 0, result.stderr
    assert int(read_rows(tmp_path / "run" / "logs.csv")[-1]["step"]) >= 1000


@pytest.mark.parametrize("runtime", ["poly", "ray"])
def test_central_inference_belongs_to_monobeast(runtime):
    command = [sys.executable, "-m", "torchbeast.bench", "--runtime", runtime]
    command.append("--central_inference")
    result = warm_start.run(command, timeout=60)
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
    """The server draws from a generator of its own, seeded from its process's seed, and
    from no other: what else its process draws does not change its actions."""
    config = dict(LSTM, use_lstm=False)
    actions = []
    for other_draws in (0, 5):
        torch.manual_seed(0)
        learner_model = create_model(config, SPEC.observation_shape, SPEC.num_actions)
        server, slots, _ = serve(learner_model, config, num_actors=2, envs_per_actor=64)
        torch.rand(other_draws)  # the default generator moves on; the server's does not
        default_state = torch.get_rng_state()
        server.infer([0, 1])
        assert torch.equal(torch.get_rng_state(), default_state)
        actions.append(slots.outputs["action"].clone())
    assert torch.equal(actions[0], actions[1])
    assert len(set(actions[0].flatten().tolist())) == 2  # sampled, not one action

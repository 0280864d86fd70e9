"""Central inference's forward passes as CUDA graphs (core.inference_graph): the same
outputs as eager passes, one graph per power of two of actors, and eager passes for good,
with one warning, when a graph fails. The graphs need a GPU; the server's fallback, the
sizes and the log line that reaches the run's log are tested on the CPU."""

from __future__ import annotations

import logging
import multiprocessing

import numpy as np
import pytest
import torch

from tests.test_monobeast import SMALL_RUN, monobeast
from torchbeast.core import inference_graph
from torchbeast.core.inference_graph import InferenceGraphError, InferenceGraphs
from torchbeast.core.models import create_model
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.mono_inference import (
    CentralInference,
    InferenceFigures,
    InferenceProcess,
    InferenceServer,
    InferenceSlots,
)
from torchbeast.runtime.mono_weights import SharedWeights

CARTPOLE = EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2)
PONG = EnvSpec("PongNoFrameskip-v4", (4, 84, 84), np.dtype(np.uint8), 6)
MLP = dict(kind="mlp", hidden_size=8, num_layers=1, use_lstm=False)
LSTM = dict(MLP, use_lstm=True)
ATARI = dict(kind="atari", hidden_size=256, num_layers=1, use_lstm=False)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def serve(config, spec, num_actors, envs_per_actor, device="cpu", cuda_graphs=True):
    """A server of a fresh model's weights (published), and its slots, filled with inputs."""
    learner_model = create_model(config, spec.observation_shape, spec.num_actions).to(device)
    slots = InferenceSlots.allocate(spec, learner_model, num_actors, envs_per_actor)
    weights = SharedWeights(learner_model)
    weights.publish(learner_model)
    model = create_model(config, spec.observation_shape, spec.num_actions, inference_only=True)
    figures = InferenceFigures.allocate(num_actors)
    server = InferenceServer(model.to(device), slots, figures, weights, cuda_graphs)
    fill(slots, spec)
    return server, slots, learner_model, weights


def fill(slots: InferenceSlots, spec: EnvSpec) -> None:
    frame = slots.inputs["frame"]
    if frame.dtype == torch.uint8:
        frame.random_(0, 256)
    else:
        frame.normal_()
    slots.inputs["reward"].normal_()
    slots.inputs["last_action"].random_(0, spec.num_actions)
    slots.inputs["done"].bernoulli_(0.2)
    for state in slots.core_state:
        state.normal_()


def test_a_pass_replays_the_graph_of_the_next_power_of_two_of_actors():
    model = create_model(MLP, CARTPOLE.observation_shape, CARTPOLE.num_actions)
    graphs = InferenceGraphs(model, num_actors=12, envs_per_actor=4)
    sizes = [graphs.size_for(actors) for actors in range(1, 13)]
    assert sizes == [1, 2, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12]


def test_the_server_runs_eagerly_on_a_cpu():
    server, _, _, _ = serve(MLP, CARTPOLE, 2, 4, cuda_graphs=True)
    assert server.graphs is None


class FailingGraphs:
    """Graphs whose first capture fails: how a GPU's failure looks to the server."""

    captured: dict = {}

    def run(self, inputs, core_state):
        raise InferenceGraphError("the graph of a pass for 2 actors differed by 0.5")


def test_a_failed_graph_leaves_the_server_eager_for_good_with_one_warning():
    torch.manual_seed(0)
    server, slots, learner_model, _ = serve(LSTM, CARTPOLE, 2, 4)
    told = []
    server.tell = lambda level, line: told.append((level, line))
    server.graphs = FailingGraphs()
    states_before = [state.clone() for state in slots.core_state]

    server.infer([0, 1])
    server.infer([1])

    assert server.graphs is None
    assert told == [
        (
            logging.WARNING,
            "Central inference's forward passes run eagerly, not as CUDA graphs: "
            "the graph of a pass for 2 actors differed by 0.5",
        )
    ]
    inputs = {key: value[0][None] for key, value in slots.inputs.items()}
    with torch.no_grad():
        expected, state = learner_model(inputs, tuple(s[0] for s in states_before), act=False)
    torch.testing.assert_close(slots.outputs["policy_logits"][0], expected["policy_logits"][0])
    torch.testing.assert_close(slots.core_state[0][0], state[0])


def test_a_line_the_inference_process_sends_goes_to_the_runs_log(caplog):
    context = multiprocessing.get_context("spawn")
    model = create_model(MLP, CARTPOLE.observation_shape, CARTPOLE.num_actions)
    central = CentralInference(
        slots=InferenceSlots.allocate(CARTPOLE, model, 1, 1),
        figures=InferenceFigures.allocate(1),
        config=MLP,
        env_spec=CARTPOLE,
        device="cpu",
        compute_dtype=torch.float32,
        seed=1,
    )
    handle = InferenceProcess(context, central, SharedWeights(model))  # not started
    handle.child_control.send(("note", (logging.WARNING, "forward passes run eagerly")))
    with caplog.at_level(logging.INFO, logger="torchbeast"):
        assert handle.read_failure() is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "forward passes run eagerly")
    ]
    handle.child_control.close()
    handle.control.close()


# ---------------------------------------------------------------------------- on a GPU


@needs_cuda
@pytest.mark.parametrize(
    "config, spec", [(ATARI, PONG), (LSTM, CARTPOLE)], ids=["atari cuda", "lstm cuda"]
)
def test_graphed_passes_answer_as_eager_passes_for_every_size_cuda(config, spec, monkeypatch):
    """Passes of 1, 3 (the graph of 4) and all 5 actors, the graph of 4 twice, with new
    weights between: each answer as the eager model's, for the actors asked only."""
    # Full fp32, so that the eager model's batch of one actor computes as the graph's.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    server, slots, learner_model, weights = serve(config, spec, 5, 4, "cuda")
    told = []
    server.tell = lambda level, line: told.append((level, line))
    for actors in ([2], [4, 0, 1], [0, 1, 2, 3, 4], [3, 1, 2], "new weights", [1, 2, 4]):
        if actors == "new weights":
            with torch.no_grad():
                learner_model.baseline.bias.add_(1.0)
            weights.publish(learner_model)
            continue
        fill(slots, spec)
        states_before = [state.clone() for state in slots.core_state]
        server.infer(actors)
        for actor in actors:
            inputs = {key: value[actor][None].cuda() for key, value in slots.inputs.items()}
            state = tuple(s[actor].cuda() for s in states_before)
            with torch.no_grad():
                expected, expected_state = learner_model(inputs, state, act=False)
            torch.testing.assert_close(
                slots.outputs["policy_logits"][actor],
                expected["policy_logits"][0].cpu(),
                atol=1e-4,
                rtol=1e-4,
            )
            torch.testing.assert_close(
                slots.outputs["baseline"][actor],
                expected["baseline"][0].cpu(),
                atol=1e-4,
                rtol=1e-4,
            )
            for got, want in zip(slots.core_state, expected_state, strict=True):
                torch.testing.assert_close(got[actor], want.cpu(), atol=1e-4, rtol=1e-4)
    assert server.graphs is not None and sorted(server.graphs.captured) == [1, 4, 5]
    assert told == [
        (
            logging.INFO,
            "Central inference's forward passes run as CUDA graphs (the first agreed with "
            "the eager pass).",
        )
    ]


@needs_cuda
def test_a_graph_that_disagrees_is_refused_cuda(monkeypatch):
    torch.manual_seed(0)
    server, slots, _, _ = serve(MLP, CARTPOLE, 2, 4, "cuda")
    monkeypatch.setattr(inference_graph, "AGREEMENT", -1.0)  # nothing agrees
    told = []
    server.tell = lambda level, line: told.append((level, line))
    server.infer([0, 1])
    assert server.graphs is None
    assert told[0][0] == logging.WARNING and "differed from the eager pass" in told[0][1]
    assert set(slots.outputs["action"].flatten().tolist()) <= {0, 1}


@needs_cuda
def test_monobeast_on_a_gpu_runs_central_inference_as_graphs_cuda(tmp_path):
    on_gpu = [arg for arg in SMALL_RUN if arg != "--disable_cuda"]
    args = [*on_gpu, "--central_inference", "--total_steps", "2000", "--xpid", "run"]
    result = monobeast(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "Central inference's forward passes run as CUDA graphs" in out_log, out_log


@needs_cuda
def test_a_capture_that_fails_says_why_and_leaves_the_stream_as_it_was_cuda():
    model = create_model(MLP, CARTPOLE.observation_shape, CARTPOLE.num_actions).cuda()
    forward = model.forward

    def waiting_forward(inputs, core_state=(), **kwargs):
        outputs = forward(inputs, core_state, **kwargs)
        if torch.cuda.is_current_stream_capturing():
            float(outputs[0]["baseline"].sum())  # the host waits: no graph can hold that
        return outputs

    model.forward = waiting_forward
    graphs = InferenceGraphs(model, num_actors=2, envs_per_actor=4)
    inputs = dict(
        frame=torch.randn(1, 8, 4, device="cuda"),
        reward=torch.zeros(1, 8, device="cuda"),
        done=torch.zeros(1, 8, dtype=torch.bool, device="cuda"),
        last_action=torch.zeros(1, 8, dtype=torch.int64, device="cuda"),
    )
    stream = torch.cuda.current_stream()
    with torch.inference_mode():
        with pytest.raises(InferenceGraphError, match="capturing a pass for 8 envs failed: "):
            graphs.run(inputs, ())
        assert torch.cuda.current_stream() == stream
        outputs, _ = model(inputs, (), act=False)  # eager passes still run
    assert outputs["baseline"].shape == (1, 8)

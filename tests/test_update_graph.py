"""The update as one CUDA graph (``--cuda_graphs``): which updates it takes, the checkpoint
it leaves (loadable anywhere), and, on a machine with CUDA, the same updates as eager ones.
On a CPU-only machine the eager path it falls back to is the one every learner test runs."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from tests.test_learner import B, make_batch, make_model, make_setup
from tests.test_monobeast import monobeast
from torchbeast.config.flags import parse_flags
from torchbeast.core.learner import Learner, portable
from torchbeast.core.models import sampling_generator
from torchbeast.core.update_graph import UpdateGraph

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def graphed_learner(device: str = "cpu", **changes) -> Learner:
    case = make_setup(epochs=2, ppo_clip=0.2, **changes)
    learner = Learner(case.learner, make_model(case).to(device))
    learner.update_graph = UpdateGraph(learner)
    return learner


def test_the_graph_takes_whole_online_batches_of_one_shape_only():
    learner = graphed_learner()
    graph = learner.update_graph
    batch = make_batch()
    assert graph.fits(batch, (), None) and graph.fits(batch, (), B)
    assert not graph.fits(batch, (), B - 1)  # replayed columns: their number may vary
    masked = batch | {"mask": torch.ones_like(batch["done"])}
    assert not graph.fits(masked, (), None)  # partial rollouts
    graph.batch = {key: value.clone() for key, value in batch.items()}
    graph.graph = "captured"  # as after a capture: only its shapes fit from now on
    assert graph.fits(make_batch(seed=1), (), None)
    narrower = {key: value[:, :-1] for key, value in batch.items()}
    assert not graph.fits(narrower, (), None)


def test_value_normalisation_and_replay_keep_updates_eager():
    learner = graphed_learner(normalize_values=True)
    assert not learner.update_graph.fits(make_batch(), (), None)  # it waits for the device
    replaying = graphed_learner(replays=True)
    assert not replaying.update_graph.fits(make_batch(), (), None)


def test_a_graph_given_up_takes_no_more_updates():
    learner = graphed_learner()
    learner.update_graph.give_up("a test says so")
    assert not learner.update_graph.fits(make_batch(), (), None)
    assert all(not group["capturable"] for group in learner.optimizer.param_groups)


def test_checkpoints_hold_the_optimizer_as_any_machine_loads_it():
    learner = graphed_learner(rmsprop_init=1.0)
    learner.learn(make_batch())  # two passes: two optimizer steps
    for group in learner.optimizer.param_groups:  # as a graph's optimizer runs
        group["capturable"] = True
    saved = learner.state_dict()["optimizer_state_dict"]
    assert all(group["capturable"] is False for group in saved["param_groups"])
    steps = [state["step"] for state in saved["state"].values()]
    assert steps and all(step.device.type == "cpu" and float(step) == 2.0 for step in steps)
    assert learner.optimizer.param_groups[0]["capturable"] is True  # the learner's own: kept
    fresh = graphed_learner(rmsprop_init=1.0)
    fresh.optimizer.load_state_dict(portable(saved))
    fresh.learn(make_batch(seed=2))  # a CPU optimizer steps with it


def test_graphs_are_the_default_and_off_is_a_choice():
    """Every other training test runs the default on this CPU-only machine: eager updates
    (the graph needs CUDA; ``Trainer`` gives the learner one only on a GPU)."""
    assert parse_flags([]).cuda_graphs == "auto"
    assert parse_flags(["--cuda_graphs", "off"]).cuda_graphs == "off"


def test_an_unknown_cuda_graphs_choice_is_refused_in_one_line(tmp_path):
    result = monobeast(tmp_path, "--env", "CartPole-v1", "--cuda_graphs", "yes")
    assert result.returncode != 0
    assert "--cuda_graphs: invalid choice: 'yes'" in result.stderr


@cuda
def test_actions_are_sampled_beside_a_capture_from_the_samplers_own_generator():
    """Central inference samples in its own thread while the learner captures its update
    (its first): with the device's default generator that draw fails."""
    generator = sampling_generator(torch.device("cuda"))
    probabilities = torch.full((128, 6), 1 / 6, device="cuda")
    static = torch.ones(1024, device="cuda")
    graph, capturing, drawn, errors = torch.cuda.CUDAGraph(), threading.Event(), [], []

    def sample():
        capturing.wait()
        try:
            drawn.append(torch.multinomial(probabilities, 1, generator=generator).cpu())
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=sample)
    thread.start()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        capturing.set()
        thread.join()
        static.mul_(2.0)
    graph.replay()
    assert errors == [] and drawn[0].shape == (128, 1)
    assert float(static[0]) == 2.0


@cuda
def test_monobeast_trains_with_central_inference_and_the_graphed_update(tmp_path):
    args = ["--env", "PongNoFrameskip-v4", "--total_steps", "4000", "--xpid", "run"]
    args += ["--central_inference", "--num_actors", "2", "--envs_per_actor", "8"]
    result = monobeast(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "The update runs as one CUDA graph" in out_log


@cuda
@pytest.mark.parametrize("optimizer", [{}, {"optimizer": "adam"}, {"rmsprop_init": 0.0}])
def test_graphed_updates_are_the_eager_updates(optimizer):
    # Adam's state and RMSprop's from 0 are made by the first update: the graph must keep
    # updating that state, not make it anew at each replay.
    graphed, eager = graphed_learner("cuda", **optimizer), graphed_learner("cuda", **optimizer)
    eager.update_graph = None
    for seed in range(4):
        batch = {key: value.cuda() for key, value in make_batch(seed).items()}
        graphed_stats, eager_stats = graphed.learn(batch), eager.learn(batch)
        for name, value in eager_stats.items():
            if isinstance(value, float) and math.isfinite(value):
                assert graphed_stats[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert not graphed.update_graph.given_up and graphed.update_graph.graph is not None
    for mine, theirs in zip(graphed.model.parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)
    mine, theirs = graphed.optimizer.state_dict(), eager.optimizer.state_dict()
    for index, state in theirs["state"].items():  # what a checkpoint saves
        for key, value in state.items():
            torch.testing.assert_close(mine["state"][index][key], value, rtol=1e-4, atol=1e-6)


@cuda
def test_a_failed_graphed_update_is_undone():
    learner = graphed_learner("cuda")
    batch = {key: value.cuda() for key, value in make_batch().items()}
    learner.learn(batch)
    before = [param.detach().clone() for param in learner.model.parameters()]
    poisoned = batch | {"reward": torch.full_like(batch["reward"], math.nan)}
    with pytest.raises(Exception, match="non-finite reward"):
        learner.learn(poisoned)
    for param, kept in zip(learner.model.parameters(), before, strict=True):
        assert torch.equal(param.detach(), kept)

"""A CPU learner's torso split over threads by rows (core.torso_chunks): the same features,
gradients and updates as the whole torso, each chunk on its own thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from tests.settings_for_tests import setup
from tests.test_precision import ATARI_SHAPE, model_inputs, pong_batch
from torchbeast.core.learner import Learner
from torchbeast.core.models import create_model, model_config, torso_splits_rows
from torchbeast.core.settings import ModelSettings
from torchbeast.core.torso_chunks import TorsoChunks
from torchbeast.runtime.layout import threads_per_op, torso_threads


@pytest.fixture(scope="module")
def batch():
    return pong_batch()  # [T+1=6, B=4] real Pong frames


def pong_model(torso_threads: int = 1, use_lstm: bool = False, dtype=torch.float32):
    torch.manual_seed(0)
    config = model_config(ModelSettings(use_lstm=use_lstm), ATARI_SHAPE)
    return create_model(
        config, ATARI_SHAPE, 6, "orthogonal", compute_dtype=dtype, torso_threads=torso_threads
    )


def torso_grads(model) -> list[torch.Tensor]:
    return [param.grad.clone() for param in model.torso.parameters()]


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_split_torso_gives_the_whole_torsos_outputs_and_gradients(batch, dtype, rtol):
    whole, split = pong_model(dtype=dtype), pong_model(torso_threads=2, dtype=dtype)
    assert whole.torso_chunks is None and split.torso_chunks.chunks == 2
    results = []
    for model in (whole, split):
        outputs, _ = model(model_inputs(batch), act=False)
        (outputs["policy_logits"].square().sum() + outputs["baseline"].sum()).backward()
        results.append((outputs["policy_logits"].detach(), torso_grads(model)))
    (logits_whole, grads_whole), (logits_split, grads_split) = results
    torch.testing.assert_close(logits_split, logits_whole, rtol=rtol, atol=1e-5)
    for got, expected in zip(grads_split, grads_whole, strict=True):
        scale = expected.abs().max()
        assert (got - expected).abs().max() <= rtol * scale


def test_the_agent_runs_its_split_torso_on_two_threads(batch):
    model = pong_model(torso_threads=2)
    threads = []
    model.torso.register_forward_hook(lambda *_: threads.append(threading.get_ident()))
    outputs, _ = model(model_inputs(batch), act=False)
    assert len(set(threads)) == 2
    outputs["baseline"].sum().backward()
    assert all(param.grad is not None for param in model.torso.parameters())


@pytest.mark.parametrize("use_lstm", [False, True])
def test_a_learner_with_a_split_torso_makes_the_same_updates(batch, use_lstm):
    case = setup(unroll_length=5, batch_size=4, epochs=2, ppo_clip=0.2)
    learners = [Learner(case.learner, pong_model(threads, use_lstm=use_lstm)) for threads in (1, 2)]
    core_state = learners[0].model.initial_state(4)
    stats = [[learner.learn(batch, core_state) for _ in range(3)] for learner in learners]
    for name in ("total_loss", "pg_loss", "baseline_loss", "grad_norm"):
        assert stats[1][-1][name] == pytest.approx(stats[0][-1][name], rel=1e-4)
    for a, b in zip(learners[0].model.parameters(), learners[1].model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


class ThreadSpy(nn.Module):
    """A torso that records the thread of each forward pass and of each backward pass."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.forward_threads: list[int] = []
        self.backward_threads: list[int] = []
        self.rows: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forward_threads.append(threading.get_ident())
        self.rows.append(x.shape[0])
        out = self.linear(x)
        if out.requires_grad:
            out.register_hook(lambda grad: self.backward_threads.append(threading.get_ident()))
        return out


def test_each_chunk_runs_forward_and_backward_on_its_own_thread():
    spy, chunks = ThreadSpy(), TorsoChunks(2)
    x = torch.randn(8, 3)
    out = chunks(spy, x, spy.parameters())
    torch.testing.assert_close(out, spy.linear(x))
    assert spy.rows == [4, 4]
    assert len(set(spy.forward_threads)) == 2
    assert threading.get_ident() in spy.forward_threads  # the caller runs a chunk
    out.sum().backward()
    assert len(set(spy.backward_threads)) == 2
    expected = torch.ones(8, 2).T @ x  # d(sum of x W^T + b)/dW
    torch.testing.assert_close(spy.linear.weight.grad, expected)
    torch.testing.assert_close(spy.linear.bias.grad, torch.full((2,), 8.0))


def test_without_gradient_or_with_fewer_rows_than_threads_the_torso_runs_whole():
    spy, chunks = ThreadSpy(), TorsoChunks(2)
    with torch.no_grad():  # the bootstrap frame's pass, inference
        chunks(spy, torch.randn(8, 3), spy.parameters())
    chunks(spy, torch.randn(1, 3), spy.parameters())
    assert spy.rows == [8, 1]
    assert spy.forward_threads == [threading.get_ident()] * 2


def test_only_convolutional_torsos_split_their_rows():
    kinds = ("atari", "resnet", "grid", "mlp")
    splits = {kind: torso_splits_rows(dict(kind=kind)) for kind in kinds}
    assert splits == {"atari": True, "resnet": True, "grid": False, "mlp": False}


@pytest.mark.parametrize(
    "cores, splittable, bf16, torso, per_op",
    [(2, True, False, 2, 1), (2, True, True, 2, 1), (16, True, False, 2, 8),
     (16, True, True, 2, 4), (1, True, False, 1, 1), (16, False, False, 1, 16)],
)  # fmt: skip
def test_a_cpu_learner_splits_its_torso_over_two_threads_that_share_its_cores(
    cores, splittable, bf16, torso, per_op
):
    assert torso_threads(cores, splittable) == torso
    assert threads_per_op(cores, 1, bf16, torso) == per_op


def test_odd_rows_frozen_weights_and_an_input_with_its_own_gradient():
    spy, chunks = ThreadSpy(), TorsoChunks(2)
    spy.linear.bias.requires_grad_(False)  # a frozen weight gets no gradient
    x = torch.randn(5, 3)
    chunks(spy, x, spy.parameters()).sum().backward()
    assert sorted(spy.rows) == [2, 3]
    torch.testing.assert_close(spy.linear.weight.grad, torch.ones(5, 2).T @ x)
    assert spy.linear.bias.grad is None
    wants_grad = torch.randn(4, 3, requires_grad=True)  # runs whole, so it gets its own
    chunks(spy, wants_grad, spy.parameters()).sum().backward()
    assert spy.rows[-1] == 4 and wants_grad.grad is not None


def test_a_second_backward_pass_is_refused_in_one_line():
    spy, chunks = ThreadSpy(), TorsoChunks(2)
    out = chunks(spy, torch.randn(8, 3), spy.parameters()).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass per forward"):
        out.backward()


def test_a_chunk_that_fails_waits_for_the_others_then_raises():
    finished = []

    def features(rows: torch.Tensor) -> torch.Tensor:
        if threading.current_thread() is threading.main_thread():
            raise ValueError("the caller's chunk failed")
        time.sleep(0.2)
        finished.append(rows.shape[0])
        return rows

    param = nn.Parameter(torch.ones(()))
    with pytest.raises(ValueError, match="the caller's chunk failed"):
        TorsoChunks(2)(features, torch.randn(8, 3), [param])
    assert finished == [4]  # the other chunk ended before the call did

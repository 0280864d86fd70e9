"""--normalize_values: the baseline learns V-trace targets at the scale of their running RMS
(at least 1), and the policy gradient's advantages are divided by the same scale."""

import copy

import pytest
import torch
from torch import nn

from tests.test_learner import make_batch, make_model, make_setup, parameters
from torchbeast.core.learner import Learner
from torchbeast.core.value_scale import ValueScale


def test_a_new_scale_rescales_the_head_so_that_its_values_stay_the_same():
    torch.manual_seed(0)
    head, features = nn.Linear(8, 1), torch.randn(32, 8)
    scale = ValueScale(enabled=True)
    before = scale.scale * head(features)
    scale.update(torch.full((100,), 50.0), head)
    assert scale.scale == pytest.approx(50.0)  # debiased: the first batch's RMS
    torch.testing.assert_close(scale.scale * head(features), before)


def test_the_scale_never_falls_below_one():
    head = nn.Linear(8, 1)
    weight = head.weight.detach().clone()
    scale = ValueScale(enabled=True)
    scale.update(torch.full((100,), 0.3), head)
    assert scale.scale == 1.0
    assert torch.equal(head.weight, weight)


def test_the_scale_follows_the_running_mean_square_of_the_targets():
    scale = ValueScale(enabled=True)
    head = nn.Linear(8, 1)
    for _ in range(3):
        scale.update(torch.full((10,), 4.0), head)
    scale.update(torch.full((10,), 40.0), head)
    # A debiased average with weight ~1/4 each over the first four updates.
    assert 4.0 < scale.scale < 40.0
    assert scale.scale == pytest.approx(((3 * 16 + 1600) / 4) ** 0.5, rel=0.01)


def small_reward_batch(seed=0):
    batch = make_batch(seed)
    batch["reward"] = 0.05 * batch["reward"]  # targets of RMS below 1
    return batch


def test_returns_of_unit_scale_learn_exactly_as_without_it():
    plain_case, case = make_setup(), make_setup(normalize_values=True)
    plain = Learner(plain_case.learner, make_model(plain_case))
    normalized = Learner(case.learner, make_model(case))
    for k in range(3):
        expected = plain.learn(small_reward_batch(k))
        stats = normalized.learn(small_reward_batch(k))
        assert stats.pop("value_scale") == 1.0
        assert stats == pytest.approx(expected, nan_ok=True)
    for a, b in zip(parameters(plain.model), parameters(normalized.model), strict=True):
        assert torch.equal(a, b)


def test_with_scale_s_the_baseline_loss_is_divided_by_s_squared_and_the_pg_loss_by_s():
    plain_case, case = make_setup(), make_setup(normalize_values=True)
    plain = Learner(plain_case.learner, make_model(plain_case))
    normalized = Learner(case.learner, make_model(case))
    # The same unnormalised values: the head predicts V / 2 at scale 2.
    normalized.value_scale.scale = 2.0
    with torch.no_grad():
        normalized.model.baseline.weight.mul_(0.5)
        normalized.model.baseline.bias.mul_(0.5)
    batch = make_batch()
    expected = plain._losses(batch, (), None)
    # The actors' head, too, gave V / 2 for the states time limits stopped episodes in.
    halved = {**batch, "truncation_value": batch["truncation_value"] / 2}
    terms = normalized._losses(halved, (), None)
    torch.testing.assert_close(terms.baseline_loss, expected.baseline_loss / 4)
    torch.testing.assert_close(terms.pg_loss, expected.pg_loss / 2)
    torch.testing.assert_close(terms.entropy_loss, expected.entropy_loss)
    torch.testing.assert_close(
        terms.learner_outputs["baseline"], expected.learner_outputs["baseline"]
    )


def test_large_returns_raise_the_scale_and_it_is_logged_and_checkpointed():
    case = make_setup(normalize_values=True, reward_clipping="none")
    learner = Learner(case.learner, make_model(case))
    batch = make_batch()
    batch["reward"] = torch.full_like(batch["reward"], 30.0)
    batch["done"] = torch.zeros_like(batch["done"])
    stats = learner.learn(batch)
    assert stats["value_scale"] > 30.0  # n-step returns of 30 per step
    resumed = Learner(case.learner, make_model(case, seed=1))
    resumed.load_state_dict(copy.deepcopy(learner.state_dict()))
    assert resumed.value_scale.state_dict() == learner.value_scale.state_dict()


def test_without_the_flag_nothing_is_logged_or_scaled():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    batch = make_batch()
    batch["reward"] = torch.full_like(batch["reward"], 30.0)
    stats = learner.learn(batch)
    assert "value_scale" not in stats
    assert learner.value_scale.scale == 1.0


def test_a_run_resumed_without_the_flag_keeps_the_values_it_learnt():
    case = make_setup(normalize_values=True, reward_clipping="none")
    learner = Learner(case.learner, make_model(case))
    batch = make_batch()
    batch["reward"] = torch.full_like(batch["reward"], 30.0)
    batch["done"] = torch.zeros_like(batch["done"])
    learner.learn(batch)
    assert learner.value_scale.scale > 30.0
    plain_case = make_setup(reward_clipping="none")
    resumed = Learner(plain_case.learner, make_model(plain_case, seed=1))
    resumed.load_state_dict(copy.deepcopy(learner.state_dict()))
    # The head now predicts V itself: sigma is folded into it, and the scale is off (1).
    assert resumed.value_scale.scale == 1.0
    values = learner._losses(batch, (), None).learner_outputs["baseline"]
    torch.testing.assert_close(resumed._losses(batch, (), None).learner_outputs["baseline"], values)

"""Specification of the learner step: the IMPALA losses recomputed by hand, the update,
the learning-rate decay, refusal of non-finite losses, episode stats and state_dict."""

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.settings_for_tests import Setup, setup
from torchbeast.core import losses, rollout, vtrace
from torchbeast.core.diagnostics import explained_variance
from torchbeast.core.learner import Learner, NonFiniteLossError, UndoBuffer
from torchbeast.core.models import create_model, model_config
from torchbeast.core.rollout import rollout_spec
from torchbeast.core.spec import EnvSpec

T, B, A = 5, 3, 2
OBSERVATION_SHAPE = (4,)
ENV_SPEC = EnvSpec("CartPole-v1", OBSERVATION_SHAPE, np.dtype(np.float32), A)


def make_setup(**changes) -> Setup:
    """T x B batches, 100 updates to the end of the learning rate's decay; IMPALA's step
    (one gradient step per batch on the policy gradient) unless ``changes`` say otherwise:
    the tests of --epochs and --ppo_clip name them."""
    impala = {"epochs": 1, "ppo_clip": 0.0}
    shape = {"unroll_length": T, "batch_size": B, "total_steps": 1500, "entropy_cost": 0.01}
    return setup(**impala | shape | changes)


def make_model(case: Setup, seed=0):
    torch.manual_seed(seed)
    return create_model(model_config(case.model, OBSERVATION_SHAPE), OBSERVATION_SHAPE, A)


def make_batch(seed=0, env_spec: EnvSpec = ENV_SPEC) -> dict[str, torch.Tensor]:
    """A random batch with every key of the rollout spec, [T+1, B, ...]."""
    generator = torch.Generator().manual_seed(seed)
    batch = {}
    for name, (shape, dtype) in rollout_spec(env_spec, T).items():
        shape = (shape[0], B, *shape[1:])
        if dtype == torch.bool:
            batch[name] = torch.rand(shape, generator=generator) < 0.2
        elif name in ("action", "last_action"):
            batch[name] = torch.randint(0, A, shape, generator=generator)
        elif dtype in (torch.int32, torch.int64):
            batch[name] = torch.randint(0, 100, shape, generator=generator, dtype=dtype)
        else:
            batch[name] = torch.randn(shape, generator=generator, dtype=dtype)
    batch["reward"] = 3.0 * batch["reward"]  # many rewards beyond [-1, 1]: clipping matters
    # An actor writes a truncation value only where a time limit ended the episode (done).
    batch["truncation_value"] = torch.where(batch["done"], batch["truncation_value"], 0.0)
    return batch


def expected_losses(case, model, batch) -> dict[str, float]:
    """The IMPALA losses, written out from the paper's formulas."""
    with torch.no_grad():
        outputs, _ = model(batch, ())
    bootstrap_value = outputs["baseline"][-1]
    logits, values = outputs["policy_logits"][:-1], outputs["baseline"][:-1]  # [T, B, A], [T, B]
    actions = batch["action"][1:]
    rewards = batch["reward"][1:]
    if case.learner.reward_clipping == "abs_one":
        rewards = rewards.clamp(-1, 1)
    if not case.learner.truncation_as_termination:  # r + gamma V(s_final) at a time limit's cut
        rewards = rewards + case.learner.discounting * batch["truncation_value"][1:]
    discounts = (1.0 - batch["done"][1:].float()) * case.learner.discounting
    returns = vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"][1:],
        target_policy_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
    )
    log_pi = F.log_softmax(logits, dim=-1)
    log_pi_action = log_pi.gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [T, B]
    pg_loss = torch.sum(-log_pi_action * returns.pg_advantages)
    baseline_loss = case.learner.baseline_cost * 0.5 * torch.sum((returns.vs - values) ** 2)
    entropy_loss = case.learner.entropy_cost * torch.sum(log_pi.exp() * log_pi)
    return dict(
        pg_loss=float(pg_loss), baseline_loss=float(baseline_loss), entropy_loss=float(entropy_loss)
    )


def parameters(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# The losses.


@pytest.mark.parametrize("clipping", ["abs_one", "none"])
@pytest.mark.parametrize("bootstrap_truncated", [True, False])
def test_losses_are_the_impala_losses(clipping, bootstrap_truncated):
    case = make_setup(reward_clipping=clipping, truncation_as_termination=not bootstrap_truncated)
    model = make_model(case)
    batch = make_batch()
    expected = expected_losses(case, model, batch)
    stats = Learner(case.learner, model).learn(batch)
    for name, value in expected.items():
        assert stats[name] == pytest.approx(value, rel=1e-5), name


def test_reward_clipping_changes_the_baseline_loss():
    batch = make_batch()
    clipped = Learner(make_setup().learner, make_model(make_setup())).learn(batch)
    unclipped = make_setup(reward_clipping="none")
    unclipped = Learner(unclipped.learner, make_model(unclipped)).learn(batch)
    assert clipped["baseline_loss"] != pytest.approx(unclipped["baseline_loss"], rel=1e-3)


def test_total_loss_is_the_sum_of_the_three_losses():
    case = make_setup()
    stats = Learner(case.learner, make_model(case)).learn(make_batch())
    assert stats["total_loss"] == pytest.approx(
        stats["pg_loss"] + stats["baseline_loss"] + stats["entropy_loss"], rel=1e-6
    )


def test_entropy_loss_is_negative_entropy_times_its_cost():
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]])  # [T=2, B=1, A=2]
    # Entropies: log 2 for (1/2, 1/2); 0.75 log(4/3) + 0.25 log 4 for (3/4, 1/4).
    expected = -(math.log(2.0) + 0.75 * math.log(4 / 3) + 0.25 * math.log(4.0))
    assert float(losses.entropy_loss(logits)) == pytest.approx(expected, rel=1e-6)


def test_unknown_reward_clipping_is_refused():
    with pytest.raises(ValueError, match="abs_one or none"):
        losses.clip_rewards(torch.zeros(2), "abs_two")


# The update.


def test_learn_changes_the_parameters():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    before = parameters(learner.model)
    learner.learn(make_batch())
    changed = [
        not torch.equal(old, new)
        for old, new in zip(before, learner.model.parameters(), strict=True)
    ]
    assert all(changed)


def test_learn_counts_the_steps_learned_from():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    learner.learn(make_batch(0))
    stats = learner.learn(make_batch(1))
    assert (stats["step"], learner.step, learner.updates) == (2 * T * B, 2 * T * B, 2)


def test_learning_rate_decays_linearly_to_zero_at_total_steps():
    case = make_setup()  # total_steps 1500: 100 updates of T * B = 15 steps
    learner = Learner(case.learner, make_model(case))
    rates = [learner.learn(make_batch(k))["learning_rate"] for k in range(3)]
    lr0 = case.learner.learning_rate
    assert rates == pytest.approx([lr0 * (1 - k * T * B / 1500) for k in (1, 2, 3)], rel=1e-9)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr0 * (1 - 45 / 1500))


def test_gradient_norm_is_clipped_to_grad_norm_clipping():
    case = make_setup(grad_norm_clipping=0.001)
    learner = Learner(case.learner, make_model(case))
    stats = learner.learn(make_batch())
    applied = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in learner.model.parameters()])
    )
    assert stats["grad_norm"] > 0.001  # the norm before clipping is reported
    assert float(applied) == pytest.approx(0.001, rel=1e-4)


def first_step(case) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The parameters before and after one update, and the clipped gradients it applied."""
    learner = Learner(case.learner, make_model(case))
    before = parameters(learner.model)
    learner.learn(make_batch())
    gradients = [p.grad.clone() for p in learner.model.parameters()]
    return before, parameters(learner.model), gradients


def test_rmsprop_mean_square_starting_at_one_makes_a_small_first_step():
    # TensorFlow's RMSProp (IMPALA's): ms = alpha * 1 + (1 - alpha) * g^2 at the first step.
    case = make_setup(rmsprop_init=1.0)
    lr, alpha, eps = case.learner.learning_rate, case.learner.alpha, case.learner.epsilon
    before, after, gradients = first_step(case)
    for old, new, g in zip(before, after, gradients, strict=True):
        expected = old - lr * g / (torch.sqrt(alpha + (1 - alpha) * g * g) + eps)
        torch.testing.assert_close(new, expected, rtol=1e-5, atol=1e-9)


def test_rmsprop_mean_square_starting_at_zero_is_pytorchs_rmsprop():
    case = make_setup(rmsprop_init=0.0)
    before, after, gradients = first_step(case)
    model = make_model(case)
    optimizer = torch.optim.RMSprop(
        model.parameters(),
        lr=case.learner.learning_rate,
        alpha=case.learner.alpha,
        eps=case.learner.epsilon,
    )
    for param, g in zip(model.parameters(), gradients, strict=True):
        param.grad = g
    optimizer.step()
    for expected, new in zip(model.parameters(), after, strict=True):
        torch.testing.assert_close(new, expected.detach())
    # From 0 the first step moves every weight by about 10 x LR whatever its gradient.
    moved = torch.cat([(new - old).abs().flatten() for old, new in zip(before, after, strict=True)])
    assert float(moved.median()) == pytest.approx(10 * case.learner.learning_rate, rel=0.01)


# Non-finite losses are refused.


# Deferred: the checks a GPU learner makes once per update, here run on the CPU.
CHECKS = pytest.mark.parametrize("deferred", [False, True], ids=["each pass", "deferred"])


@CHECKS
@pytest.mark.parametrize("key", ["reward", "frame", "policy_logits"])
def test_nan_in_the_batch_raises_and_leaves_the_parameters_unchanged(key, deferred):
    case = make_setup(epochs=2)
    learner = Learner(case.learner, make_model(case))
    learner.deferred_checks = deferred
    optimizer_before = copy.deepcopy(learner.optimizer.state_dict()["state"])
    before = parameters(learner.model)
    batch = make_batch()
    batch[key][2, 1] = float("nan")
    with pytest.raises(NonFiniteLossError, match="update was not applied"):
        learner.learn(batch)
    for old, new in zip(before, learner.model.parameters(), strict=True):
        assert torch.equal(old, new)
    for index, state in learner.optimizer.state_dict()["state"].items():
        assert all(torch.equal(state[k], optimizer_before[index][k]) for k in state)
    assert (learner.step, learner.updates) == (0, 0)


@CHECKS
def test_after_a_refused_update_the_next_batch_learns_as_from_scratch(deferred):
    case = make_setup()
    refused = Learner(case.learner, make_model(case))
    refused.deferred_checks = deferred
    batch = make_batch()
    batch["reward"][2, 1] = float("nan")
    with pytest.raises(NonFiniteLossError):
        refused.learn(batch)
    fresh = Learner(case.learner, make_model(case))
    np.testing.assert_equal(refused.learn(make_batch(1)), fresh.learn(make_batch(1)))


# Episode statistics.


def test_mean_episode_return_averages_the_episodes_that_ended():
    case = make_setup()
    batch = make_batch()
    batch["episode_end"][:] = False
    batch["episode_end"][2, 0] = batch["episode_end"][5, 2] = True
    batch["episode_return"][2, 0], batch["episode_return"][5, 2] = 10.0, 21.0
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert (stats["mean_episode_return"], stats["episodes"]) == (15.5, 2)


def test_mean_episode_return_of_returns_near_the_float32_limit_is_finite():
    # A PolyBeast peer reports its own returns: two of 3e38 summed in float32 were inf.
    case = make_setup()
    batch = make_batch()
    batch["episode_end"][:] = False
    batch["episode_end"][2, 0] = batch["episode_end"][5, 2] = True
    batch["episode_return"][2, 0] = batch["episode_return"][5, 2] = 3e38
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert stats["mean_episode_return"] == pytest.approx(3e38, rel=1e-6)


def test_mean_episode_length_averages_the_steps_of_the_episodes_that_ended():
    case = make_setup()
    batch = make_batch()
    batch["episode_end"][:] = False
    batch["episode_end"][0, 1] = True  # the overlap step: reported by the last batch
    batch["episode_end"][2, 0] = batch["episode_end"][5, 2] = True
    batch["episode_step"][0, 1], batch["episode_step"][2, 0] = 1000, 40
    batch["episode_step"][5, 2] = 61
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert stats["mean_episode_length"] == 50.5


def test_mean_episode_return_is_nan_when_no_episode_ended():
    case = make_setup()
    batch = make_batch()
    batch["episode_end"][:] = False
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert math.isnan(stats["mean_episode_return"])
    assert stats["episodes"] == 0


def test_episode_ending_in_the_overlap_step_is_not_counted_again():
    # Index 0 repeats the previous rollout's last step, which reported that episode.
    case = make_setup()
    batch = make_batch()
    batch["episode_end"][:] = False
    batch["episode_end"][0, 0] = batch["episode_end"][3, 1] = True
    batch["episode_return"][0, 0], batch["episode_return"][3, 1] = 99.0, 7.0
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert (stats["mean_episode_return"], stats["episodes"]) == (7.0, 1)


def test_each_episode_extra_is_averaged_by_name_over_the_episodes_that_ended():
    case = make_setup()
    spec = dataclasses.replace(ENV_SPEC, episode_extras=("coins", "gems"))
    batch = make_batch(env_spec=spec)
    batch["episode_end"][:] = False
    batch["episode_end"][0, 1] = True  # the overlap step: reported by the last batch
    batch["episode_end"][2, 0] = batch["episode_end"][5, 2] = True
    batch["episode_coins"][0, 1], batch["episode_coins"][2, 0] = 1000.0, 4.0
    batch["episode_coins"][5, 2] = 6.0
    batch["episode_gems"][2, 0], batch["episode_gems"][5, 2] = -1.0, -3.0
    learner = Learner(case.learner, make_model(case), episode_extras=("coins", "gems"))
    stats = learner.learn(batch)
    assert (stats["mean_episode_coins"], stats["mean_episode_gems"]) == (5.0, -2.0)
    assert list(stats).index("mean_episode_coins") > list(stats).index("mean_episode_length")


def test_an_env_without_episode_extras_logs_none():
    case = make_setup()
    stats = Learner(case.learner, make_model(case)).learn(make_batch())
    assert sorted(key for key in stats if key.startswith("mean_episode_")) == [
        "mean_episode_length",
        "mean_episode_return",
    ]


# State.


def test_state_dict_round_trips_step_optimizer_and_scheduler():
    case = make_setup()
    trained = Learner(case.learner, make_model(case, seed=0))
    for k in range(3):
        trained.learn(make_batch(k))
    resumed = Learner(case.learner, make_model(case, seed=1))
    resumed.load_state_dict(copy.deepcopy(trained.state_dict()))

    assert (resumed.step, resumed.updates) == (3 * T * B, 3)
    assert resumed.scheduler.state_dict() == trained.scheduler.state_dict()
    assert resumed.optimizer.param_groups[0]["lr"] == trained.optimizer.param_groups[0]["lr"]
    for old, new in zip(
        trained.optimizer.state.values(), resumed.optimizer.state.values(), strict=True
    ):
        assert torch.equal(old["square_avg"], new["square_avg"])
    # Resuming continues exactly where training left off.
    np.testing.assert_equal(resumed.learn(make_batch(3)), trained.learn(make_batch(3)))
    for old, new in zip(trained.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(old, new)


def test_on_update_sees_the_updated_model():
    case = make_setup()
    seen = []
    learner = Learner(
        case.learner,
        make_model(case),
        on_update=lambda model: seen.append(parameters(model)),
    )
    learner.learn(make_batch())
    assert len(seen) == 1
    assert all(torch.equal(a, b) for a, b in zip(seen[0], learner.model.parameters(), strict=True))


# Partial rollouts: columns cut short, padded with zeros and marked by batch["mask"].

# No gradient clipping, so that gradients of different batches can be compared and added.
UNCLIPPED = dict(grad_norm_clipping=1e9)
LOSSES = ("pg_loss", "baseline_loss", "entropy_loss", "total_loss")


def pad_columns(batch, lengths, padding=None) -> dict[str, torch.Tensor]:
    """``batch`` with column b cut after its lengths[b] real new steps and padded to T+1
    with zeros (or with the data of the batch ``padding``), plus the mask [T+1, B] that
    marks index 0 and the real new steps."""
    mask = torch.arange(T + 1)[:, None] <= torch.tensor(lengths)[None, :]  # [T+1, B]
    padded = {}
    for name, tensor in batch.items():
        real = mask.view(*mask.shape, *(1,) * (tensor.dim() - 2))  # [T+1, B, 1...]
        filler = torch.zeros_like(tensor) if padding is None else padding[name]
        padded[name] = torch.where(real, tensor, filler)
    padded["mask"] = mask
    return padded


def column(batch, b, n=T) -> dict[str, torch.Tensor]:
    """Column b of ``batch`` up to its n-th new step, without mask: [n+1, 1, ...]."""
    return {name: tensor[: n + 1, b : b + 1] for name, tensor in batch.items() if name != "mask"}


def learn_with_gradients(case, batch) -> tuple[dict[str, float], list[torch.Tensor]]:
    """Stats of one update of a fresh model (seed 0) and the gradients it applied."""
    model = make_model(case)
    stats = Learner(case.learner, model).learn(batch, model.initial_state(batch["reward"].shape[1]))
    return stats, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_padded_column_learns_like_its_truncated_rollout(n, use_lstm):
    lstm = dict(use_lstm=use_lstm)
    padded = pad_columns(make_batch(), (n, T, T))
    padded_column = {name: tensor[:, :1] for name, tensor in padded.items()}  # [T+1, 1, ...]

    stats, grads = learn_with_gradients(make_setup(**UNCLIPPED, **lstm), padded_column)
    short = make_setup(**UNCLIPPED, **lstm, unroll_length=n)
    short_stats, short_grads = learn_with_gradients(short, column(padded, 0, n))

    for name in LOSSES:
        assert stats[name] == pytest.approx(short_stats[name], rel=1e-5), name
    for grad, short_grad in zip(grads, short_grads, strict=True):
        torch.testing.assert_close(grad, short_grad, rtol=1e-5, atol=1e-7)


def test_batch_of_partial_columns_learns_the_sum_of_its_truncated_columns():
    # Losses and gradients are sums over columns, each of its own real length.
    lengths = (T, 3, 1)
    padded = pad_columns(make_batch(), lengths)

    stats, grads = learn_with_gradients(make_setup(**UNCLIPPED), padded)
    parts = [
        learn_with_gradients(make_setup(**UNCLIPPED, unroll_length=n), column(padded, b, n))
        for b, n in enumerate(lengths)
    ]

    for name in LOSSES:
        assert stats[name] == pytest.approx(sum(part[name] for part, _ in parts), rel=1e-5), name
    for k, grad in enumerate(grads):
        expected = sum(part_grads[k] for _, part_grads in parts)
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_lstm", [False, True])
def test_data_in_padded_steps_changes_neither_losses_nor_gradients(use_lstm):
    lstm = dict(use_lstm=use_lstm)
    zero_padded = pad_columns(make_batch(0), (T, 3, 1))
    noisy = pad_columns(make_batch(0), (T, 3, 1), padding=make_batch(1))
    assert not torch.equal(noisy["frame"], zero_padded["frame"])

    stats, grads = learn_with_gradients(make_setup(**lstm), zero_padded)
    noisy_stats, noisy_grads = learn_with_gradients(make_setup(**lstm), noisy)

    for name in (*LOSSES, "grad_norm"):
        assert stats[name] == pytest.approx(noisy_stats[name], rel=1e-6, abs=1e-9), name
    for grad, noisy_grad in zip(grads, noisy_grads, strict=True):
        torch.testing.assert_close(grad, noisy_grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("use_lstm", [False, True])
def test_a_batch_without_the_rollout_that_broke_it_learns_as_its_other_columns(use_lstm):
    # PolyBeast's learner, given a peer's rollout that makes the loss infinite: it learns
    # from the others (it dropped the whole batch, and a peer sending such rollouts again
    # and again held back every other's).
    case = make_setup(**UNCLIPPED, use_lstm=use_lstm, reward_clipping="none")
    batch = make_batch()
    batch["reward"][2, 1] = 3e38  # finite, but not its square in the baseline loss
    model = make_model(case)
    learner = Learner(case.learner, model)
    state = model.initial_state(B)
    with pytest.raises(NonFiniteLossError):
        learner.learn(batch, state)
    assert learner.nonfinite_columns(batch, state, B) == [1]

    stats = learner.learn(
        rollout.without_columns(batch, [1]), rollout.without_state_columns(state, [1])
    )
    grads = [p.grad.clone() for p in model.parameters()]
    others = {name: tensor[:, [0, 2]] for name, tensor in batch.items()}
    other_stats, other_grads = learn_with_gradients(case, others)

    for name in LOSSES:
        assert stats[name] == pytest.approx(other_stats[name], rel=1e-5), name
    assert stats["step"] == learner.step == 2 * T
    for grad, other_grad in zip(grads, other_grads, strict=True):
        torch.testing.assert_close(grad, other_grad, rtol=1e-5, atol=1e-6)


def test_step_counts_only_the_real_new_steps():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    learner.learn(make_batch(0))
    stats = learner.learn(pad_columns(make_batch(1), (T, 3, 1)))
    real_new_steps = T + 3 + 1
    assert stats["step"] == learner.step == T * B + real_new_steps


def test_all_real_mask_learns_like_no_mask():
    case = make_setup()
    batch = make_batch()
    stats, grads = learn_with_gradients(case, batch)
    masked = batch | {"mask": torch.ones(T + 1, B, dtype=torch.bool)}
    masked_stats, masked_grads = learn_with_gradients(case, masked)
    for name in (*LOSSES, "step"):
        assert masked_stats[name] == pytest.approx(stats[name], rel=1e-6), name
    for grad, masked_grad in zip(grads, masked_grads, strict=True):
        torch.testing.assert_close(grad, masked_grad, rtol=1e-6, atol=1e-9)


def test_episodes_ending_in_padded_steps_are_not_counted():
    case = make_setup()
    batch = pad_columns(make_batch(), (T, 2, T))
    batch["episode_end"][:] = False
    batch["episode_end"][2, 1] = batch["episode_end"][4, 1] = True  # real, then padded
    batch["episode_return"][2, 1], batch["episode_return"][4, 1] = 7.0, 99.0
    stats = Learner(case.learner, make_model(case)).learn(batch)
    assert (stats["mean_episode_return"], stats["episodes"]) == (7.0, 1)


# --------------------------------------------------------------------------- LASER


def learn_mixed(case, batch, num_online):
    """Stats and gradients of one update of a fresh model on online + replayed columns."""
    model = make_model(case)
    learner = Learner(case.learner, model)
    stats = learner.learn(batch, model.initial_state(batch["reward"].shape[1]), num_online)
    return stats, [p.grad.clone() for p in model.parameters()]


def with_behaviour_logits(case, batch, columns, moved_steps=()):
    """``batch`` whose behaviour logits in ``columns`` equal the fresh model's own policy
    (KL 0), except at the new steps ``moved_steps``, where they put almost all mass on
    another action (a KL of several nats)."""
    with torch.no_grad():
        outputs, _ = make_model(case)(batch, ())
    batch = {name: tensor.clone() for name, tensor in batch.items()}
    for b in columns:
        batch["policy_logits"][1:, b] = outputs["policy_logits"][:-1, b]
        for t in moved_steps:
            batch["policy_logits"][1 + t, b] = torch.tensor([20.0, -20.0])
            batch["action"][1 + t, b] = 1  # rare under mu: a huge rho, were it not cut
    return batch


def test_policy_kl_is_the_kl_of_the_target_from_the_behaviour_policy():
    target = torch.log(torch.tensor([[[0.5, 0.5]], [[0.9, 0.1]]]))  # [T=2, B=1, A=2]
    behaviour = torch.log(torch.tensor([[[0.9, 0.1]], [[0.9, 0.1]]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # 0.5108 nats
    kl = losses.policy_kl(target, behaviour)
    assert kl.shape == (2, 1)
    assert kl[0, 0] == pytest.approx(expected, rel=1e-6)
    assert kl[1, 0] == pytest.approx(0.0, abs=1e-7)


def test_replayed_states_beyond_the_trust_region_add_nothing():
    case = make_setup(**UNCLIPPED, replays=True)
    online = make_batch(0)
    replayed = with_behaviour_logits(case, make_batch(1), range(B), moved_steps=range(T))
    mixed = {name: torch.cat([online[name], replayed[name]], dim=1) for name in online}

    stats, grads = learn_mixed(case, mixed, num_online=B)
    online_stats, online_grads = learn_mixed(case, online, num_online=B)

    assert stats["trusted_fraction"] == 0.0
    assert stats["replayed_columns"] == B
    for name in LOSSES:
        assert stats[name] == pytest.approx(online_stats[name], rel=1e-5), name
    for grad, online_grad in zip(grads, online_grads, strict=True):
        torch.testing.assert_close(grad, online_grad, rtol=1e-5, atol=1e-7)


def test_trusted_replayed_states_add_policy_and_baseline_losses_but_no_entropy():
    case = make_setup(**UNCLIPPED, replays=True)
    online = make_batch(0)
    replayed = with_behaviour_logits(case, make_batch(1), range(B))
    mixed = {name: torch.cat([online[name], replayed[name]], dim=1) for name in online}

    stats, _ = learn_mixed(case, mixed, num_online=B)
    online_stats, _ = learn_mixed(case, online, num_online=B)
    replayed_stats, _ = learn_mixed(case, replayed, num_online=B)  # as if it were online

    assert stats["trusted_fraction"] == 1.0
    for name in ("pg_loss", "baseline_loss"):
        expected = online_stats[name] + replayed_stats[name]
        assert stats[name] == pytest.approx(expected, rel=1e-5), name
    assert stats["entropy_loss"] == pytest.approx(online_stats["entropy_loss"], rel=1e-6)


def test_trust_region_cuts_exactly_the_states_beyond_the_threshold():
    case = make_setup(replays=True)
    moved = (1, 3)
    replayed = with_behaviour_logits(case, make_batch(1), range(B), moved_steps=moved)
    stats, _ = learn_mixed(case, replayed, num_online=1)  # columns 1 and 2 replayed
    assert stats["trusted_fraction"] == pytest.approx((T - len(moved)) / T)


def test_a_cut_state_is_cut_from_the_vtrace_traces_like_a_masked_step():
    # A replayed column with step 2 beyond the trust region learns exactly like the same
    # column with step 2 masked out: no loss term there, and no trace through it.
    case = make_setup(**UNCLIPPED, replays=True)
    replayed = with_behaviour_logits(case, make_batch(1), range(B), moved_steps=(2,))
    online_stats, _ = learn_mixed(case, replayed, num_online=B)
    mask = torch.ones(T + 1, B, dtype=torch.bool)
    mask[1 + 2, 1:] = False
    masked = replayed | {"mask": mask}
    cut_stats, _ = learn_mixed(case, replayed, num_online=1)
    masked_stats, _ = learn_mixed(case, masked, num_online=B)
    assert online_stats["pg_loss"] != pytest.approx(cut_stats["pg_loss"], rel=1e-3)
    for name in ("pg_loss", "baseline_loss"):
        assert cut_stats[name] == pytest.approx(masked_stats[name], rel=1e-5), name
    # Entropy differs by design (replayed columns have none), so compare gradients of
    # the policy and baseline terms only through a run without entropy cost.
    case = make_setup(**UNCLIPPED, replays=True, entropy_cost=0.0)
    _, cut_grads = learn_mixed(case, replayed, num_online=1)
    _, masked_grads = learn_mixed(case, masked, num_online=B)
    for cut_grad, masked_grad in zip(cut_grads, masked_grads, strict=True):
        torch.testing.assert_close(cut_grad, masked_grad, rtol=1e-5, atol=1e-7)


def test_steps_and_episodes_count_online_columns_only():
    case = make_setup(replays=True)
    batch = make_batch(0)
    batch["episode_end"][:] = False
    batch["episode_end"][2, 0] = batch["episode_end"][3, 2] = True
    batch["episode_return"][2, 0], batch["episode_return"][3, 2] = 5.0, 99.0
    learner = Learner(case.learner, make_model(case))
    stats = learner.learn(batch, (), num_online=2)
    assert stats["step"] == learner.step == T * 2
    assert (stats["mean_episode_return"], stats["episodes"]) == (5.0, 1)


# Diagnostics: what tells a researcher whether a run learns.


def test_explained_variance_is_one_for_a_perfect_value_and_zero_for_the_mean():
    targets = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert float(explained_variance(targets, targets)) == pytest.approx(1.0)
    assert float(explained_variance(targets, torch.full_like(targets, 3.0))) == pytest.approx(0.0)
    assert math.isnan(explained_variance(torch.ones(4), torch.zeros(4)))
    assert math.isnan(explained_variance(targets, targets, torch.tensor([1, 0, 0, 0]).bool()))


def test_diagnostics_are_the_entropy_kl_and_clipped_weights_of_the_batch():
    case = make_setup()
    model = make_model(case)
    batch = make_batch()
    with torch.no_grad():
        outputs, _ = model(batch, ())
    stats = Learner(case.learner, model).learn(batch)
    logits = outputs["policy_logits"][:-1]  # the weights before the update acted here
    log_pi = F.log_softmax(logits, dim=-1)
    log_mu = F.log_softmax(batch["policy_logits"][1:], dim=-1)
    entropy = -(log_pi.exp() * log_pi).sum(-1).mean()
    kl = (log_pi.exp() * (log_pi - log_mu)).sum(-1).mean()
    actions = batch["action"][1:].unsqueeze(-1)
    rho_above_one = (log_pi.gather(-1, actions) > log_mu.gather(-1, actions)).float().mean()
    assert stats["policy_entropy"] == pytest.approx(float(entropy), rel=1e-5)
    assert stats["policy_kl"] == pytest.approx(float(kl), rel=1e-5)
    assert stats["clipped_rho_fraction"] == pytest.approx(float(rho_above_one))
    assert -10 < stats["explained_variance"] <= 1


def test_policy_lag_counts_the_updates_since_the_acting_weights():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    batch = make_batch()
    batch["policy_version"][:] = 0
    lags = [learner.learn(batch)["policy_lag"] for _ in range(3)]
    assert lags == [0, 1, 2]
    assert int(learner.model.policy_version) == 3  # what the runtimes publish to actors


def test_policy_version_is_restored_with_the_update_count():
    case = make_setup()
    learner = Learner(case.learner, make_model(case))
    learner.learn(make_batch())
    resumed = Learner(case.learner, make_model(case, seed=1))
    resumed.load_state_dict(learner.state_dict())
    assert int(resumed.model.policy_version) == 1
    assert "policy_version" not in learner.state_dict()["model_state_dict"]


def test_normalized_advantages_have_mean_zero_and_std_one_over_real_steps():
    advantages = torch.tensor([[1.0, 5.0], [3.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    normalized = losses.normalize(advantages, mask)
    real = normalized[mask]
    assert float(real.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(real.std()) == pytest.approx(1.0, rel=1e-5)
    assert normalized[1, 1] == 0  # a padded step stays out


def test_normalize_advantages_changes_the_policy_gradient_only():
    plain, case = make_setup(), make_setup(normalize_advantages=True)
    plain = Learner(plain.learner, make_model(plain)).learn(make_batch())
    normalized = Learner(case.learner, make_model(case)).learn(make_batch())
    assert normalized["pg_loss"] != pytest.approx(plain["pg_loss"])
    assert normalized["baseline_loss"] == pytest.approx(plain["baseline_loss"])
    assert normalized["entropy_loss"] == pytest.approx(plain["entropy_loss"])


def test_epochs_take_several_steps_on_one_batch_but_count_it_once():
    case = make_setup(epochs=3)
    learner = Learner(case.learner, make_model(case))
    one_epoch = Learner(make_setup().learner, make_model(case))
    stats = learner.learn(make_batch())
    one_epoch.learn(make_batch())
    assert (learner.step, learner.updates, learner.optimizer.state_dict()["state"][0]["step"]) == (
        T * B,
        1,
        3,
    )
    assert stats["learning_rate"] == pytest.approx(case.learner.learning_rate * (1 - T * B / 1500))
    assert not torch.equal(next(learner.model.parameters()), next(one_epoch.model.parameters()))


def test_adam_is_used_when_asked():
    case = make_setup(optimizer="adam", learning_rate=0.001)
    learner = Learner(case.learner, make_model(case))
    assert isinstance(learner.optimizer, torch.optim.Adam)
    assert learner.optimizer.defaults["eps"] == case.learner.adam_epsilon == 1e-8


def vtrace_of(case, batch, outputs) -> vtrace.VTraceFromLogitsReturns:
    """V-trace of ``batch`` ([T+1, B]) under the model ``outputs`` of all its frames."""
    return vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"][1:],
        target_policy_logits=outputs["policy_logits"][:-1],
        actions=batch["action"][1:],
        discounts=(~batch["done"][1:]).float() * case.learner.discounting,
        rewards=torch.clamp(batch["reward"][1:], -1, 1)
        + case.learner.discounting * batch["truncation_value"][1:],
        values=outputs["baseline"][:-1],
        bootstrap_value=outputs["baseline"][-1],
    )


def test_explained_variance_logged_is_that_of_the_vtrace_targets():
    case = make_setup()
    model = make_model(case)
    batch = make_batch()
    with torch.no_grad():
        outputs, _ = model(batch, ())
    values = outputs["baseline"][:-1]
    vs = vtrace_of(case, batch, outputs).vs
    expected = 1 - float((vs - values).var()) / float(vs.var())
    stats = Learner(case.learner, model).learn(batch)
    assert stats["explained_variance"] == pytest.approx(expected, rel=1e-5)


def test_a_failing_later_epoch_leaves_the_weights_and_optimizer_as_they_were():
    case = make_setup(epochs=2)
    learner = Learner(case.learner, make_model(case))
    before = parameters(learner.model)
    optimizer_before = copy.deepcopy(learner.optimizer.state_dict()["state"])
    original_apply, calls = learner._apply, []

    def fail_second_pass(total_loss):
        calls.append(1)
        if len(calls) == 2:
            raise NonFiniteLossError("loss became nan")
        return original_apply(total_loss)

    learner._apply = fail_second_pass
    with pytest.raises(NonFiniteLossError):
        learner.learn(make_batch())
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(), strict=True))
    optimizer_after = learner.optimizer.state_dict()["state"]
    assert optimizer_after.keys() == optimizer_before.keys()
    for index, state in optimizer_after.items():  # RMSprop's mean square as it started
        assert state.keys() == optimizer_before[index].keys()
        assert all(torch.equal(state[key], optimizer_before[index][key]) for key in state)
    assert (learner.step, learner.updates) == (0, 0)


def on_policy(model, batch) -> dict[str, torch.Tensor]:
    """``batch`` as if ``model`` had acted: its behaviour logits are the model's own."""
    with torch.no_grad():
        outputs, _ = model(batch, ())
    logits = batch["policy_logits"].clone()  # [T+1, B, A]
    logits[1:] = outputs["policy_logits"][:-1]  # step t's action was chosen at t - 1
    return batch | {"policy_logits": logits}


def test_ppo_clip_on_policy_has_the_policy_gradient():
    batch = on_policy(make_model(make_setup()), make_batch())
    gradients = []
    for clip in (0.0, 0.2):
        learner = Learner(make_setup(ppo_clip=clip).learner, make_model(make_setup()))
        learner._losses(batch, (), None).pg_loss.backward()
        gradients.append([p.grad.clone() for p in learner.model.parameters() if p.grad is not None])
    for plain, clipped in zip(*gradients, strict=True):
        torch.testing.assert_close(clipped, plain)


def test_ppo_clip_stops_epochs_from_moving_the_policy_far_from_the_behaviour():
    kls = {}
    for clip in (0.0, 0.1):
        case = make_setup(ppo_clip=clip, epochs=30, learning_rate=0.01, entropy_cost=0.0)
        learner = Learner(case.learner, make_model(case))
        batch = on_policy(learner.model, make_batch())
        learner.learn(batch)
        with torch.no_grad():
            outputs, _ = learner.model(batch, ())
        kls[clip] = float(losses.policy_kl(outputs["policy_logits"], batch["policy_logits"]).mean())
    assert kls[0.1] < 0.5 * kls[0.0], kls


def fail_second_pass(learner: Learner) -> None:
    """Makes the second gradient step of each update fail as a non-finite loss would."""
    original_apply, calls = learner._apply, []

    def apply(total_loss):
        calls.append(1)
        if len(calls) % 2 == 0:
            raise NonFiniteLossError("loss became nan")
        return original_apply(total_loss)

    learner._apply = apply


def test_a_failing_later_epoch_leaves_no_optimizer_state_it_created():
    # Adam makes its state at its first step: undone, there is none, as before the update.
    case = make_setup(epochs=2, optimizer="adam", learning_rate=0.001)
    learner = Learner(case.learner, make_model(case))
    before = parameters(learner.model)
    fail_second_pass(learner)
    with pytest.raises(NonFiniteLossError):
        learner.learn(make_batch())
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters(), strict=True))
    assert not learner.optimizer.state


def test_a_failing_later_epoch_is_undone_after_the_learner_loads_a_checkpoint():
    case = make_setup(epochs=2)
    trained = Learner(case.learner, make_model(case))
    trained.learn(make_batch(seed=1))
    learner = Learner(case.learner, make_model(case, seed=2))
    learner.learn(make_batch(seed=2))  # the undo buffer now holds this optimizer's tensors
    learner.load_state_dict(copy.deepcopy(trained.state_dict()))  # ... which loading replaces
    loaded = copy.deepcopy(learner.state_dict())
    fail_second_pass(learner)
    with pytest.raises(NonFiniteLossError):
        learner.learn(make_batch(seed=3))
    for name, tensor in learner.model.state_dict().items():
        assert torch.equal(tensor, loaded["model_state_dict"][name]), name
    for index, state in learner.optimizer.state_dict()["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, loaded["optimizer_state_dict"]["state"][index][key])


def test_the_bootstrap_frame_takes_no_gradient():
    # V-trace takes no gradient through the value beyond the rollout: the learner does not
    # keep the last frame's graph, and the gradient is the one of the whole forward pass.
    case = make_setup()
    model = make_model(case)
    batch = make_batch()
    learner = Learner(case.learner, model)
    learner._losses(batch, (), None).total_loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    outputs, _ = model(batch, (), act=False)  # every frame with a graph, as before
    vs = vtrace_of(case, batch, outputs)
    pg = losses.policy_gradient_loss(
        outputs["policy_logits"][:-1], batch["action"][1:], vs.pg_advantages
    )
    baseline = case.learner.baseline_cost * losses.baseline_loss(vs.vs - outputs["baseline"][:-1])
    entropy = case.learner.entropy_cost * losses.entropy_loss(outputs["policy_logits"][:-1])
    (pg + baseline + entropy).backward()
    for mine, whole in zip(ours, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(mine, whole)


def test_deferred_checks_make_the_same_updates_and_errors_as_checks_of_each_pass():
    results = {}
    for deferred in (False, True):
        case = make_setup(epochs=2, reward_clipping="none")
        learner = Learner(case.learner, make_model(case))
        learner.deferred_checks = deferred
        stats = [learner.learn(make_batch(seed)) for seed in range(3)]
        overflow = make_batch(3)
        overflow["reward"][:] = 3e38  # finite rewards whose returns overflow: loss inf
        with pytest.raises(NonFiniteLossError) as error:
            learner.learn(overflow)
        results[deferred] = stats, parameters(learner.model), str(error.value)
    (stats, weights, message), (deferred_stats, deferred_weights, deferred_message) = (
        results[False],
        results[True],
    )
    np.testing.assert_equal(deferred_stats, stats)
    assert all(torch.equal(a, b) for a, b in zip(weights, deferred_weights, strict=True))
    assert deferred_message == message and message.startswith("loss became")


def test_a_cpu_learner_checks_each_pass():
    case = make_setup()
    assert Learner(case.learner, make_model(case)).deferred_checks is False


@pytest.mark.parametrize("optimizer", [{"optimizer": "adam"}, {"rmsprop_init": 0.0}])
def test_an_undone_first_update_can_keep_the_state_it_made_as_new_state(optimizer):
    # A CUDA graph of the update is captured after such an undo: it must find the state's
    # tensors in place, as a fresh optimizer would have them.
    case = make_setup(**optimizer)
    fresh, undone = Learner(case.learner, make_model(case)), Learner(case.learner, make_model(case))
    buffer = UndoBuffer(undone.model, undone.optimizer)
    for param in undone.model.parameters():  # looked up before, as a graph's setup does:
        undone.optimizer.state[param]  # an empty state, which the undo took for the state
    buffer.save()
    undone.device_update(make_batch(0), (), None)  # the update's work, as a graph's warm-up

    def state_tensors() -> list[torch.Tensor]:
        return [v for state in undone.optimizer.state.values() for v in state.values()]

    made = state_tensors()
    buffer.restore(keep_new_state=True)
    assert len(made) > 0 and all(a is b for a, b in zip(made, state_tensors(), strict=True))
    for seed in (1, 2):
        fresh.learn(make_batch(seed))
        undone.learn(make_batch(seed))
    for mine, theirs in zip(undone.model.parameters(), fresh.model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)

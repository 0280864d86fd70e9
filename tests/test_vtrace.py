"""Specification of V-trace against the direct sum of the IMPALA paper (eq. 1)."""

import numpy as np
import pytest
import torch

from torchbeast.core import vtrace

B = 3
A = 4


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _pick(log_probs, actions):
    return np.take_along_axis(log_probs, actions[..., None], axis=-1)[..., 0]


def _ground_truth(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar, pg_rho_bar):
    """O(T^2) evaluation of eq. 1; thresholds are floats or None (no clipping)."""
    rhos = np.exp(log_rhos)
    clipped_rhos = rhos if rho_bar is None else np.minimum(rhos, rho_bar)
    cs = np.minimum(rhos, 1.0)
    clipped_pg_rhos = rhos if pg_rho_bar is None else np.minimum(rhos, pg_rho_bar)
    values_ext = np.concatenate([values, bootstrap_value[None]])  # V(x_0) .. V(x_T)
    T = len(values)

    vs = np.empty_like(values)
    for s in range(T):
        v_s = values[s].copy()
        weight = np.ones_like(values[s])  # (prod_{i=s}^{t-1} gamma_i) (prod_{i=s}^{t-1} c_i)
        for t in range(s, T):
            delta_t = clipped_rhos[t] * (
                rewards[t] + discounts[t] * values_ext[t + 1] - values_ext[t]
            )
            v_s = v_s + weight * delta_t
            weight = weight * discounts[t] * cs[t]
        vs[s] = v_s

    vs_ext = np.concatenate([vs, bootstrap_value[None]])
    pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_ext[1:] - values)
    return vs, pg_advantages


def _random_inputs(T, seed, trailing=()):
    rng = np.random.default_rng(seed)
    shape = (T, B, *trailing)
    discounts = 0.9 * rng.random(shape) + 0.1
    discounts[rng.random(shape) < 0.2] = 0.0  # episode ends
    return dict(
        log_rhos=rng.uniform(-3.0, 3.0, shape),  # rhos from 0.05 to 20: clipping matters
        discounts=discounts,
        rewards=rng.normal(size=shape),
        values=rng.normal(size=shape),
        bootstrap_value=rng.normal(size=(B, *trailing)),
    )


def _to_torch(inputs, dtype=torch.float64):
    return {k: torch.tensor(v, dtype=dtype) for k, v in inputs.items()}


@pytest.mark.parametrize("T", [1, 5, 20])
@pytest.mark.parametrize(
    "rho_bar, pg_rho_bar", [(1.0, 1.0), (0.5, 2.0), (2.0, 0.5), (None, None), (None, 1.0)]
)
def test_matches_paper_sum(T, rho_bar, pg_rho_bar):
    inputs = _random_inputs(T, seed=T)
    expected_vs, expected_pg = _ground_truth(**inputs, rho_bar=rho_bar, pg_rho_bar=pg_rho_bar)

    out = vtrace.from_importance_weights(
        **_to_torch(inputs), clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar
    )

    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-10, atol=1e-10)


def test_clipping_changes_the_result():
    inputs = _to_torch(_random_inputs(10, seed=0))
    clipped = vtrace.from_importance_weights(**inputs)
    unclipped = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=None, clip_pg_rho_threshold=None
    )
    assert not torch.allclose(clipped.vs, unclipped.vs)
    assert not torch.allclose(clipped.pg_advantages, unclipped.pg_advantages)


def test_default_thresholds_are_one():
    inputs = _random_inputs(10, seed=1)
    expected_vs, expected_pg = _ground_truth(**inputs, rho_bar=1.0, pg_rho_bar=1.0)

    out = vtrace.from_importance_weights(**_to_torch(inputs))

    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-10, atol=1e-10)


def test_thresholds_may_be_zero_dim_tensors():
    inputs = _random_inputs(10, seed=2)
    expected_vs, expected_pg = _ground_truth(**inputs, rho_bar=0.5, pg_rho_bar=2.0)

    out = vtrace.from_importance_weights(
        **_to_torch(inputs),
        clip_rho_threshold=torch.tensor(0.5, dtype=torch.float64),
        clip_pg_rho_threshold=torch.tensor(2.0, dtype=torch.float64),
    )

    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-10, atol=1e-10)


def test_float32_inputs_give_float32_results_close_to_ground_truth():
    inputs = _random_inputs(15, seed=3)
    expected_vs, expected_pg = _ground_truth(**inputs, rho_bar=1.0, pg_rho_bar=1.0)

    out = vtrace.from_importance_weights(**_to_torch(inputs, dtype=torch.float32))

    assert out.vs.dtype == torch.float32
    assert out.pg_advantages.dtype == torch.float32
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-5, atol=1e-5)


def test_shapes_follow_inputs():
    out = vtrace.from_importance_weights(**_to_torch(_random_inputs(7, seed=4)))
    assert out.vs.shape == (7, B)
    assert out.pg_advantages.shape == (7, B)


def test_trailing_dimensions_are_independent_slices():
    inputs = _to_torch(_random_inputs(8, seed=5, trailing=(2,)))

    out = vtrace.from_importance_weights(**inputs, clip_rho_threshold=0.5)

    assert out.vs.shape == (8, B, 2)
    for k in range(2):
        sliced = vtrace.from_importance_weights(
            **{name: x[..., k] for name, x in inputs.items()}, clip_rho_threshold=0.5
        )
        torch.testing.assert_close(out.vs[..., k], sliced.vs)
        torch.testing.assert_close(out.pg_advantages[..., k], sliced.pg_advantages)


def test_on_policy_without_discount_is_one_step_td():
    """With rho = 1 and gamma = 0, v_s = r_s and the advantage is r_s - V(x_s)."""
    rng = np.random.default_rng(6)
    rewards = torch.tensor(rng.normal(size=(5, B)))
    values = torch.tensor(rng.normal(size=(5, B)))

    out = vtrace.from_importance_weights(
        log_rhos=torch.zeros(5, B, dtype=torch.float64),
        discounts=torch.zeros(5, B, dtype=torch.float64),
        rewards=rewards,
        values=values,
        bootstrap_value=torch.tensor(rng.normal(size=B)),
    )

    torch.testing.assert_close(out.vs, rewards)
    torch.testing.assert_close(out.pg_advantages, rewards - values)


def test_action_log_probs_is_log_softmax_at_actions():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, B, A))
    actions = rng.integers(0, A, size=(6, B))

    log_probs = vtrace.action_log_probs(torch.tensor(logits), torch.tensor(actions))

    assert log_probs.shape == (6, B)
    np.testing.assert_allclose(log_probs.numpy(), _pick(_log_softmax(logits), actions), rtol=1e-12)


def _random_logits_inputs(T, seed):
    rng = np.random.default_rng(seed)
    inputs = _random_inputs(T, seed)
    del inputs["log_rhos"]
    inputs = _to_torch(inputs)
    behavior_logits = rng.normal(scale=2.0, size=(T, B, A))
    target_logits = rng.normal(scale=2.0, size=(T, B, A))
    actions = rng.integers(0, A, size=(T, B))
    return behavior_logits, target_logits, actions, inputs


def test_from_logits_log_probs_and_log_rhos():
    behavior_logits, target_logits, actions, inputs = _random_logits_inputs(9, seed=8)

    out = vtrace.from_logits(
        torch.tensor(behavior_logits), torch.tensor(target_logits), torch.tensor(actions), **inputs
    )

    expected_behavior = _pick(_log_softmax(behavior_logits), actions)
    expected_target = _pick(_log_softmax(target_logits), actions)
    np.testing.assert_allclose(out.behavior_action_log_probs.numpy(), expected_behavior, rtol=1e-12)
    np.testing.assert_allclose(out.target_action_log_probs.numpy(), expected_target, rtol=1e-12)
    np.testing.assert_allclose(
        out.log_rhos.numpy(), expected_target - expected_behavior, rtol=1e-12, atol=1e-12
    )


def test_from_logits_targets_match_from_importance_weights():
    behavior_logits, target_logits, actions, inputs = _random_logits_inputs(9, seed=9)

    out = vtrace.from_logits(
        torch.tensor(behavior_logits),
        torch.tensor(target_logits),
        torch.tensor(actions),
        **inputs,
        clip_rho_threshold=0.5,
        clip_pg_rho_threshold=2.0,
    )
    reference = vtrace.from_importance_weights(
        out.log_rhos, **inputs, clip_rho_threshold=0.5, clip_pg_rho_threshold=2.0
    )

    torch.testing.assert_close(out.vs, reference.vs)
    torch.testing.assert_close(out.pg_advantages, reference.pg_advantages)


def test_targets_carry_no_gradient():
    inputs = {
        k: v.requires_grad_() if v.is_floating_point() else v
        for k, v in _to_torch(_random_inputs(6, seed=10)).items()
    }

    out = vtrace.from_importance_weights(**inputs)

    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad


def test_from_logits_targets_carry_no_gradient():
    behavior_logits, target_logits, actions, inputs = _random_logits_inputs(6, seed=11)
    for v in inputs.values():
        v.requires_grad_()

    out = vtrace.from_logits(
        torch.tensor(behavior_logits, requires_grad=True),
        torch.tensor(target_logits, requires_grad=True),
        torch.tensor(actions),
        **inputs,
    )

    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad


# Partial rollouts: a mask [T, B], True for the real prefix of each column.

LENGTHS = (8, 5, 1)  # real steps per column; the first column is not cut


def _prefix_mask(T, lengths, dtype=torch.bool):
    return (torch.arange(T)[:, None] < torch.tensor(lengths)[None, :]).to(dtype)  # [T, B]


def _truncated_column(inputs, b, n):
    """Column b cut to its n real steps, bootstrapping from the value at the cut."""
    column = {name: x[:n, b : b + 1] for name, x in inputs.items() if name != "bootstrap_value"}
    T = inputs["values"].shape[0]
    cut = inputs["values"][n, b : b + 1] if n < T else inputs["bootstrap_value"][b : b + 1]
    return column, cut


def test_masked_column_equals_vtrace_on_its_truncated_sequence():
    inputs = _to_torch(_random_inputs(8, seed=12))  # padding holds random data, not zeros

    out = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=0.5, clip_pg_rho_threshold=2.0, mask=_prefix_mask(8, LENGTHS)
    )

    for b, n in enumerate(LENGTHS):
        column, cut = _truncated_column(inputs, b, n)
        short = vtrace.from_importance_weights(
            **column, bootstrap_value=cut, clip_rho_threshold=0.5, clip_pg_rho_threshold=2.0
        )
        torch.testing.assert_close(out.vs[:n, b : b + 1], short.vs)
        torch.testing.assert_close(out.pg_advantages[:n, b : b + 1], short.pg_advantages)


def test_from_logits_masked_column_equals_its_truncated_sequence():
    behavior_logits, target_logits, actions, inputs = _random_logits_inputs(8, seed=13)
    logits_inputs = dict(
        behavior_policy_logits=torch.tensor(behavior_logits),
        target_policy_logits=torch.tensor(target_logits),
        actions=torch.tensor(actions),
    )

    out = vtrace.from_logits(**logits_inputs, **inputs, mask=_prefix_mask(8, LENGTHS))

    for b, n in enumerate(LENGTHS):
        column, cut = _truncated_column(inputs, b, n)
        short = vtrace.from_logits(
            **{name: x[:n, b : b + 1] for name, x in logits_inputs.items()},
            **column,
            bootstrap_value=cut,
        )
        torch.testing.assert_close(out.vs[:n, b : b + 1], short.vs)
        torch.testing.assert_close(out.pg_advantages[:n, b : b + 1], short.pg_advantages)


def test_padded_steps_have_vs_equal_to_values_and_zero_advantage():
    inputs = _to_torch(_random_inputs(8, seed=14))
    padded = ~_prefix_mask(8, LENGTHS)

    out = vtrace.from_importance_weights(**inputs, mask=~padded)

    assert padded.any()
    torch.testing.assert_close(out.vs[padded], inputs["values"][padded], rtol=0, atol=0)
    assert torch.all(out.pg_advantages[padded] == 0)


def test_mask_none_matches_paper_sum():
    inputs = _random_inputs(10, seed=15)
    expected_vs, expected_pg = _ground_truth(**inputs, rho_bar=1.0, pg_rho_bar=1.0)

    out = vtrace.from_importance_weights(**_to_torch(inputs), mask=None)

    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_pg, rtol=1e-10, atol=1e-10)


def test_all_true_mask_gives_the_unmasked_result():
    inputs = _to_torch(_random_inputs(10, seed=16))

    masked = vtrace.from_importance_weights(**inputs, mask=torch.ones(10, B, dtype=torch.bool))
    unmasked = vtrace.from_importance_weights(**inputs)

    assert torch.equal(masked.vs, unmasked.vs)
    assert torch.equal(masked.pg_advantages, unmasked.pg_advantages)


def test_float_mask_equals_bool_mask_and_keeps_the_input_dtype():
    inputs = _to_torch(_random_inputs(8, seed=17), dtype=torch.float32)

    with_bool = vtrace.from_importance_weights(**inputs, mask=_prefix_mask(8, LENGTHS))
    with_float = vtrace.from_importance_weights(
        **inputs, mask=_prefix_mask(8, LENGTHS, dtype=torch.float64)
    )

    assert with_float.vs.dtype == with_float.pg_advantages.dtype == torch.float32
    assert torch.equal(with_bool.vs, with_float.vs)
    assert torch.equal(with_bool.pg_advantages, with_float.pg_advantages)


def test_mask_broadcasts_over_trailing_dimensions():
    inputs = _to_torch(_random_inputs(8, seed=18, trailing=(2,)))
    mask = _prefix_mask(8, LENGTHS)

    out = vtrace.from_importance_weights(**inputs, mask=mask)

    for k in range(2):
        sliced = vtrace.from_importance_weights(
            **{name: x[..., k] for name, x in inputs.items()}, mask=mask
        )
        torch.testing.assert_close(out.vs[..., k], sliced.vs)
        torch.testing.assert_close(out.pg_advantages[..., k], sliced.pg_advantages)

"""V-trace off-policy actor-critic targets (Espeholt et al., 2018, "IMPALA", section 4).

Shapes: T is the unroll length, B the batch size and A the number of actions. Per-step
quantities (log_rhos, discounts, rewards, values) are [T, B, ...] and the bootstrap value
is [B, ...]; any trailing dimensions broadcast through unchanged.

For s = T-1 down to 0 the targets satisfy

    v_s = V(x_s) + delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))
    delta_s = rho_s * (r_s + gamma_s * V(x_{s+1}) - V(x_s))

with rho_s = min(rho_bar, pi/mu), c_s = min(1, pi/mu) and v_T = V(x_T) = bootstrap_value.
The policy-gradient advantage is min(rho_bar_pg, pi/mu) * (r_s + gamma_s * v_{s+1} - V(x_s)).

An optional ``mask`` [T, B] (True for steps to learn from) handles rollouts cut short and
padded to T: rho_s and c_s are zero at padded steps, so there v_s = V(x_s) and the advantage
is 0, and the last real step bootstraps from V(x_{s+1}), the value of the frame at the cut,
exactly as if V-trace ran on the short column with that bootstrap value. A False step in
the middle of a column (a replayed state outside LASER's trust region) is cut the same way:
no trace passes through it, and the step before it bootstraps from its value.
"""

import collections

import torch
import torch.nn.functional as F

VTraceFromLogitsReturns = collections.namedtuple(
    "VTraceFromLogitsReturns",
    [
        "vs",
        "pg_advantages",
        "log_rhos",
        "behavior_action_log_probs",
        "target_action_log_probs",
    ],
)

VTraceReturns = collections.namedtuple("VTraceReturns", ["vs", "pg_advantages"])

Threshold = float | torch.Tensor | None


def action_log_probs(policy_logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|x) of the taken actions.

    policy_logits: [T, B, A] unnormalised logits; actions: [T, B] int64.
    Returns [T, B] (the shape of ``actions``).
    """
    log_probs = F.log_softmax(torch.flatten(policy_logits, 0, -2), dim=-1)  # [T*B, A]
    return -F.nll_loss(log_probs, torch.flatten(actions), reduction="none").view_as(actions)


def from_logits(
    behavior_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Threshold = 1.0,
    clip_pg_rho_threshold: Threshold = 1.0,
    *,
    mask: torch.Tensor | None = None,
) -> VTraceFromLogitsReturns:
    """V-trace targets from behaviour (mu) and target (pi) policy logits.

    behavior_policy_logits, target_policy_logits: [T, B, A]; actions: [T, B];
    discounts, rewards, values: [T, B]; bootstrap_value: [B]; mask: None or [T, B] bool or
    float, True (1) for real steps (see the module docstring).
    Returns vs and pg_advantages [T, B] plus the log-probabilities and log_rhos [T, B].
    """
    target_action_log_probs = action_log_probs(target_policy_logits, actions)  # [T, B]
    behavior_action_log_probs = action_log_probs(behavior_policy_logits, actions)  # [T, B]
    log_rhos = target_action_log_probs - behavior_action_log_probs  # [T, B]
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        mask=mask,
    )
    return VTraceFromLogitsReturns(
        log_rhos=log_rhos,
        behavior_action_log_probs=behavior_action_log_probs,
        target_action_log_probs=target_action_log_probs,
        **vtrace_returns._asdict(),
    )


@torch.no_grad()
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Threshold = 1.0,
    clip_pg_rho_threshold: Threshold = 1.0,
    *,
    mask: torch.Tensor | None = None,
) -> VTraceReturns:
    """V-trace targets from log importance weights log(pi(a|x) / mu(a|x)).

    log_rhos, discounts, rewards, values: [T, B, ...]; bootstrap_value: [B, ...].
    A threshold of None disables that clipping. mask: None or [T, B] (or [T, B, ...]) bool
    or float, True (1) for real steps; padded steps get vs = values and pg_advantages = 0.
    Returns vs and pg_advantages [T, B, ...], computed without gradient.
    """
    rhos = torch.exp(log_rhos)  # [T, B, ...]
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = rhos.clamp(max=1.0)  # [T, B, ...] truncated traces
    if mask is not None:
        # In the dtype of rhos so that a float64 mask does not promote float32 results.
        mask = mask.to(rhos.dtype)
        mask = mask.reshape(*mask.shape, *(1,) * (rhos.dim() - mask.dim()))  # [T, B, 1...]
        # Zero weights and traces at padded steps: nothing there reaches the real prefix.
        clipped_rhos = clipped_rhos * mask
        cs = cs * mask

    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])  # [T, B, ...]
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)  # [T, B, ...]

    acc = torch.zeros_like(bootstrap_value)  # [B, ...] v_{s+1} - V(x_{s+1}), zero at s = T
    vs_minus_v_xs = []
    for t in reversed(range(log_rhos.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v_xs.append(acc)
    vs_minus_v_xs = torch.stack(vs_minus_v_xs[::-1])  # [T, B, ...]
    vs = vs_minus_v_xs + values  # [T, B, ...]

    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])  # [T, B, ...]
    clipped_pg_rhos = (
        rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    )
    if mask is not None:
        clipped_pg_rhos = clipped_pg_rhos * mask
    pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)  # [T, B, ...]
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)

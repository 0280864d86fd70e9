"""IMPALA loss terms, as in TorchBeast: sums over the T x B batch.

Each term takes an optional ``mask`` [T, B] (bool or float, True for real steps) so that
padded steps of a rollout cut short add nothing to the loss or its gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _masked_sum(per_step: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Sum of per_step [T, B]; with a mask only the real steps count."""
    if mask is None:
        return torch.sum(per_step)
    return torch.sum(per_step * mask.to(per_step.dtype))


def policy_gradient_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """-sum log pi(a|x) * A over [T, B]; advantages carry no gradient.

    logits: [T, B, A]; actions, advantages and mask: [T, B].
    """
    cross_entropy = F.nll_loss(
        F.log_softmax(torch.flatten(logits, 0, 1), dim=-1),
        target=torch.flatten(actions, 0, 1),
        reduction="none",
    ).view_as(advantages)  # [T, B]
    return _masked_sum(cross_entropy * advantages.detach(), mask)


def clipped_surrogate_loss(
    log_rhos: torch.Tensor,
    advantages: torch.Tensor,
    clip: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate, -sum min(r A, clip(r, 1 - clip, 1 + clip) A) over [T, B],
    where r = pi(a|x) / mu(a|x) is the importance weight of the action against the policy
    that chose it (``log_rhos``, with gradient through pi). Where r has moved beyond the
    clip in the direction A favours, the step adds no gradient: several passes over one
    batch (``--epochs``) cannot push the policy far from the one that acted.

    log_rhos, advantages and mask: [T, B]; advantages carry no gradient.
    """
    ratio = torch.exp(log_rhos)  # [T, B]
    advantages = advantages.detach()
    surrogate = torch.minimum(
        ratio * advantages, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    )  # [T, B]
    return -_masked_sum(surrogate, mask)


def baseline_loss(advantages: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """0.5 * sum (vs - V)^2 over [T, B]; advantages and mask: [T, B]."""
    return 0.5 * _masked_sum(advantages**2, mask)


def entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """sum pi log pi over [T, B, A]: the negative entropy, which the loss minimises.

    mask: [T, B].
    """
    policy = F.softmax(logits, dim=-1)
    log_policy = F.log_softmax(logits, dim=-1)
    if mask is None:
        # One sum over [T, B, A], as before masks existed (keeps results bit for bit).
        return torch.sum(policy * log_policy)
    return _masked_sum(torch.sum(policy * log_policy, dim=-1), mask)  # [T, B] summed


def policy_kl(target_logits: torch.Tensor, behaviour_logits: torch.Tensor) -> torch.Tensor:
    """KL(pi || mu) per state, in nats: how far the target policy moved from the behaviour one.

    target_logits, behaviour_logits: [T, B, A]. Returns [T, B], without gradient.
    """
    with torch.no_grad():
        log_pi = F.log_softmax(target_logits, dim=-1)
        log_mu = F.log_softmax(behaviour_logits, dim=-1)
        return torch.sum(log_pi.exp() * (log_pi - log_mu), dim=-1)


def normalize(advantages: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages [T, B] shifted and scaled to mean 0 and standard deviation 1 over the
    real steps (``mask``), as PPO does per batch; padded steps stay 0."""
    real = advantages if mask is None else advantages[mask.bool()]
    if real.numel() < 2:
        return advantages
    normalized = (advantages - real.mean()) / (real.std() + 1e-8)
    return normalized if mask is None else normalized * mask.to(normalized.dtype)


def clip_rewards(rewards: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "abs_one":
        return torch.clamp(rewards, -1, 1)
    if mode == "none":
        return rewards
    raise ValueError(f"unknown reward clipping {mode!r}: use abs_one or none")

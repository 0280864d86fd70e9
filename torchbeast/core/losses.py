"""IMPALA loss terms, as in TorchBeast: sums over the T x B batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def policy_gradient_loss(
    logits: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """-sum log pi(a|x) * A over [T, B]; advantages carry no gradient."""
    cross_entropy = F.nll_loss(
        F.log_softmax(torch.flatten(logits, 0, 1), dim=-1),
        target=torch.flatten(actions, 0, 1),
        reduction="none",
    ).view_as(advantages)  # [T, B]
    return torch.sum(cross_entropy * advantages.detach())


def baseline_loss(advantages: torch.Tensor) -> torch.Tensor:
    """0.5 * sum (vs - V)^2 over [T, B]."""
    return 0.5 * torch.sum(advantages**2)


def entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    """sum pi log pi over [T, B, A]: the negative entropy, which the loss minimises."""
    policy = F.softmax(logits, dim=-1)
    log_policy = F.log_softmax(logits, dim=-1)
    return torch.sum(policy * log_policy)


def clip_rewards(rewards: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "abs_one":
        return torch.clamp(rewards, -1, 1)
    if mode == "none":
        return rewards
    raise ValueError(f"unknown reward clipping {mode!r}: use abs_one or none")

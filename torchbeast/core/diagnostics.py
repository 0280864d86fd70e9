"""The learner's per-update diagnostics: whether a run learns or drifts (policy entropy,
KL to the behaviour policy, clipped importance weights, explained variance, policy lag)."""

from __future__ import annotations

import math

import torch

from torchbeast.core import losses, vtrace

# An importance weight counts as clipped when it exceeds V-trace's clip at 1 by 1%.
CLIP_MARGIN = math.log(1.01)


def mean_or_nan(values: torch.Tensor) -> float:
    return float(values.mean()) if values.numel() else math.nan


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> float:
    """Mean of values [T, B] over the steps where mask is True (all when None)."""
    if mask is not None:
        values = values[mask.bool()]
    return mean_or_nan(values.float())


def explained_variance(targets: torch.Tensor, predictions: torch.Tensor) -> float:
    """1 - Var(targets - predictions) / Var(targets): 1 is a perfect value function, 0 is
    no better than a constant, below 0 worse than one. NaN when the targets are constant."""
    if targets.numel() < 2:
        return math.nan
    variance = float(targets.var())
    if variance == 0.0:
        return math.nan
    return 1.0 - float((targets - predictions).var()) / variance


@torch.no_grad()
def diagnostics(
    learner_outputs: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    vtrace_returns: vtrace.VTraceFromLogitsReturns,
    online: torch.Tensor | None,
    real: torch.Tensor,
) -> dict[str, float]:
    """What tells a researcher whether a run learns, per update:

    - ``policy_entropy``: the learner policy's entropy, nats per step (ln A is uniform);
    - ``policy_kl``: KL(learner policy || behaviour policy), nats per step;
    - ``clipped_rho_fraction``: steps whose importance weight pi/mu V-trace clipped at 1
      (by more than 1%, so that float noise does not count);
    - ``explained_variance``: how much of the V-trace targets' variance the baseline
      explains;
    - ``policy_lag``: how many updates old the weights were that chose the actions.

    All over the online steps (``online`` [T, B], or every ``real`` step when None).
    """
    logits = learner_outputs["policy_logits"]  # [T, B, A]
    log_policy = torch.log_softmax(logits, dim=-1)
    entropy = -torch.sum(log_policy.exp() * log_policy, dim=-1)  # [T, B]
    kl = losses.policy_kl(logits, batch["policy_logits"])  # [T, B]
    # Clipped beyond float noise between the actors' and the learner's forward passes.
    clipped = (vtrace_returns.log_rhos > CLIP_MARGIN).float()  # [T, B]
    steps = real if online is None else online.bool()  # online steps only, no replay
    stats = {
        "policy_entropy": _masked_mean(entropy, steps),
        "policy_kl": _masked_mean(kl, steps),
        "clipped_rho_fraction": _masked_mean(clipped, steps),
        "explained_variance": explained_variance(
            vtrace_returns.vs[steps], learner_outputs["baseline"][steps]
        ),
    }
    if "policy_version" in batch:
        stats["policy_version"] = _masked_mean(batch["policy_version"], steps)
    return stats

"""The learner's per-update diagnostics: whether a run learns or drifts (policy entropy,
KL to the behaviour policy, clipped importance weights, explained variance, policy lag).

Each figure is a 0-dim tensor on the learner's device, so that an update reads all of
its figures from the device at once (``Learner``), not one wait for the device each."""

from __future__ import annotations

import math

import torch

from torchbeast.core import losses, vtrace

# An importance weight counts as clipped when it exceeds V-trace's clip at 1 by 1%.
CLIP_MARGIN = math.log(1.01)


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` [T, B] over the steps where ``mask`` is True (all when None), as a
    0-dim float64 tensor (float32 sums of large returns overflow to inf); NaN when there
    are none."""
    values = values.double()
    if mask is None:
        return values.mean() if values.numel() else values.new_tensor(math.nan)
    mask = mask.bool()
    return torch.where(mask, values, 0.0).sum() / mask.sum()


def explained_variance(
    targets: torch.Tensor, predictions: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """1 - Var(targets - predictions) / Var(targets) over the steps of ``mask`` (all when
    None): 1 is a perfect value function, 0 is no better than a constant, below 0 worse
    than one. NaN when the targets are constant or fewer than 2. A 0-dim tensor."""
    if mask is None:
        mask = torch.ones_like(targets, dtype=torch.bool)
    mask = mask.bool()
    count = mask.sum()

    def variance(values: torch.Tensor) -> torch.Tensor:  # unbiased, as torch.var
        mean = torch.where(mask, values, 0.0).sum() / count
        return torch.where(mask, (values - mean).square(), 0.0).sum() / (count - 1)

    target_variance = variance(targets.float())
    explained = 1.0 - variance((targets - predictions).float()) / target_variance
    return torch.where((count >= 2) & (target_variance > 0), explained, math.nan)


@torch.no_grad()
def diagnostics(
    learner_outputs: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    vtrace_returns: vtrace.VTraceFromLogitsReturns,
    online: torch.Tensor | None,
    real: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """What tells a researcher whether a run learns, per update:

    - ``policy_entropy``: the learner policy's entropy, nats per step (ln A is uniform);
    - ``policy_kl``: KL(learner policy || behaviour policy), nats per step;
    - ``clipped_rho_fraction``: steps whose importance weight pi/mu V-trace clipped at 1
      (by more than 1%, so that float noise does not count);
    - ``explained_variance``: how much of the V-trace targets' variance the baseline
      explains;
    - ``policy_version``: the mean version of the weights that chose the actions.

    All over the online steps (``online`` [T, B], or every ``real`` step when None), as
    0-dim tensors.
    """
    logits = learner_outputs["policy_logits"]  # [T, B, A]
    log_policy = torch.log_softmax(logits, dim=-1)
    entropy = -torch.sum(log_policy.exp() * log_policy, dim=-1)  # [T, B]
    kl = losses.policy_kl(logits, batch["policy_logits"])  # [T, B]
    # Clipped beyond float noise between the actors' and the learner's forward passes.
    clipped = vtrace_returns.log_rhos > CLIP_MARGIN  # [T, B]
    steps = real if online is None else online.bool()  # online steps only, no replay
    stats = {
        "policy_entropy": masked_mean(entropy, steps),
        "policy_kl": masked_mean(kl, steps),
        "clipped_rho_fraction": masked_mean(clipped, steps),
        "explained_variance": explained_variance(
            vtrace_returns.vs, learner_outputs["baseline"], steps
        ),
    }
    if "policy_version" in batch:
        stats["policy_version"] = masked_mean(batch["policy_version"], steps)
    return stats

"""The IMPALA losses of one batch under the learner's current weights: V-trace targets and
advantages, the policy-gradient, baseline and entropy terms, with padded steps and (LASER)
untrusted replayed states left out; see ``core.learner`` for the batch's layout."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from torchbeast.core import losses, rollout, vtrace
from torchbeast.core.models import CoreState
from torchbeast.core.value_scale import ValueScale

if TYPE_CHECKING:
    from torchbeast.core.settings import LearnerSettings


@dataclasses.dataclass
class LossTerms:
    """One pass's losses (scalars with gradient) and the tensors they came from, [T, B]:
    the batch without its overlap step and the outputs without the bootstrap step."""

    total_loss: torch.Tensor
    pg_loss: torch.Tensor
    baseline_loss: torch.Tensor
    entropy_loss: torch.Tensor
    batch: dict[str, torch.Tensor]
    learner_outputs: dict[str, torch.Tensor]
    vtrace_returns: vtrace.VTraceFromLogitsReturns
    real: torch.Tensor  # real (not padded) steps
    online: torch.Tensor  # real steps of online columns
    loss_mask: torch.Tensor | None  # steps in the policy and baseline losses
    entropy_mask: torch.Tensor | None  # steps in the entropy loss: online ones
    trusted_fraction: torch.Tensor | float  # of the replayed steps; NaN without any
    num_online: int


def loss_terms(
    settings: LearnerSettings,
    model: nn.Module,
    value_scale: ValueScale,
    batch: dict[str, torch.Tensor],
    initial_core_state: CoreState,
    num_online: int | None,
) -> LossTerms:
    """The V-trace losses of ``batch`` ([T+1, B, ...]) under ``model``'s current weights,
    and what they used; ``num_online``: see ``Learner.learn``."""
    # Steps 0..T-1 with gradient; the last frame only bootstraps the value beyond the
    # rollout, and V-trace takes no gradient through it, so its forward pass keeps no graph
    # (a sixth of the backward pass at T=5).
    inputs = {key: batch[key][:-1] for key in rollout.MODEL_KEYS}
    learner_outputs, core_state = model(inputs, initial_core_state, act=False)  # [T, B, ...]
    with torch.no_grad():
        last = {key: batch[key][-1:] for key in rollout.MODEL_KEYS}
        bootstrap_value = model(last, core_state, act=False)[0]["baseline"][0]  # [B]
    scale = value_scale.scale  # the baseline head predicts V / scale
    if value_scale.enabled:
        learner_outputs["baseline"] = scale * learner_outputs["baseline"]  # [T, B]
        bootstrap_value = scale * bootstrap_value

    # Drop the overlap step of the batch: step t's action was chosen at output t - 1.
    batch = {key: tensor[1:] for key, tensor in batch.items()}
    mask = batch.get("mask")  # [T, B] True for real new steps, or None: all real
    T, B = batch["reward"].shape
    num_online = B if num_online is None else num_online
    real = torch.ones(T, B, dtype=torch.bool, device=batch["reward"].device)
    if mask is not None:
        real = mask.bool()
    online = torch.zeros_like(real)  # [T, B] real steps of online columns
    online[:, :num_online] = real[:, :num_online]
    loss_mask, entropy_mask, trusted_fraction = mask, mask, math.nan
    if num_online < B:
        kl = losses.policy_kl(learner_outputs["policy_logits"], batch["policy_logits"])  # [T, B]
        trusted = kl <= settings.trust_region_threshold
        replayed = real & ~online
        trusted_fraction = (trusted & replayed).sum() / replayed.sum().clamp(min=1)
        loss_mask = online | (replayed & trusted)  # [T, B]
        entropy_mask = online

    rewards = losses.clip_rewards(batch["reward"], settings.reward_clipping)  # [T, B]
    if not settings.truncation_as_termination:
        # Where a time limit cut an episode short (done, so discounted by 0), its last step
        # goes on with the value of the state it stopped in, as the actor's model saw it.
        truncation_value = scale * batch["truncation_value"]  # [T, B], 0 at other steps
        rewards = rewards + settings.discounting * truncation_value
    discounts = (~batch["done"]).float() * settings.discounting  # [T, B]

    vtrace_returns = vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"],
        target_policy_logits=learner_outputs["policy_logits"],
        actions=batch["action"],
        discounts=discounts,
        rewards=rewards,
        values=learner_outputs["baseline"],
        bootstrap_value=bootstrap_value,
        mask=loss_mask,
    )
    advantages = vtrace_returns.pg_advantages / scale  # [T, B]
    if settings.ppo_clip > 0:
        # The surrogate weighs each step by pi/mu itself: V-trace's advantages without
        # their clipped weight min(1, pi/mu) (0 at padded steps, so 0 stays 0).
        weights = torch.exp(vtrace_returns.log_rhos.detach()).clamp(max=1.0)  # [T, B]
        advantages = advantages / weights.clamp(min=torch.finfo(weights.dtype).tiny)
    if settings.normalize_advantages:
        advantages = losses.normalize(advantages, loss_mask)

    if settings.ppo_clip > 0:
        pg_loss = losses.clipped_surrogate_loss(
            vtrace_returns.log_rhos, advantages, settings.ppo_clip, mask=loss_mask
        )
    else:
        pg_loss = losses.policy_gradient_loss(
            learner_outputs["policy_logits"], batch["action"], advantages, mask=loss_mask
        )
    baseline_loss = settings.baseline_cost * losses.baseline_loss(
        (vtrace_returns.vs - learner_outputs["baseline"]) / scale, mask=loss_mask
    )
    entropy_loss = settings.entropy_cost * losses.entropy_loss(
        learner_outputs["policy_logits"], mask=entropy_mask
    )
    return LossTerms(
        total_loss=pg_loss + baseline_loss + entropy_loss,
        pg_loss=pg_loss,
        baseline_loss=baseline_loss,
        entropy_loss=entropy_loss,
        batch=batch,
        learner_outputs=learner_outputs,
        vtrace_returns=vtrace_returns,
        real=real,
        online=online,
        loss_mask=loss_mask,
        entropy_mask=entropy_mask,
        trusted_fraction=trusted_fraction,
        num_online=num_online,
    )

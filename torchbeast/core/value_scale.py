"""The baseline's scale: PopArt's (van Hasselt et al. 2016; Hessel et al. 2019) without its
shift, and never below 1.

With ``--normalize_values`` the baseline head predicts V(s) / sigma, where sigma is the
running root mean square of the V-trace targets, floored at 1: returns of unit scale (the
clipped rewards of Pong) are learned exactly as without it, and large ones (+1 per step
alive, as in CartPole or a survival proxy, where targets reach 1 / (1 - discount) = 100)
are learned at unit scale. Without it the baseline regression on such targets grows the
shared torso's features until the policy logits, which read the same features, saturate:
the policy collapses to one action within a few dozen updates.

When sigma changes, the head's weights are rescaled so that its unnormalised output
V(s) stays the same (PopArt's "preserving outputs"). The policy gradient's advantages are
divided by sigma too, as PopArt does: advantages of raw size (a lost life under a survival
reward costs up to 100) would otherwise collapse the policy just the same.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Weight of each update's targets in the running mean square: a time constant of about
# 1,000 updates, debiased so that the first updates are not pulled towards 0.
DECAY = 1e-3


class ValueScale:
    """sigma = max(1, sqrt(running mean of the V-trace targets' squares)); 1 when off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.scale = 1.0
        self.mean_square = 0.0
        self.updates = 0

    def update(self, targets: torch.Tensor, head: nn.Linear) -> None:
        """Moves sigma towards the V-trace targets of one batch ([N], unnormalised) and
        rescales ``head`` so that sigma * head(x) is unchanged."""
        if not self.enabled or targets.numel() == 0:
            return
        self.updates += 1
        self.mean_square += DECAY * (float(targets.double().square().mean()) - self.mean_square)
        debiased = self.mean_square / (1.0 - (1.0 - DECAY) ** self.updates)
        scale = max(1.0, math.sqrt(debiased))
        if scale != self.scale:
            with torch.no_grad():
                head.weight.mul_(self.scale / scale)
                head.bias.mul_(self.scale / scale)
            self.scale = scale

    def state_dict(self) -> dict:
        return {"scale": self.scale, "mean_square": self.mean_square, "updates": self.updates}

    def load_state_dict(self, state: dict, head: nn.Linear) -> None:
        """A checkpoint's sigma (``head``: the baseline head it was saved with). Resumed
        without --normalize_values, the head is rescaled to predict V itself, sigma
        folded into its weights: the values stay those the run learnt."""
        scale = float(state["scale"])
        if not self.enabled:
            if scale != 1.0:
                with torch.no_grad():
                    head.weight.mul_(scale)
                    head.bias.mul_(scale)
            return
        self.scale = scale
        self.mean_square = float(state["mean_square"])
        self.updates = int(state["updates"])

"""Moving a model's weights: into another model of the same architecture, or through one
flat float32 tensor (shared memory, Ray's object store). ``copy_`` keeps each target's own
memory layout (channels_last), and the policy version travels with the weights."""

from __future__ import annotations

import torch
from torch import nn


def num_weights(model: nn.Module) -> int:
    return sum(param.numel() for param in model.parameters())


def flat_views(model: nn.Module, flat: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each parameter of ``model`` with its slice of ``flat`` [num_weights], in order."""
    views, offset = [], 0
    for param in model.parameters():
        views.append((param, flat[offset : offset + param.numel()].view(param.shape)))
        offset += param.numel()
    return views


@torch.no_grad()
def weights_are_finite(model: nn.Module) -> bool:
    """Whether every weight of ``model`` is finite (an update too large, e.g. of an absurd
    learning rate, can break them where its loss and gradient were not)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


@torch.no_grad()
def copy_weights(target: nn.Module, source: nn.Module) -> None:
    """``source``'s parameters and policy version into ``target``."""
    for to, parameter in zip(target.parameters(), source.parameters(), strict=True):
        to.copy_(parameter)  # across devices too (a CPU copy of a CUDA model)
    target.policy_version.copy_(source.policy_version)


@torch.no_grad()
def flatten(model: nn.Module, out: torch.Tensor | None = None) -> torch.Tensor:
    """The parameters as one flat tensor (into ``out`` if given, e.g. shared memory)."""
    if out is None:
        return torch.cat([param.detach().reshape(-1) for param in model.parameters()])
    for param, view in flat_views(model, out):
        view.copy_(param)
    return out


@torch.no_grad()
def load_flat(model: nn.Module, flat: torch.Tensor, non_blocking: bool = False) -> None:
    """The parameters from one flat tensor (``flatten``'s); ``non_blocking``: copies from
    pinned memory to a GPU that the host does not wait for."""
    for param, view in flat_views(model, flat):
        param.copy_(view, non_blocking=non_blocking)

"""Moving a model's weights: into another model of the same architecture, or through one
flat float32 tensor (shared memory, Ray's object store). ``copy_`` keeps each target's own
memory layout (channels_last), and the policy version travels with the weights. And
whether the weights an update left can still be used (``model_is_sound``)."""

from __future__ import annotations

import torch
from torch import nn

from torchbeast.core import rollout
from torchbeast.core.spec import EnvSpec


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
def model_is_sound(model: nn.Module, env_spec: EnvSpec) -> bool:
    """Whether every weight of ``model`` is finite, and so are its outputs on a probe step
    (``rollout.probe_step``, which no peer chose). An update too large, e.g. of an absurd
    learning rate, can break either where its loss and gradient were not: weights of 1e30
    are finite, and give infinite outputs on any frame but a blank one."""
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        return False
    device = next(model.parameters()).device
    inputs = {key: value.to(device) for key, value in rollout.probe_step(env_spec).items()}
    core_state = tuple(state.to(device) for state in model.initial_state(1))
    outputs, _ = model(inputs, core_state, act=False)
    return bool(
        torch.isfinite(outputs["policy_logits"]).all() and torch.isfinite(outputs["baseline"]).all()
    )


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

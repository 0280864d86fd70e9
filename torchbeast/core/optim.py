"""The learner's optimizer: RMSprop (TorchBeast's, optionally started as TensorFlow's) or
Adam, and its learning rate's linear decay to 0 at ``--total_steps``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torchbeast.core.settings import LearnerSettings


def lr_lambda(settings: LearnerSettings) -> Callable[[int], float]:
    """Learning-rate factor falling linearly from 1 to 0 at ``total_steps``.

    It counts T * B steps per update, also for batches with padded (masked) steps, so with
    partial rollouts the rate reaches 0 a little before ``Learner.step`` reaches
    ``total_steps``; partial rollouts are rare (disconnects), so the difference is small.
    """
    steps_per_update = settings.unroll_length * settings.batch_size
    total_steps = settings.total_steps

    def factor(update: int) -> float:
        return 1.0 - min(update * steps_per_update, total_steps) / total_steps

    return factor


def make_optimizer(settings: LearnerSettings, model: nn.Module) -> torch.optim.Optimizer:
    """RMSprop (TorchBeast's) or Adam, from ``--optimizer``."""
    if settings.optimizer == "adam":
        return torch.optim.Adam(
            model.parameters(), lr=settings.learning_rate, eps=settings.adam_epsilon
        )
    optimizer = torch.optim.RMSprop(
        model.parameters(),
        lr=settings.learning_rate,
        momentum=settings.momentum,
        eps=settings.epsilon,
        alpha=settings.alpha,
    )
    if settings.rmsprop_init > 0:
        _start_mean_square(optimizer, settings.rmsprop_init)
    return optimizer


def apply_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    settings: LearnerSettings,
    steps_done: int,
) -> None:
    """The run's learning rate and optimizer constants on an optimizer and schedule just
    loaded from a checkpoint, whose state dicts bring back the values they were saved with:
    a resumed run learns with the flags it was given, its rate where ``steps_done`` of
    ``--total_steps`` put it (also with another batch shape than the checkpoint's); the
    running averages stay the checkpoint's."""
    for group in optimizer.param_groups:
        if settings.optimizer == "adam":
            group["eps"] = settings.adam_epsilon
        else:
            group.update(eps=settings.epsilon, alpha=settings.alpha, momentum=settings.momentum)
            for param in group["params"]:
                state = optimizer.state[param]
                if settings.momentum > 0 and state and "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param)
    scheduler.base_lrs = [settings.learning_rate] * len(optimizer.param_groups)
    # The schedule counts updates of T x B steps: as many as this batch shape needs.
    scheduler.last_epoch = round(steps_done / (settings.unroll_length * settings.batch_size))
    factor = lr_lambda(settings)(scheduler.last_epoch)
    for group in optimizer.param_groups:
        group["lr"] = settings.learning_rate * factor
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _start_mean_square(optimizer: torch.optim.RMSprop, value: float) -> None:
    """Starts RMSprop's running mean square of each gradient at ``value``, as TensorFlow's
    RMSProp (IMPALA's optimizer) does, instead of PyTorch's 0.

    From 0, the first step divides each gradient by ``sqrt(1 - alpha) * |g|`` and so moves
    every weight by about 10 x LR whatever its gradient: on Pong that takes the policy from
    uniform to near one action at the second update. From 1 the first steps are
    ``LR * g``, and they grow to the full size as the mean square decays towards the
    gradients' (a few hundred updates with alpha 0.99): a warm-up.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            state["step"] = torch.zeros((), dtype=torch.get_default_dtype())
            state["square_avg"] = torch.full_like(param, value)
            if group["momentum"] > 0:
                state["momentum_buffer"] = torch.zeros_like(param)
            if group["centered"]:
                state["grad_avg"] = torch.zeros_like(param)

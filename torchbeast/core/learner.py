"""The one learner step used by every runtime: V-trace losses, RMSprop, clipping, LR decay.

A batch is a dict of time-major tensors ``[T+1, B, ...]`` laid out as actors write them:
index t holds the frame seen at step t with the reward and done that led to it, and the
action and behaviour logits the actor chose *at step t-1* (index 0 overlaps with the last
step of the previous rollout). So ``batch[1:]`` lines up with ``learner_outputs[:-1]``.

A batch may hold rollouts cut short (an actor lost its environment mid-rollout), padded
to T+1 with zeros and marked by ``batch["mask"]``: bool [T+1, B], True for real steps, a
prefix of each column (index 0 is always real). Padded steps add nothing to the losses,
the gradient, the step count or the episode statistics; the last real step bootstraps
from the learner's value of the last real frame unless its episode ended there. Without
"mask" every step is real.

With LASER replay (``num_online`` < B) the columns after the first ``num_online`` were
replayed. A replayed state whose behaviour policy is further than
``--trust_region_threshold`` (KL, in nats) from the current policy is treated like a
padded step: cut from the V-trace traces and left out of every loss term. The entropy
term, the step count and the episode statistics use online columns only.

The losses are computed by ``core.loss_terms``, the optimizer built by ``core.optim``, the
per-update diagnostics by ``core.diagnostics``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable

import torch
from torch import nn

from torchbeast.core.diagnostics import diagnostics, masked_mean
from torchbeast.core.loss_terms import LossTerms, loss_terms
from torchbeast.core.models import CoreState
from torchbeast.core.optim import apply_settings, lr_lambda, make_optimizer
from torchbeast.core.settings import LearnerSettings
from torchbeast.core.spec import extra_key
from torchbeast.core.value_scale import ValueScale


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN or infinite; the update was not applied."""


@dataclasses.dataclass
class DeviceUpdate:
    """An update queued on the device (``Learner.device_update``): its first pass, and its
    figures then its checks, stacked in one float64 tensor to be read with one wait."""

    first_pass: LossTerms
    stacked: torch.Tensor  # [figures + checks]
    names: list[str]  # of each value in ``stacked``
    check_names: list[str]  # the checks': each float input's, then each pass's loss and norm
    inputs: int  # how many checks are inputs'

    def read(self) -> dict[str, float]:
        """Every value by name (waits for the device once)."""
        return dict(zip(self.names, self.stacked.tolist(), strict=True))


class UndoBuffer:
    """The model's weights and the optimizer's state as they were before an update, kept in
    tensors allocated once, so that a multi-pass update that fails can be undone without
    deep-copying state dicts on every update."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer
        self.live: list[torch.Tensor] = []  # what is saved ...
        self.copies: list[torch.Tensor] = []  # ... and its copy
        self.had_state: set[nn.Parameter] = set()

    def save(self) -> None:
        # A parameter's empty state is none: the optimizer's state is a defaultdict, which
        # merely looking up a parameter fills (a CUDA graph's setup, ``optim``'s settings).
        self.had_state = {param for param, state in self.optimizer.state.items() if state}
        live = [*self.model.parameters(), *self.model.buffers()]
        for state in self.optimizer.state.values():
            live += [value for value in state.values() if torch.is_tensor(value)]
        # New tensors (a resumed optimizer's, a lazily made state): new copies.
        if len(live) != len(self.live) or any(
            a is not b for a, b in zip(live, self.live, strict=True)
        ):
            self.live, self.copies = live, [torch.empty_like(tensor) for tensor in live]
        with torch.no_grad():
            torch._foreach_copy_(self.copies, self.live)

    def restore(self, keep_new_state: bool = False) -> None:
        """Puts back what ``save`` saw. The optimizer state made since (lazily, by the first
        update) is deleted, or with ``keep_new_state`` kept and zeroed: to the optimizers
        here (RMSprop, Adam) zeros are a new state, and its tensors stay the same ones (a
        CUDA graph captured after this updates them in place)."""
        with torch.no_grad():
            torch._foreach_copy_(self.live, self.copies)
        for param in list(self.optimizer.state):  # state the failed update created
            if param in self.had_state:
                continue
            if not keep_new_state:
                del self.optimizer.state[param]
                continue
            with torch.no_grad():
                for value in self.optimizer.state[param].values():
                    if torch.is_tensor(value):
                        value.zero_()


def portable(optimizer_state: dict) -> dict:
    """An optimizer's state dict as any machine can load it: a CUDA graph's optimizer
    (``core.update_graph``) runs in its capturable mode, its steps on the device."""
    return {
        "state": {
            index: {
                name: value.cpu() if name == "step" and torch.is_tensor(value) else value
                for name, value in state.items()
            }
            for index, state in optimizer_state["state"].items()
        },
        "param_groups": [
            {**group, "capturable": False} if "capturable" in group else group
            for group in optimizer_state["param_groups"]
        ],
    }


class Learner:
    """Holds the model, optimizer and scheduler; ``learn`` applies one IMPALA update.

    Thread-safe: several learner threads may call ``learn``; updates are serialised.
    ``on_update(model)`` runs inside the lock after each update (e.g. to publish weights).
    ``episode_extras``: the env's extra per-episode figures (``EnvSpec.episode_extras``);
    each is logged as ``mean_episode_<name>`` over the episodes that ended.
    """

    def __init__(
        self,
        settings: LearnerSettings,
        model: nn.Module,
        on_update: Callable[[nn.Module], None] | None = None,
        episode_extras: tuple[str, ...] = (),
    ):
        self.settings = settings
        self.model = model
        self.episode_extras = episode_extras
        self.optimizer = make_optimizer(settings, model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(settings))
        self.value_scale = ValueScale(settings.normalize_values)
        self.undo = UndoBuffer(model, self.optimizer)
        # On a GPU each check of a pass waits for the device: there the update is checked
        # once, at its end, and undone if it failed. On the CPU waiting costs nothing, and
        # a failed pass is refused before its step (saving no state for one pass).
        self.deferred_checks = next(model.parameters()).device.type == "cuda"
        # The update as one CUDA graph (``--cuda_graphs``), set by ``core.update_graph``.
        self.update_graph = None
        self.on_update = on_update
        self.lock = threading.Lock()
        self.step = 0  # agent steps learned from
        self.updates = 0

    def learn(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState = (),
        num_online: int | None = None,
    ) -> dict[str, float]:
        """One update on ``batch`` ([T+1, B, ...] on the model's device); returns stats.

        ``num_online``: the first columns that came from actors just now; the rest were
        replayed (default: all online).
        """
        with self.lock:
            if self.deferred_checks:
                return self._learn_deferred(batch, initial_core_state, num_online)
            # Whether the inputs are finite: a non-finite input would give a non-finite
            # loss anyway; this says which input it was.
            self._check_inputs(
                {key: torch.isfinite(batch[key]).all() for key in self._float_inputs(batch)}
            )
            # A failed pass must not leave the earlier ones applied.
            saved = self.settings.epochs > 1
            if saved:
                self.undo.save()
            try:
                first_pass, checked = self._passes(batch, initial_core_state, num_online)
            except NonFiniteLossError:
                if saved:
                    self.undo.restore()
                raise
            figures = self._figures(first_pass, checked[1])
            self.scheduler.step()
            self._scale_values(first_pass)
            # One wait for the device for every figure: stacked where they are, read at once.
            stacked = torch.stack([figure.to(torch.float64) for figure in figures.values()])
            return self._record(dict(zip(figures, stacked.tolist(), strict=True)), first_pass)

    def _learn_deferred(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState,
        num_online: int | None,
    ) -> dict[str, float]:
        """``learn`` on a GPU: the whole update is queued on the device (as one CUDA graph
        where ``update_graph`` takes it), then read with one wait: its figures and its
        checks; an update that failed a check is undone."""
        if self.update_graph is not None and self.update_graph.fits(
            batch, initial_core_state, num_online
        ):
            update = self.update_graph.run(batch, initial_core_state)
        else:
            update = self.device_update(batch, initial_core_state, num_online)
        values = update.read()
        checks = [values.pop(name) for name in update.check_names]
        if not all(math.isfinite(value) and value != 0 for value in checks[: update.inputs]):
            self.undo.restore()
            self._check_inputs(dict(zip(update.check_names, checks, strict=False)))
        passes = checks[update.inputs :]
        if not all(math.isfinite(value) for value in passes):
            self.undo.restore()
            for total, norm in zip(passes[::2], passes[1::2], strict=True):
                self._check_pass(total, norm)
        self.scheduler.step()
        self._scale_values(update.first_pass)
        return self._record(values, update.first_pass)

    def device_update(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState,
        num_online: int | None,
    ) -> DeviceUpdate:
        """The update's work on the device, queued without waiting for it: the weights and
        the optimizer's state saved (to undo it), --epochs passes, the figures of the first
        and the checks (each input finite, each pass's loss and gradient norm)."""
        float_inputs = self._float_inputs(batch)
        checks = [torch.isfinite(batch[key]).all() for key in float_inputs]
        self.undo.save()
        first_pass, checked = self._passes(batch, initial_core_state, num_online)
        checks += checked
        figures = self._figures(first_pass, checked[1])
        names = [*figures, *float_inputs]
        names += [f"pass {i} {what}" for i in range(self.settings.epochs) for what in "ln"]
        stacked = torch.stack([value.to(torch.float64) for value in [*figures.values(), *checks]])
        checked = list(names[len(figures) :])
        return DeviceUpdate(first_pass, stacked, names, checked, len(float_inputs))

    def _passes(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState,
        num_online: int | None,
    ) -> tuple[LossTerms, list[torch.Tensor]]:
        """--epochs passes over the batch, V-trace correcting for the policy moving between
        them: the first pass's terms (the statistics describe it), and each pass's loss and
        gradient norm before clipping, in turn."""
        first_pass: LossTerms | None = None
        checked: list[torch.Tensor] = []
        for _ in range(self.settings.epochs):
            terms = self._losses(batch, initial_core_state, num_online)
            checked += [terms.total_loss.detach(), self._apply(terms.total_loss)]
            first_pass = first_pass or terms
        return first_pass, checked

    @staticmethod
    def _float_inputs(batch: dict[str, torch.Tensor]) -> list[str]:
        return [key for key in ("frame", "reward") if batch[key].is_floating_point()]

    def _scale_values(self, first_pass: LossTerms) -> None:
        """PopArt-style value normalisation (``--normalize_values``): sigma moves towards
        this batch's targets."""
        targets = first_pass.vtrace_returns.vs
        if first_pass.loss_mask is not None:
            targets = targets[first_pass.loss_mask.bool()]
        self.value_scale.update(targets, self.model.baseline)

    def _check_inputs(self, inputs_finite: dict[str, torch.Tensor | float]) -> None:
        for key, finite in inputs_finite.items():
            if not finite:
                raise NonFiniteLossError(
                    f"the batch holds a non-finite {key} at step {self.step}; the update "
                    "was not applied. Check the environment's observations and rewards"
                )

    def _check_pass(
        self, total_loss: torch.Tensor | float, grad_norm: torch.Tensor | float
    ) -> None:
        total, norm = float(total_loss), float(grad_norm)
        if not (math.isfinite(total) and math.isfinite(norm)):
            raise NonFiniteLossError(
                f"loss became {total} (gradient norm {norm}) at step {self.step}; "
                "the update was not applied. Lower --learning_rate or check the "
                "environment's rewards"
            )

    def nonfinite_columns(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState,
        num_online: int,
    ) -> list[int]:
        """The online columns of ``batch`` whose own loss is non-finite: which rollouts broke
        an update (one forward pass per column; for the rare failed update only)."""
        bad = []
        with self.lock, torch.no_grad():
            for column in range(num_online):
                single = {key: value[:, column : column + 1] for key, value in batch.items()}
                state = tuple(s[:, column : column + 1] for s in initial_core_state)
                if not all(
                    torch.isfinite(single[key]).all()
                    for key in ("frame", "reward")
                    if single[key].is_floating_point()
                ):
                    bad.append(column)
                elif not torch.isfinite(self._losses(single, state, 1).total_loss):
                    bad.append(column)
        return bad

    def _losses(
        self,
        batch: dict[str, torch.Tensor],
        initial_core_state: CoreState,
        num_online: int | None,
    ) -> LossTerms:
        """The V-trace losses of ``batch`` under the current weights, and what they used."""
        return loss_terms(
            self.settings, self.model, self.value_scale, batch, initial_core_state, num_online
        )

    def _apply(self, total_loss: torch.Tensor) -> torch.Tensor:
        """One optimizer step on ``total_loss``; returns the gradient norm before clipping
        (a 0-dim tensor). Unless checks are deferred, a non-finite loss or gradient is
        refused before the step."""
        self.optimizer.zero_grad()
        total_loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(
            self.model.parameters(), self.settings.grad_norm_clipping
        )
        if not self.deferred_checks:
            try:
                self._check_pass(total_loss.detach(), grad_norm)
            except NonFiniteLossError:
                self.optimizer.zero_grad()
                raise
        self.optimizer.step()
        return grad_norm.detach()

    def _figures(self, terms: LossTerms, grad_norm: torch.Tensor) -> dict[str, torch.Tensor]:
        """The update's figures, 0-dim tensors where they are (read all at once later)."""
        batch, online = terms.batch, terms.online
        device = grad_norm.device
        ended = batch["episode_end"] & online  # [T, B]
        figures = {
            "steps": online.sum(),
            "total_loss": terms.total_loss.detach(),
            "mean_episode_return": masked_mean(batch["episode_return"], ended),
            "pg_loss": terms.pg_loss.detach(),
            "baseline_loss": terms.baseline_loss.detach(),
            "entropy_loss": terms.entropy_loss.detach(),
            "episodes": ended.sum(),
            "grad_norm": grad_norm,
        }
        figures.update(
            diagnostics(
                terms.learner_outputs,
                batch,
                terms.vtrace_returns,
                terms.entropy_mask,
                terms.real,
            )
        )
        # Agent steps of the episodes that ended (whole games for Atari).
        figures["mean_episode_length"] = masked_mean(batch["episode_step"], ended)
        for name in self.episode_extras:
            key = extra_key(name)
            figures[f"mean_{key}"] = masked_mean(batch[key], ended)
        if self.settings.replays:
            figures["trusted_fraction"] = torch.as_tensor(terms.trusted_fraction, device=device)
        return figures

    def _record(self, values: dict[str, float], terms: LossTerms) -> dict[str, float]:
        """Counts the update, publishes the weights and returns the update's statistics
        from its figures' values."""
        self.step += int(values.pop("steps"))
        updates_before = self.updates
        self.updates += 1
        self.model.policy_version.fill_(self.updates)
        if self.on_update is not None:
            self.on_update(self.model)

        values["episodes"] = int(values["episodes"])
        stats = {"step": self.step}
        for key, value in values.items():
            if key == "grad_norm":  # logs.csv keeps the columns of earlier releases in order
                stats["learning_rate"] = self.scheduler.get_last_lr()[0]
            if key == "policy_version":
                key, value = "policy_lag", updates_before - value
            stats[key] = value
        if self.value_scale.enabled:
            stats["value_scale"] = self.value_scale.scale
        if self.settings.replays:
            stats["replayed_columns"] = terms.batch["reward"].shape[1] - terms.num_online
            stats["trusted_fraction"] = stats.pop("trusted_fraction")
        return stats

    def state_dict(self) -> dict:
        return {
            "model_state_dict": self.model.state_dict(),
            "optimizer_state_dict": portable(self.optimizer.state_dict()),
            "scheduler_state_dict": self.scheduler.state_dict(),
            "step": self.step,
            "updates": self.updates,
            "value_scale": self.value_scale.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model_state_dict"])
        self.optimizer.load_state_dict(state["optimizer_state_dict"])
        self.scheduler.load_state_dict(state["scheduler_state_dict"])
        self.step = int(state["step"])
        apply_settings(self.optimizer, self.scheduler, self.settings, self.step)
        self.updates = int(state.get("updates", 0))
        if "value_scale" in state:
            self.value_scale.load_state_dict(state["value_scale"], self.model.baseline)
        self.model.policy_version.fill_(self.updates)

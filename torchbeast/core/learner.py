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
"""

from __future__ import annotations

import argparse
import math
import threading
from collections.abc import Callable

import torch
from torch import nn

from torchbeast.core import losses, vtrace
from torchbeast.core.models import CoreState


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN or infinite; the update was not applied."""


def lr_lambda(flags: argparse.Namespace) -> Callable[[int], float]:
    """Learning-rate factor falling linearly from 1 to 0 at ``total_steps``.

    It counts T * B steps per update, also for batches with padded (masked) steps, so with
    partial rollouts the rate reaches 0 a little before ``Learner.step`` reaches
    ``total_steps``; partial rollouts are rare (disconnects), so the difference is small.
    """
    steps_per_update = flags.unroll_length * flags.batch_size

    def factor(update: int) -> float:
        return 1.0 - min(update * steps_per_update, flags.total_steps) / flags.total_steps

    return factor


def mean_or_nan(values: torch.Tensor) -> float:
    return float(values.mean()) if values.numel() else math.nan


class Learner:
    """Holds the model, optimizer and scheduler; ``learn`` applies one IMPALA update.

    Thread-safe: several learner threads may call ``learn``; updates are serialised.
    ``on_update(model)`` runs inside the lock after each update (e.g. to publish weights).
    ``true_reward_stats``: the env trains on a reward proxy; also log the episodes' true
    return and true move.
    """

    def __init__(
        self,
        flags: argparse.Namespace,
        model: nn.Module,
        on_update: Callable[[nn.Module], None] | None = None,
        true_reward_stats: bool = False,
    ):
        self.flags = flags
        self.model = model
        self.true_reward_stats = true_reward_stats
        self.optimizer = torch.optim.RMSprop(
            model.parameters(),
            lr=flags.learning_rate,
            momentum=flags.momentum,
            eps=flags.epsilon,
            alpha=flags.alpha,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(flags))
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
        flags = self.flags
        with self.lock:
            # A NaN input would make the model's action sampling fail before the loss check.
            for key in ("frame", "reward"):
                if batch[key].is_floating_point() and not torch.isfinite(batch[key]).all():
                    raise NonFiniteLossError(
                        f"the batch holds a non-finite {key} at step {self.step}; the update "
                        "was not applied. Check the environment's observations and rewards"
                    )
            learner_outputs, _ = self.model(batch, initial_core_state)

            # The last baseline bootstraps the value beyond the rollout.
            bootstrap_value = learner_outputs["baseline"][-1]  # [B]
            # Drop the overlap step of the batch and the bootstrap step of the outputs.
            batch = {key: tensor[1:] for key, tensor in batch.items()}
            learner_outputs = {key: tensor[:-1] for key, tensor in learner_outputs.items()}
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
                kl = losses.policy_kl(
                    learner_outputs["policy_logits"], batch["policy_logits"]
                )  # [T, B]
                trusted = kl <= flags.trust_region_threshold
                replayed = real & ~online
                trusted_fraction = float((trusted & replayed).sum()) / max(int(replayed.sum()), 1)
                loss_mask = online | (replayed & trusted)  # [T, B]
                entropy_mask = online

            rewards = losses.clip_rewards(batch["reward"], flags.reward_clipping)  # [T, B]
            discounts = (~batch["done"]).float() * flags.discounting  # [T, B]

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

            pg_loss = losses.policy_gradient_loss(
                learner_outputs["policy_logits"],
                batch["action"],
                vtrace_returns.pg_advantages,
                mask=loss_mask,
            )
            baseline_loss = flags.baseline_cost * losses.baseline_loss(
                vtrace_returns.vs - learner_outputs["baseline"], mask=loss_mask
            )
            entropy_loss = flags.entropy_cost * losses.entropy_loss(
                learner_outputs["policy_logits"], mask=entropy_mask
            )
            total_loss = pg_loss + baseline_loss + entropy_loss

            self.optimizer.zero_grad()
            total_loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), flags.grad_norm_clipping)
            total, norm = float(total_loss.detach()), float(grad_norm)
            if not (math.isfinite(total) and math.isfinite(norm)):
                self.optimizer.zero_grad()
                raise NonFiniteLossError(
                    f"loss became {total} (gradient norm {norm}) at step {self.step}; "
                    "the update was not applied. Lower --learning_rate or check the "
                    "environment's rewards"
                )
            self.optimizer.step()
            self.scheduler.step()

            self.step += int(online.sum())
            self.updates += 1
            if self.on_update is not None:
                self.on_update(self.model)

            ended = batch["episode_end"] & online  # [T, B]
            episode_returns = batch["episode_return"][ended]
            stats = {
                "step": self.step,
                "total_loss": total,
                "mean_episode_return": mean_or_nan(episode_returns),
                "pg_loss": float(pg_loss.detach()),
                "baseline_loss": float(baseline_loss.detach()),
                "entropy_loss": float(entropy_loss.detach()),
                "episodes": int(episode_returns.numel()),
                "learning_rate": self.scheduler.get_last_lr()[0],
                "grad_norm": norm,
            }
            if self.true_reward_stats:
                stats["mean_episode_true_return"] = mean_or_nan(batch["episode_true_return"][ended])
                stats["mean_episode_true_move"] = mean_or_nan(batch["episode_true_move"][ended])
            if flags.replay_size > 0:
                stats["replayed_columns"] = B - num_online
                stats["trusted_fraction"] = trusted_fraction
            return stats

    def state_dict(self) -> dict:
        return {
            "model_state_dict": self.model.state_dict(),
            "optimizer_state_dict": self.optimizer.state_dict(),
            "scheduler_state_dict": self.scheduler.state_dict(),
            "step": self.step,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model_state_dict"])
        self.optimizer.load_state_dict(state["optimizer_state_dict"])
        self.scheduler.load_state_dict(state["scheduler_state_dict"])
        self.step = int(state["step"])
        self.updates = int(state.get("updates", 0))

"""The progress line a training run prints every few seconds: steps, SPS, time left, the
mean return and entropy, and the env's episode extras; and the returns it averages."""

from __future__ import annotations

import collections
import logging
import math
import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torchbeast.config.settings import RunSettings
    from torchbeast.core.spec import EnvSpec

progress_log = logging.getLogger("torchbeast.progress")  # the lines --suppress_logs keeps

PROGRESS_INTERVAL_S = 5.0


class Progress:
    """The episodes that ended lately and the update's figures, and the progress line made
    of them. ``record`` and ``print`` may run in different threads."""

    def __init__(self, run: RunSettings, total_steps: int, env_spec: EnvSpec):
        self.run = run
        self.total_steps = total_steps
        self.env_spec = env_spec
        self.lock = threading.Lock()
        self.last_stats: dict = {}  # the last update's figures
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=100)
        self.returns_since_mean: list[float] = []  # with --episodes_for_avg
        self.recent_extras: collections.deque[tuple[float, ...]] = collections.deque(maxlen=100)
        self.sps = math.nan  # the last progress line's
        # The best mean of 100 episodes in a row the run reached, and the step it did.
        self.best_return = math.nan
        self.best_step: int | None = None

    def state_dict(self) -> dict:
        """The episode window the progress line averages, for the checkpoint."""
        with self.lock:
            return {
                "recent_returns": list(self.recent_returns),
                "recent_extras": [list(extras) for extras in self.recent_extras],
                "best_return": self.best_return,
                "best_step": self.best_step,
            }

    def load_state_dict(self, state: dict) -> None:
        """Goes on from a checkpoint's window (extras only where the env reports the same
        number of them)."""
        with self.lock:
            self.recent_returns.clear()
            self.recent_extras.clear()
            self.recent_returns.extend(float(value) for value in state.get("recent_returns", []))
            count = len(self.env_spec.episode_extras)
            self.recent_extras.extend(
                tuple(float(value) for value in extras)
                for extras in state.get("recent_extras", [])
                if len(extras) == count
            )
            self.best_return = float(state.get("best_return", math.nan))
            best_step = state.get("best_step")
            self.best_step = None if best_step is None else int(best_step)

    def record(
        self, stats: dict, returns: list[float], extras: list[tuple[float, ...]] = ()
    ) -> None:
        """An update's figures, and the returns and extras of the episodes it saw end."""
        with self.lock:
            self.last_stats = stats
            self.recent_returns.extend(returns)
            if self.run.episodes_for_avg:
                self.returns_since_mean.extend(returns)
            self.recent_extras.extend(extras)
            full = len(self.recent_returns) == self.recent_returns.maxlen
            if returns and full:
                mean = float(np.mean(self.recent_returns))
                if not mean <= self.best_return:  # also the first (NaN)
                    self.best_return, self.best_step = mean, stats.get("step")

    def figures(self) -> dict[str, float]:
        """The progress line's running figures, for logs.csv and TensorBoard beside the
        update's: the mean return of the last 100 episodes (NaN before the first ended),
        and the steps per second of the last progress line."""
        with self.lock:
            returns = self.recent_returns
            mean = float(np.mean(returns)) if returns else math.nan
            return {"mean_return_last_100": mean, "sps": self.sps}

    def best_text(self) -> str:
        """ "best 19.3 at step 1530000" (of 100 episodes in a row), or "" before 100 ended."""
        with self.lock:
            if self.best_step is None:
                return ""
            return f", best {self.best_return:.1f} at step {self.best_step}"

    def print(self, step: int, sps: float) -> None:
        with self.lock:
            self.sps = sps
            entropy = self.last_stats.get("policy_entropy")
            mean_return = "" if entropy is None else self.mean_return_text()
            extras_text = self.episode_extras_text()
        if entropy is None:
            progress_log.info("Steps %d: waiting for the first batch from the actors.", step)
            return
        progress_log.info(
            "%s.%s Entropy %.2f nats.%s",
            progress_text(step, self.total_steps, sps),
            mean_return,
            entropy,
            extras_text,
        )

    def window_text(self, number_format: str = ".6g") -> str:
        """The 100-episode window as a checkpoint's lines say it, exactly enough to compare
        (or in ``number_format``): "mean return 21.5 (last 100 episodes)"."""
        with self.lock:
            returns = list(self.recent_returns)
        mean = format(np.mean(returns), number_format) if returns else "n/a"
        return f"mean return {mean} (last {len(returns)} episodes)"

    def episode_extras_text(self) -> str:
        """The progress line's mean of each episode extra over the last 100 episodes, e.g.
        " True return 120.0, true move 9.5."; "" if the env has none."""
        if not self.recent_extras:
            return ""
        means = np.mean(self.recent_extras, axis=0)
        names = self.env_spec.episode_extras
        text = ", ".join(
            f"{name.replace('_', ' ')} {mean:.1f}" for name, mean in zip(names, means, strict=True)
        )
        return f" {text[0].upper()}{text[1:]}."

    def mean_return_text(self) -> str:
        """The progress line's mean-return part: the last 100 episodes; with
        --episodes_for_avg N, the episodes since the last mean printed, once N of them have
        ended (and nothing until then)."""
        if not self.run.episodes_for_avg:
            returns = self.recent_returns
            mean = f"{np.mean(returns):.1f}" if returns else "n/a"
            return f" Mean return (last {len(returns)} episodes) {mean}."
        returns = self.returns_since_mean
        if len(returns) < self.run.episodes_for_avg:
            return ""
        self.returns_since_mean = []
        return f" Mean return (last {len(returns)} episodes) {np.mean(returns):.1f}."


def progress_text(step: int, total_steps: int, sps: float) -> str:
    """ "Steps 1234560 of 5000000 (24.7%) @ 1150 SPS, 55 min left"."""
    text = f"Steps {step} of {total_steps} ({100 * step / total_steps:.1f}%) @ {sps:.0f} SPS"
    if sps > 0 and step < total_steps:
        text += f", {format_duration((total_steps - step) / sps)} left"
    return text


def format_duration(seconds: float) -> str:
    """A rough, readable duration: 45 s, 12 min, 3 h 05 min."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"

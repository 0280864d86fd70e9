"""Settings for tests of the algorithm, built directly as the edge would build them from
the default flags (``torchbeast.config``), without a parser."""

from __future__ import annotations

import dataclasses

from torchbeast.core.settings import LearnerSettings, ModelSettings

# The defaults of the flags of the same names.
LEARNER_DEFAULTS = dict(
    discounting=0.99,
    reward_clipping="abs_one",
    baseline_cost=0.5,
    entropy_cost=0.001,
    normalize_advantages=False,
    normalize_values=False,
    epochs=2,
    ppo_clip=0.2,
    replays=False,
    trust_region_threshold=0.5,
    optimizer="rmsprop",
    learning_rate=0.0007,
    alpha=0.99,
    momentum=0.0,
    epsilon=1e-5,
    rmsprop_init=1.0,
    adam_epsilon=1e-8,
    grad_norm_clipping=40.0,
    total_steps=5_000_000,
    batch_size=16,
    unroll_length=5,
)


def learner_settings(**changes) -> LearnerSettings:
    """The learner's settings with the flags' defaults, but those ``changes``."""
    return LearnerSettings(**{**LEARNER_DEFAULTS, **changes})


@dataclasses.dataclass(frozen=True)
class Setup:
    """What one test trains: the learner's settings and the model's."""

    learner: LearnerSettings
    model: ModelSettings = ModelSettings()


def setup(*, use_lstm: bool = False, **changes) -> Setup:
    """Learner settings with ``changes``, and a model with or without an LSTM."""
    return Setup(learner_settings(**changes), ModelSettings(use_lstm=use_lstm))

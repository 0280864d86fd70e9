"""The typed settings ``core/`` takes, built once from the flags at the edge
(``torchbeast.config.settings``): plain frozen dataclasses, free of torch, so that the
edge builds them without importing the learner."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model flags of the same names, built once at the edge (``torchbeast.config.settings``);
    None: the default for the observations."""

    torso: str | None = None
    use_resnet: bool = False
    hidden_size: int | None = None
    num_layers: int | None = None
    use_lstm: bool = False
    weight_init: str = "orthogonal"  # how a new model's weights start (create_model)


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """What the learner step needs, built once from the flags at the edge
    (``torchbeast.config.settings``); the fields are the flags of the same names."""

    # The loss.
    discounting: float
    reward_clipping: str  # "abs_one" or "none"
    baseline_cost: float
    entropy_cost: float
    normalize_advantages: bool
    normalize_values: bool  # the baseline learns targets / their running RMS (at least 1)
    epochs: int  # gradient steps on each batch
    ppo_clip: float  # > 0: PPO's clipped surrogate on pi/mu instead of the policy gradient
    # LASER: replayed states further than this KL from the current policy are left out.
    replays: bool  # the batches carry replayed columns (--replay_size > 0)
    trust_region_threshold: float
    # The optimizer, and its learning rate's linear decay to 0 at total_steps.
    optimizer: str  # "rmsprop" or "adam"
    learning_rate: float
    alpha: float
    momentum: float
    epsilon: float
    rmsprop_init: float  # RMSprop's mean square starts here (TensorFlow's: 1; PyTorch's: 0)
    adam_epsilon: float
    grad_norm_clipping: float
    total_steps: int
    batch_size: int
    unroll_length: int

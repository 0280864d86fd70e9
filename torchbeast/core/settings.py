"""The typed settings ``core/`` takes, built once from the flags at the edge
(``torchbeast.config.settings``): plain frozen dataclasses, free of torch, so that the
edge builds them without importing the learner.

Each setting is declared once, as a field made with :func:`flag`: its name is the flag's
(``--entropy_cost``), its default the flag's, its type and ``check`` the values the command
line takes, and its help the flag's help. ``config.declared`` builds every parser from
these fields, so a setting cannot drift apart from its flag. A field without ``flag`` is
not a flag of its own: it is derived or given when the settings are built, or it is a flag
declared in another class of settings (e.g. ``LearnerSettings.total_steps``'s).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

# The groups of ``--help``, in the order it shows them (``config.flags.make_parser``).
RUN = "Run"
TRAINING = "Training: actors, batches, checkpoints, logs"
MODEL = "Model"
LASER = "LASER shared experience replay (Schmitt, Hessel, Simonyan 2019)"
TEST_AND_EVAL = "Test and eval modes"
LOSS = "Loss"
OPTIMIZER = "Optimizer"

CHECKS = ("positive", "nonnegative", "unit", "finite", "seed")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a setting is given on the command line, as ``--<its field's name>``."""

    help: str
    metavar: str | None = None
    # Which values the parser takes besides the field's type: "positive" (> 0),
    # "nonnegative" (>= 0), "unit" (in [0, 1]), "finite"; a Literal type lists its choices.
    check: str | None = None
    group: str | None = None  # the --help group (default: the class's ``flags_group``)
    aliases: tuple[str, ...] = ()  # other spellings the original took, e.g. --num_threads

    def __post_init__(self):
        if self.check is not None and self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}: one of {', '.join(CHECKS)}")


def flag(
    default: Any,
    help: str,
    *,
    metavar: str | None = None,
    check: str | None = None,
    group: str | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field that is also a command-line flag (see the module's docstring)."""
    return dataclasses.field(
        default=default, metadata={"flag": Flag(help, metavar, check, group, aliases)}
    )


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The model's settings; None: the default for the observations."""

    flags_group: ClassVar[str] = MODEL

    use_lstm: bool = flag(False, "Use LSTM in agent model.")
    use_resnet: bool = flag(False, "(new) Use the IMPALA deep ResNet torso instead of AtariNet.")
    torso: Literal["atari", "resnet", "grid", "mlp"] | None = flag(
        None,
        "(new) The model's torso (default: AtariNet for frames, an MLP otherwise; "
        "--use_resnet is --torso resnet); grid: the MinAtar paper's conv over small "
        "[H, W, C] grids.",
    )
    hidden_size: int | None = flag(
        None,
        "(new) Width of the torso's fully connected layers "
        "(default: 512 AtariNet, 256 ResNet, 128 MinAtar grid, 64 MLP).",
        metavar="H",
        check="positive",
    )
    num_layers: int | None = flag(
        None,
        "(new) Fully connected layers in the torso (default: 1 for conv nets, 2 for MLP).",
        metavar="L",
        check="positive",
    )
    weight_init: Literal["orthogonal", "pytorch"] = flag(
        "orthogonal",
        "(new) How a new model's weights start: orthogonal (as PPO implementations) "
        "or PyTorch's default (the original's).",
    )
    precision: Literal["auto", "fp32", "bf16"] = flag(
        "auto",
        "(new) What the torso's convolutions and matrix products compute in; weights, "
        "core, heads and losses stay fp32. auto: bf16 for the conv torsos (AtariNet, "
        "ResNet) on a CPU with native bf16 (AVX512-BF16 or AMX), where the recipe runs "
        "1.4-1.6x faster on 2 cores; fp32 elsewhere, GPUs included. fp32: the computation "
        "of releases before bf16.",
    )


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """What the learner step needs: the batches' shape, the loss, the optimizer and its
    learning rate's linear decay to 0 at ``total_steps``."""

    flags_group: ClassVar[str] = LOSS

    # The run's length and the batches' shape.
    total_steps: int = flag(
        5_000_000,
        "Total environment steps to train for.",
        metavar="T",
        check="positive",
        group=TRAINING,
    )
    batch_size: int = flag(
        16,
        "Learner batch size (with 32 or more envs in all, and none of --batch_size, "
        "--learning_rate, --unroll_length given: 32, with its learning rate 0.00099).",
        metavar="B",
        check="positive",
        group=TRAINING,
    )
    unroll_length: int = flag(
        5, "The unroll length.", metavar="T", check="positive", group=TRAINING
    )
    # The loss.
    entropy_cost: float = flag(0.001, "Entropy cost/multiplier.", check="nonnegative")
    baseline_cost: float = flag(0.5, "Baseline cost/multiplier.", check="nonnegative")
    discounting: float = flag(0.99, "Discounting factor.", check="unit")
    truncation_as_termination: bool = flag(
        False,
        "(new) An episode that a time limit cuts short (Gymnasium's truncated) ends its "
        "return there, as one the game ended, as the original did. Without it, its last "
        "step's target goes on with the discounted value of the state it stopped in.",
    )
    normalize_advantages: bool = flag(
        False, "(new) Scale the policy gradient's advantages to mean 0, std 1 in each batch."
    )
    normalize_values: bool = flag(
        False,
        "(new) The baseline learns the V-trace targets divided by their running RMS "
        "when that exceeds 1 (PopArt's scale): large returns no longer swamp the torso.",
    )
    epochs: int = flag(
        2,
        "(new) Gradient steps on each batch (V-trace corrects for the policy moving); "
        "1 is the original's single step.",
        metavar="K",
        check="positive",
    )
    cuda_graphs: Literal["auto", "off"] = flag(
        "auto",
        "(new) auto: where the learner is on a GPU, each update runs as one CUDA graph "
        "(one launch instead of ~500: on an H200 2.3-3.0 ms per update instead of 15), "
        "checked once against an eager update, and eager if they differ; so do central "
        "inference's forward passes (one graph per size of pass); the log says which. "
        "off: eager updates and passes.",
    )
    ppo_clip: float = flag(
        0.2,
        "(new) > 0: PPO's clipped surrogate, with pi/mu clipped to [1 - EPS, 1 + EPS], "
        "in place of the policy-gradient loss; bounds how far --epochs passes move the policy. "
        "0 is the original's policy gradient.",
        metavar="EPS",
        check="nonnegative",
    )
    reward_clipping: Literal["abs_one", "none"] = flag("abs_one", "Reward clipping.")
    # LASER: whether the batches carry replayed columns (--replay_size > 0), and how far
    # from the current policy a replayed state may be and still count.
    replays: bool = False
    trust_region_threshold: float = flag(
        0.5,
        "(new) Replayed states whose KL(current policy || behaviour policy) exceeds "
        "this, in nats, are left out of V-trace and every loss term.",
        metavar="KL",
        check="positive",
        group=LASER,
    )
    # The optimizer.
    learning_rate: float = flag(
        0.0007,
        "Learning rate (with a batch grown with the envs: 0.0007 * sqrt(B / 16)).",
        metavar="LR",
        check="positive",
        group=OPTIMIZER,
    )
    optimizer: Literal["rmsprop", "adam"] = flag(
        "rmsprop", "(new) The learner's optimizer.", group=OPTIMIZER
    )
    alpha: float = flag(0.99, "RMSProp smoothing constant.", check="unit", group=OPTIMIZER)
    momentum: float = flag(0, "RMSProp momentum.", check="nonnegative", group=OPTIMIZER)
    epsilon: float = flag(1e-5, "RMSProp epsilon.", check="positive", group=OPTIMIZER)
    rmsprop_init: float = flag(
        1.0,
        "(new) The value RMSProp's mean square starts at: 1 as in TensorFlow's RMSProp, "
        "which IMPALA used (small first steps); 0 is PyTorch's, the original's (the first "
        "step moves every weight by about 10 x LR).",
        metavar="MS",
        check="nonnegative",
        group=OPTIMIZER,
    )
    adam_epsilon: float = flag(1e-8, "(new) Adam epsilon.", check="positive", group=OPTIMIZER)
    grad_norm_clipping: float = flag(
        40.0, "Global gradient norm clip.", check="positive", group=OPTIMIZER
    )

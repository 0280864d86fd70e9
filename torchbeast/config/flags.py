"""The flags of every runtime, and how a parse resolves and checks them.

Flag names and defaults follow the original TorchBeast ``monobeast.py`` so that its
command lines work as written; flags added since are marked "new" in their help.
``parsers`` builds each entry point's parser from :func:`make_parser` and the runtimes'
flag groups; :func:`parse_flags` refuses impossible values with one clear message.
"""

from __future__ import annotations

import argparse
import sys

from torchbeast.config.argparser import FlagParser
from torchbeast.config.layers import COMMAND_LINE, parse_in_layers, settings_table
from torchbeast.config.resolvers import (
    DEFAULT_ENVS_PER_ACTOR,
    Resolver,
    resolve_layout,
    resolve_num_buffers,
    resolve_run_folder,
    resolve_seed,
)
from torchbeast.config.values import (
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    unit_float,
)
from torchbeast.envs.family import families

DERIVED = "derived"  # a resolver filled it from other flags or the machine
MODES = ("train", "test", "test_render", "eval")

# Defaults that differ from the original MonoBeast's, which never learned Pong on a small
# machine (upstream issues #24, #39); the README lists them, and giving these flags
# restores the original's behaviour.
ORIGINAL_DEFAULTS = {
    "num_actors": 4,
    "envs_per_actor": 1,
    "total_steps": 100000,
    "batch_size": 8,
    "unroll_length": 80,
    "entropy_cost": 0.0006,
    "learning_rate": 0.00048,
    "epsilon": 0.01,
    "rmsprop_init": 0.0,  # PyTorch's RMSprop
    "epochs": 1,  # one gradient step per batch
    "ppo_clip": 0.0,  # the policy gradient
    "weight_init": "pytorch",
}


def make_parser(
    description: str = "torchbeast: IMPALA in PyTorch", *, shared_memory_buffers: bool = True
) -> argparse.ArgumentParser:
    """Returns the parser with every flag common to the runtimes.

    ``shared_memory_buffers``: whether the runtime keeps rollouts in ``--num_buffers``
    shared-memory buffers (MonoBeast), so that the flag is resolved and checked; other
    runtimes accept it, as the original command lines may give it, and ignore it.
    """
    parser = FlagParser(description=description)
    resolvers: list[Resolver] = [resolve_layout, resolve_run_folder, resolve_seed]
    parser.resolvers = resolvers  # run by parse_flags, in order; runtimes may add theirs
    if shared_memory_buffers:
        resolvers.append(resolve_num_buffers)
    add = parser.add_argument_group("Run").add_argument
    add("--env", type=str, default="PongNoFrameskip-v4", help="Gymnasium environment id.")
    add(
        "--mode",
        default="train",
        choices=MODES,
        help="Training or test mode; eval (new) plays greedy episodes and writes their "
        "statistics to eval.json.",
    )
    add("--xpid", default=None, help="Experiment id (default: torchbeast-%%Y%%m%%d-%%H%%M%%S).")
    add(
        "--seed",
        type=nonnegative_int,
        default=None,
        help="(new) Seed for envs and the model (default: drawn at random in training, and "
        "recorded in meta.json and the log, so that a run can be repeated).",
    )
    add(
        "--config",
        default=None,
        metavar="FILE",
        help="(new) A TOML file of flag values (the flags' names as keys), above the env's "
        "presets and beneath the command line.",
    )
    add(
        "--no_presets",
        action="store_true",
        help="(new) Leave out the env family's presets (settings measured to learn, e.g. "
        "MinAtar's grid torso): the defaults and the flags given only, as the original ran.",
    )
    add(
        "--print_settings",
        action="store_true",
        help="(new) Print every setting with where its value came from (default, preset, "
        "file, command line, derived) and exit.",
    )

    add = parser.add_argument_group("Training: actors, batches, checkpoints, logs").add_argument
    add("--disable_checkpoint", action="store_true", help="Disable saving checkpoint.")
    add(
        "--savedir",
        default="~/logs/torchbeast",
        help="Root dir where experiment data will be saved.",
    )
    add(
        "--num_actors",
        default=None,
        type=positive_int,
        metavar="N",
        help="Number of actors (default: half the machine's cores, at least 2 where it has "
        "2; the run's log says which layout it chose).",
    )
    add(
        "--envs_per_actor",
        default=None,
        type=positive_int,
        metavar="N",
        help="(new) Environments each actor steps, with one batched forward pass for all "
        f"(default: {DEFAULT_ENVS_PER_ACTOR}, so 2 x 8 on 2 cores and 8 x 8 on 16; "
        "1 if only --num_actors is given, as in the original).",
    )
    add(
        "--total_steps",
        default=5_000_000,
        type=positive_int,
        metavar="T",
        help="Total environment steps to train for.",
    )
    add("--batch_size", default=16, type=positive_int, metavar="B", help="Learner batch size.")
    add("--unroll_length", default=5, type=positive_int, metavar="T", help="The unroll length.")
    add(
        "--num_buffers",
        default=None,
        type=positive_int,
        metavar="N",
        help="Number of shared-memory buffers "
        "(default: max(2*num_actors*envs_per_actor, batch_size + num_actors*(envs_per_actor-1))).",
    )
    add(
        "--num_learner_threads",
        "--num_threads",
        default=2,
        type=positive_int,
        metavar="N",
        help="Number learner threads.",
    )
    add("--disable_cuda", action="store_true", help="Disable CUDA.")
    add(
        "--checkpoint_interval",
        default=600.0,
        type=positive_float,
        metavar="S",
        help="(new) Seconds between checkpoints while training.",
    )
    add(
        "--episodes_for_avg",
        default=0,
        type=nonnegative_int,
        metavar="N",
        help="(new) Print the mean return once N episodes have ended since the last one "
        "printed (0: the last 100 episodes on every progress line).",
    )
    add(
        "--suppress_logs",
        action="store_true",
        help="(new) Only progress lines (steps, SPS, time left, mean return, entropy) and "
        "warnings on the console; out.log keeps everything.",
    )

    add = parser.add_argument_group("Model").add_argument
    add("--use_lstm", action="store_true", help="Use LSTM in agent model.")
    add(
        "--use_resnet",
        action="store_true",
        help="(new) Use the IMPALA deep ResNet torso instead of AtariNet.",
    )
    add(
        "--torso",
        default=None,
        choices=["atari", "resnet", "grid", "mlp"],
        help="(new) The model's torso (default: AtariNet for frames, an MLP otherwise; "
        "--use_resnet is --torso resnet); grid: the MinAtar paper's conv over small "
        "[H, W, C] grids.",
    )
    add(
        "--hidden_size",
        default=None,
        type=positive_int,
        metavar="H",
        help="(new) Width of the torso's fully connected layers "
        "(default: 512 AtariNet, 256 ResNet, 128 MinAtar grid, 64 MLP).",
    )
    add(
        "--num_layers",
        default=None,
        type=positive_int,
        metavar="L",
        help="(new) Fully connected layers in the torso (default: 1 for conv nets, 2 for MLP).",
    )

    add(
        "--weight_init",
        default="orthogonal",
        choices=["orthogonal", "pytorch"],
        help="(new) How a new model's weights start: orthogonal (as PPO implementations) "
        "or PyTorch's default (the original's).",
    )

    add = parser.add_argument_group(
        "LASER shared experience replay (Schmitt, Hessel, Simonyan 2019)"
    ).add_argument
    add(
        "--replay_size",
        default=0,
        type=nonnegative_int,
        metavar="N",
        help="(new) Replay capacity in transitions, shared by all actors; 0 turns replay off.",
    )
    add(
        "--replay_ratio",
        default=1,
        type=positive_int,
        metavar="K",
        help="(new) Replayed rollouts per online rollout in each learner batch: "
        "B online + B*K replayed (7 is the paper's 87.5%% replay).",
    )
    add(
        "--learn_start",
        default=10000,
        type=nonnegative_int,
        metavar="N",
        help="(new) Transitions in the replay before it is sampled (at most --replay_size).",
    )
    add(
        "--trust_region_threshold",
        default=0.5,
        type=positive_float,
        metavar="KL",
        help="(new) Replayed states whose KL(current policy || behaviour policy) exceeds "
        "this, in nats, are left out of V-trace and every loss term.",
    )

    add = parser.add_argument_group("Test and eval modes").add_argument
    add(
        "--num_episodes",
        default=10,
        type=positive_int,
        metavar="N",
        help="(new) Episodes to play in test and eval modes.",
    )

    add_env_side_flags(parser)

    add = parser.add_argument_group("Loss").add_argument
    add("--entropy_cost", default=0.001, type=nonnegative_float, help="Entropy cost/multiplier.")
    add("--baseline_cost", default=0.5, type=nonnegative_float, help="Baseline cost/multiplier.")
    add("--discounting", default=0.99, type=unit_float, help="Discounting factor.")
    add(
        "--normalize_advantages",
        action="store_true",
        help="(new) Scale the policy gradient's advantages to mean 0, std 1 in each batch.",
    )
    add(
        "--normalize_values",
        action="store_true",
        help="(new) The baseline learns the V-trace targets divided by their running RMS "
        "when that exceeds 1 (PopArt's scale): large returns no longer swamp the torso.",
    )
    add(
        "--epochs",
        default=2,
        type=positive_int,
        metavar="K",
        help="(new) Gradient steps on each batch (V-trace corrects for the policy moving); "
        "1 is the original's single step.",
    )
    add(
        "--ppo_clip",
        default=0.2,
        type=nonnegative_float,
        metavar="EPS",
        help="(new) > 0: PPO's clipped surrogate, with pi/mu clipped to [1 - EPS, 1 + EPS], "
        "in place of the policy-gradient loss; bounds how far --epochs passes move the policy. "
        "0 is the original's policy gradient.",
    )
    add(
        "--reward_clipping",
        default="abs_one",
        choices=["abs_one", "none"],
        help="Reward clipping.",
    )

    add = parser.add_argument_group("Optimizer").add_argument
    add("--learning_rate", default=0.0007, type=positive_float, metavar="LR", help="Learning rate.")
    add(
        "--optimizer",
        default="rmsprop",
        choices=["rmsprop", "adam"],
        help="(new) The learner's optimizer.",
    )
    add("--alpha", default=0.99, type=unit_float, help="RMSProp smoothing constant.")
    add("--momentum", default=0, type=nonnegative_float, help="RMSProp momentum.")
    add("--epsilon", default=1e-5, type=positive_float, help="RMSProp epsilon.")
    add(
        "--rmsprop_init",
        default=1.0,
        type=nonnegative_float,
        metavar="MS",
        help="(new) The value RMSProp's mean square starts at: 1 as in TensorFlow's RMSProp, "
        "which IMPALA used (small first steps); 0 is PyTorch's, the original's (the first "
        "step moves every weight by about 10 x LR).",
    )
    add("--adam_epsilon", default=1e-8, type=positive_float, help="(new) Adam epsilon.")
    add(
        "--grad_norm_clipping",
        default=40.0,
        type=positive_float,
        help="Global gradient norm clip.",
    )
    return parser


def add_env_side_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every environment family (``envs.family``), each family's in its own
    group; PolyBeast's env side takes them too."""
    for family in families():
        family.add_flags(parser.add_argument_group(f"{family.name} environments"))


def parse_flags(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """Parses and validates flags (``parse_flags_and_sources``, without the sources)."""
    return parse_flags_and_sources(argv, parser)[0]


def parse_flags_and_sources(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Parses and validates flags over the defaults, the env's presets and a ``--config``
    file (``layers``), and fills the defaults derived from other flags (the parser's
    ``resolvers``, in order); impossible combinations exit with one clear message. The
    result is final: nothing changes it afterwards. Also returns where each value came
    from (``layers``; "derived" where a resolver filled it)."""
    parser = parser or make_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    flags, sources = parse_in_layers(parser, argv)
    for resolve in parser.resolvers:
        resolved = resolve(flags, parser)
        sources.update(
            (name, DERIVED)
            for name, value in resolved.items()
            if sources.get(name) != COMMAND_LINE or value != getattr(flags, name, None)
        )
        flags = argparse.Namespace(**{**vars(flags), **resolved})
    if getattr(flags, "print_settings", False):
        print(settings_table(flags, sources))
        parser.exit()
    return flags, sources

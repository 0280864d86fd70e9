"""The flags of every runtime, and how a parse resolves and checks them.

Each flag is declared once, as a field of the settings it sets (``core.settings.flag``;
``config.declared`` turns the fields into arguments). Flag names and defaults follow the
original TorchBeast ``monobeast.py`` so that its command lines work as written; flags
added since are marked "new" in their help. ``parsers`` builds each entry point's parser
from :func:`make_parser` and the runtimes' settings; :func:`parse_flags` refuses
impossible values with one clear message.
"""

from __future__ import annotations

import argparse
import sys

from torchbeast.config.argparser import FlagParser
from torchbeast.config.declared import add_declared_flags, group_of
from torchbeast.config.layers import parse_in_layers, settings_table
from torchbeast.config.resolvers import (
    Resolver,
    drop_num_buffers,
    resolve_layout,
    resolve_learner_batch,
    resolve_num_buffers,
    resolve_run_folder,
    resolve_seed,
)
from torchbeast.config.settings import ActorSettings, ReplaySettings, RunSettings
from torchbeast.core.settings import (
    LASER,
    MODEL,
    RUN,
    TEST_AND_EVAL,
    TRAINING,
    LearnerSettings,
    ModelSettings,
)
from torchbeast.envs.family import families, is_plugin, plugin_text
from torchbeast.envs.settings import EnvSettings

DERIVED = "derived"  # a resolver filled it from other flags or the machine

# Defaults that differ from the original MonoBeast's, which never learned Pong on a small
# machine (upstream issues #24, #39); the manual lists them (docs/differences.md), and
# giving these flags restores the original's behaviour.
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
    """Returns the parser with every flag common to the runtimes: those the settings declare
    (``core.settings.flag``), every env family's, and those that steer the parse itself.

    ``shared_memory_buffers``: whether the runtime keeps rollouts in ``--num_buffers``
    shared-memory buffers (MonoBeast), so that the flag is resolved and checked; other
    runtimes accept it, as the original command lines may give it, and drop it.
    """
    parser = FlagParser(description=description)
    resolvers: list[Resolver] = [
        resolve_layout,
        resolve_learner_batch,
        resolve_run_folder,
        resolve_seed,
    ]
    parser.resolvers = resolvers  # run by parse_flags, in order; runtimes may add theirs
    resolvers.append(resolve_num_buffers if shared_memory_buffers else drop_num_buffers)
    for title in (RUN, TRAINING, MODEL, LASER, TEST_AND_EVAL):
        parser.add_argument_group(title)
    add_declared_flags(parser, EnvSettings)
    add_declared_flags(parser, RunSettings)
    add = group_of(parser, RUN).add_argument
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
    for settings_type in (ActorSettings, ModelSettings, ReplaySettings):
        add_declared_flags(parser, settings_type)
    add_env_side_flags(parser)
    add_declared_flags(parser, LearnerSettings)
    return parser


def add_env_side_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every environment family (``envs.family``), each family's in its own
    group; PolyBeast's env side takes them too."""
    for family in families():
        if family.options is not None:
            plugin = plugin_text(family) if is_plugin(family) else None
            group = f"{family.name} environments"
            add_declared_flags(parser, family.options, group=group, plugin=plugin)


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
        resolved = resolve(flags, parser, sources)
        sources.update(  # a value a resolver handed back as it was keeps its source
            (name, DERIVED)
            for name, value in resolved.items()
            if value != getattr(flags, name, None)
        )
        flags = argparse.Namespace(**{**vars(flags), **resolved})
    if getattr(flags, "print_settings", False):
        print(settings_table(flags, sources))
        parser.exit()
    return flags, sources

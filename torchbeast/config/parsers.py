"""Every entry point's parser, built from the flag groups: ``flags``' (those of every
runtime) and each runtime's own, which its registry entry names (``runtime.registry``);
and the benchmark's, which takes every runtime's."""

from __future__ import annotations

import argparse

from torchbeast.config.argparser import FlagParser
from torchbeast.config.declared import add_declared_flags
from torchbeast.config.flags import make_parser
from torchbeast.config.poly import PolyEnvSettings
from torchbeast.config.poly_flags import add_env_flags
from torchbeast.config.resolvers import drop_num_buffers, resolve_num_buffers
from torchbeast.config.values import nonnegative_int, positive_int
from torchbeast.runtime.registry import RUNTIMES, function


def add_runtime_flags(parser: argparse.ArgumentParser, runtime: str) -> None:
    """The flags ``runtime``'s own settings declare, and what its registry entry derives
    from them (resolvers, defaults)."""
    entry = RUNTIMES[runtime]
    if entry.settings is not None:
        add_declared_flags(parser, function(entry.settings))
    if entry.adjust_parser is not None:
        function(entry.adjust_parser)(parser)


def make_runtime_parser(runtime: str, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of a runtime's entry point: every runtime's flags, then its own."""
    entry = RUNTIMES[runtime]
    parser = make_parser(
        description or entry.description, shared_memory_buffers=entry.shared_memory_buffers
    )
    add_runtime_flags(parser, runtime)
    return parser


def make_mono_parser() -> argparse.ArgumentParser:
    return make_runtime_parser("mono")


def make_learner_parser(description: str | None = None) -> argparse.ArgumentParser:
    """``polybeast_learner``'s parser. Its env streams are someone else's: each brings the
    envs of polybeast_env's --envs_per_stream, so --envs_per_actor (which sizes the
    learner's batch with the envs) defaults to that flag's default, not to MonoBeast's 8."""
    parser = make_runtime_parser("poly", description)
    envs_per_stream = PolyEnvSettings.__dataclass_fields__["envs_per_stream"].default
    parser.set_defaults(envs_per_actor=envs_per_stream)
    helps = {
        "env": "Gymnasium environment id (default: the checkpoint's when resuming, else the "
        "one the first env stream says; a stream of another is refused).",
        "envs_per_actor": "(new) Environments each env stream steps: polybeast_env's "
        f"--envs_per_stream (default: {envs_per_stream}, as there); with --num_actors it "
        "sizes the learner's batch.",
    }
    for action in parser._actions:
        action.help = helps.get(action.dest, action.help)
    return parser


def make_poly_parser() -> argparse.ArgumentParser:
    parser = make_runtime_parser("poly", "PolyBeast: env servers and learner in one command.")
    parser.set_defaults(env="PongNoFrameskip-v4")
    return parser


def make_ray_parser() -> argparse.ArgumentParser:
    return make_runtime_parser("ray")


def make_env_parser() -> argparse.ArgumentParser:
    """``polybeast_env``'s parser."""
    parser = FlagParser(description="PolyBeast env servers (or, with --connect, env clients).")
    add_env_flags(parser)
    return parser


def make_bench_parser(runtimes: list[str]) -> argparse.ArgumentParser:
    """The benchmark's: every runtime's flags, ``--runtime`` one of ``runtimes``, and the
    measurement window."""
    parser = make_parser(
        "Benchmark a runtime: steady-state SPS and per-stage CPU costs.",
        shared_memory_buffers=False,
    )
    owners: dict[str, str] = {}  # a runtime's own flag -> the runtime
    for runtime in runtimes:
        before = {action.dest for action in parser._actions}
        add_runtime_flags(parser, runtime)
        owners.update(
            (action.dest, runtime) for action in parser._actions if action.dest not in before
        )
    # The data path's figure, comparable with the original MonoBeast's: its batch shape and
    # one gradient step per batch (the training defaults take two).
    parser.set_defaults(
        env="PongNoFrameskip-v4",
        batch_size=4,
        unroll_length=80,
        epochs=1,
        ppo_clip=0.0,
        num_actors=2,
        envs_per_actor=8,
        total_steps=10**12,
    )
    parser.add_argument("--runtime", default="mono", choices=runtimes)
    parser.add_argument("--warmup_steps", type=nonnegative_int, default=20_000)
    parser.add_argument("--bench_steps", type=positive_int, default=60_000)
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="Also write the figures to FILE as JSON."
    )
    parser.add_argument(
        "--sampling_only",
        action="store_true",
        help="Measure the actors (and central inference) alone: each batch is dropped as "
        "soon as it fills, with no update, so the SPS is the most sampling gives the layout.",
    )

    def refuse_other_runtimes_flags(flags: argparse.Namespace, parser, sources) -> dict:
        """Another runtime's own flag, given, is refused (before any is derived)."""
        for dest, owner in owners.items():
            if owner != flags.runtime and getattr(flags, dest) != parser.get_default(dest):
                title = RUNTIMES[owner].title
                parser.error(
                    f"--{dest} is {title}'s, not --runtime {flags.runtime}'s: leave it out, "
                    f"or use --runtime {owner}"
                )
        return {}

    def resolve_num_buffers_where_kept(flags: argparse.Namespace, parser, sources) -> dict:
        """--num_buffers, where the runtime keeps shared-memory buffers; dropped elsewhere."""
        if RUNTIMES[flags.runtime].shared_memory_buffers:
            return resolve_num_buffers(flags, parser, sources)
        return drop_num_buffers(flags, parser, sources)

    def refuse_other_modes(flags: argparse.Namespace, parser, sources) -> dict:
        """--mode test or eval: it trained and measured as ever, exit 0."""
        if flags.mode != "train":  # before the run folder's resolver asks for a run to play
            parser.error(f"--mode {flags.mode}: the benchmark measures training; leave out --mode")
        return {}

    parser.resolvers[:0] = [refuse_other_modes, refuse_other_runtimes_flags]
    parser.resolvers.append(resolve_num_buffers_where_kept)
    return parser

"""What a parse derives from the flags given (defaults that depend on other flags), and
the combinations it refuses; ``parse_flags`` runs a parser's resolvers in order."""

from __future__ import annotations

import argparse
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping

from torchbeast.config.layers import DEFAULT
from torchbeast.core.filewriter import LATEST

# Where each flag's value came from ("default", "command line", a preset, ...: ``layers``).
Sources = Mapping[str, str]
# Fills defaults derived from other flags, or refuses a combination: the flags it resolves.
Resolver = Callable[[argparse.Namespace, argparse.ArgumentParser, Sources], dict]

# The default layout: actors of this many environments each (one batched forward pass over
# them per step), as many actors as half the cores (at least 2 where there are 2), the
# other half left to the learner process: the fastest layout measured on 2 cores (2 x 8).
# Where the learner is on a GPU it needs little CPU (its update is one CUDA graph): one
# actor per core (16 cores and an H200, the recipe: 16 x 8 at 10,863 SPS, 8 x 8 at 6,107).
DEFAULT_ENVS_PER_ACTOR = 8


def min_num_buffers(flags: argparse.Namespace) -> int:
    """Fewest buffers with which actors and learner can never wait on each other forever."""
    return flags.batch_size + flags.num_actors * (flags.envs_per_actor - 1)


def default_layout(cores: int, gpu: bool = False) -> tuple[int, int]:
    """(actors, envs each) on a machine of ``cores`` cores: half the cores (2 on 2 cores,
    1 on 1), 8 envs each, the other half left to the learner process; with the learner on
    a ``gpu``, one actor per core."""
    actors = cores if gpu else max(min(2, cores), cores // 2)
    return actors, DEFAULT_ENVS_PER_ACTOR


def learner_on_gpu(flags: argparse.Namespace) -> bool:
    """Whether the learner will run on a GPU (as the trainer decides it). Asks torch only
    then: the flags and settings import no torch (``--help``, the settings' tests)."""
    if flags.disable_cuda:
        return False
    import torch  # noqa: PLC0415 - see above

    return torch.cuda.is_available()


def resolve_layout(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """--num_actors and --envs_per_actor: the machine's layout when neither is given, 8 envs
    per actor when only --envs_per_actor is not and one per actor (the original's) when
    only --num_actors is; ``layout_source`` says which, for the run's log."""
    num_actors, envs_per_actor = flags.num_actors, flags.envs_per_actor
    cores = len(os.sched_getaffinity(0))
    if num_actors is None:
        gpu = learner_on_gpu(flags)
        num_actors, machine_envs = default_layout(cores, gpu)
        source = f"chosen for {cores} cores" + (" and a GPU" if gpu else "")
        if envs_per_actor is None:
            envs_per_actor = machine_envs
        elif sources.get("envs_per_actor", DEFAULT) != DEFAULT:
            source = f"--envs_per_actor, actors {source}"
    else:
        given = sources.get("envs_per_actor", DEFAULT) != DEFAULT
        source = "--num_actors" + (" and --envs_per_actor" if given else "")
    return dict(num_actors=num_actors, envs_per_actor=envs_per_actor or 1, layout_source=source)


# The learner's batch grows with the environments, so that a rollout's policy is about as
# many updates old when it is learnt from as in the runs that validated the recipe (2 cores:
# 16 envs, B=16, policy lag ~4; the lag goes as envs / B). B is 16 per 16 envs, up to 32.
# RMSprop's steps have the size its rate sets, whatever the batch, so a batch k times larger
# takes k times fewer steps of the same size: the rate grows with sqrt(k). Why 32 and not
# more (docs/benchmarks.md): on Pong with 128 envs, B=32 reached +18 at 1.47M and 1.70M
# steps, inside the defaults' 1.17-1.86M, where B=64 took 1.54M, >2.5M and 3.75M;
# and with the update as one CUDA graph, B=32 runs as fast as B=64 on an H200 (11,070 and
# 10,863 SPS at 16 x 8).
RECIPE = dict(batch_size=16, unroll_length=5, learning_rate=0.0007)
MAX_GROWN_BATCH = 32


def grown_batch(envs: int) -> tuple[int, float]:
    """(batch size, learning rate) of the recipe for ``envs`` environments in all."""
    base = RECIPE["batch_size"]
    batch = min(MAX_GROWN_BATCH, max(base, base * (envs // base)))
    return batch, float(f"{RECIPE['learning_rate'] * (batch / base) ** 0.5:.3g}")


def resolve_learner_batch(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """--batch_size and --learning_rate grown with the environments (``grown_batch``) where
    the recipe's are left as they are: none of them, nor --unroll_length, given anywhere
    (command line, --config file, the env's presets)."""
    if any(
        sources.get(name) != DEFAULT or getattr(flags, name) != value
        for name, value in RECIPE.items()
    ):
        return {}
    batch_size, learning_rate = grown_batch(flags.num_actors * flags.envs_per_actor)
    if batch_size == RECIPE["batch_size"]:
        return {}
    return dict(batch_size=batch_size, learning_rate=learning_rate)


def resolve_run_folder(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """--savedir with ~ and $VARS expanded; --xpid, a plain folder name, from the time if
    not given, and ``latest`` the name of the run that link points at."""
    if flags.xpid == "":  # e.g. --xpid "$NAME" with NAME unset: not "a new name"
        parser.error(
            "--xpid is empty: give the run a name, or leave --xpid out for one from the time"
        )
    plays_a_run = flags.mode != "train" and not (flags.random_policy and flags.env)
    if not flags.xpid and plays_a_run:  # not a new run's name, which no run has
        parser.error(
            f"--mode {flags.mode} plays a trained run: name it with --xpid (--xpid latest: "
            "the last run trained in --savedir)"
        )
    xpid = flags.xpid or "torchbeast-" + time.strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._=+-]+", xpid) or xpid in (".", ".."):
        parser.error(
            f"--xpid {xpid!r} is not a plain folder name: use letters, digits and . _ - = + only"
        )
    if unset := unset_variable(flags.savedir):
        parser.error(
            f"--savedir {flags.savedir} names {unset}, which is not set: set it, or give the path"
        )
    savedir = expand_savedir(flags.savedir)
    if xpid == LATEST:  # the run the link points at, in every mode: training resumes it
        link = os.path.join(savedir, LATEST)
        if os.path.islink(link):
            xpid = os.path.basename(os.readlink(link))
        elif flags.mode == "train":
            parser.error(
                f"--xpid latest names the last run in {savedir}, and there is none: give "
                "the run a name, or leave --xpid out"
            )
    resolved = dict(savedir=savedir, xpid=xpid)
    if flags.video:  # a path as --savedir's: from a config file, "~/play.gif" is not expanded
        if unset := unset_variable(flags.video):
            parser.error(f"--video {flags.video} names {unset}, which is not set")
        resolved["video"] = expand_savedir(flags.video)
    return resolved


def expand_savedir(savedir: str) -> str:
    """--savedir as runs and studies use it: ~ and $VARS expanded."""
    return os.path.expanduser(os.path.expandvars(savedir))


def unset_variable(path: str) -> str | None:
    """The first $VAR (or ${VAR}) in ``path`` that is not set (expanding it would leave it
    as it is: a folder named "$SCRATCH" in the working directory), or None."""
    for match in re.finditer(r"\$(\w+|\{([^}]*)\})", path):
        if (match.group(2) or match.group(1)) not in os.environ:
            return match.group(0)
    return None


def resolve_seed(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """A training run without --seed draws one, so that meta.json and the log say how to
    repeat it (test and eval modes keep None: their games differ each time, as before)."""
    if flags.seed is None and flags.mode == "train":
        return dict(seed=secrets.randbelow(1_000_000))
    return {}


def resolve_num_buffers(
    flags: argparse.Namespace, parser: argparse.ArgumentParser, sources: Sources
) -> dict:
    """MonoBeast's --num_buffers: its default, or a refusal of too few."""
    needed = min_num_buffers(flags)
    if flags.num_buffers is None:
        return dict(num_buffers=max(2 * flags.num_actors * flags.envs_per_actor, needed))
    if flags.num_buffers < needed:
        parser.error(
            f"--num_buffers {flags.num_buffers} is too few for --batch_size {flags.batch_size} "
            f"with {flags.num_actors} actors x {flags.envs_per_actor} envs: "
            f"use --num_buffers {needed} or more"
        )
    return {}


def drop_num_buffers(flags: argparse.Namespace, parser: argparse.ArgumentParser, sources) -> dict:
    """--num_buffers where the runtime keeps no shared-memory buffers: taken, as the
    original's command lines give it, and dropped (None, "derived"), so that nothing sizes
    the run by it; the run says it did nothing (``Trainer.log_num_buffers_unused``)."""
    return {} if flags.num_buffers is None else dict(num_buffers=None)

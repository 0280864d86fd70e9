"""From the parsed flags to the typed settings that every part of a run takes, once, at the
edge: ``core/`` receives these objects, never an argparse namespace, and nothing edits
them afterwards. What only the checkpoint or the first env stream can tell (a resumed
PolyBeast run's env id, a test run's model) travels in the objects that need it."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchbeast.config.env import env_settings, from_flags
from torchbeast.config.poly import PolyEnvSettings
from torchbeast.core.settings import LearnerSettings, ModelSettings
from torchbeast.envs.settings import EnvSettings


@dataclass(frozen=True)
class RunSettings:
    """The run as a whole: where it writes, how long it trains, what it logs (the flags of
    the same names)."""

    mode: str
    savedir: str
    xpid: str
    total_steps: int
    checkpoint_interval: float  # seconds
    disable_checkpoint: bool
    num_learner_threads: int
    disable_cuda: bool
    num_episodes: int  # test and eval modes
    episodes_for_avg: int
    suppress_logs: bool
    # Every flag as parsed and resolved, as meta.json and checkpoints record them.
    flags: tuple[tuple[str, object], ...] = ()
    # Where each flag's value came from (config.layers), as meta.json records it.
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def run_dir(self) -> str:
        return os.path.join(self.savedir, self.xpid)

    def presets_applied(self) -> dict[str, dict[str, object]]:
        """The preset values the run uses, by preset ("preset MinAtar": {flag: value})."""
        applied: dict[str, dict[str, object]] = {}
        flags = dict(self.flags)
        for name, source in self.sources:
            if source.startswith("preset "):
                applied.setdefault(source, {})[name] = flags.get(name)
        return applied

    def recorded_flags(self, env_id: str) -> dict[str, object]:
        """The flags to record, with the env id the run resolved (e.g. from a checkpoint)."""
        return {**dict(self.flags), "env": env_id}


@dataclass(frozen=True)
class ReplaySettings:
    """LASER's shared experience replay (``--replay_size`` 0: off)."""

    replay_size: int
    replay_ratio: int
    learn_start: int
    # (--trust_region_threshold is the learner's: LearnerSettings.)


@dataclass(frozen=True)
class ActorSettings:
    """How many actors (PolyBeast: env streams) step how many envs each."""

    num_actors: int
    envs_per_actor: int
    layout_source: str = ""  # who chose the layout: the flags, or the machine (for the log)


@dataclass(frozen=True)
class Settings:
    """Everything a command was told; ``runtime`` holds the settings of the runtime that
    trains (None in test and eval modes' own parsers)."""

    run: RunSettings
    env: EnvSettings
    model: ModelSettings
    learner: LearnerSettings
    replay: ReplaySettings
    actors: ActorSettings
    # The runtime's own (MonoSettings, PolySettings, RaySettings: its registry entry's).
    runtime: Any = None


def runtime_settings(flags: argparse.Namespace, runtime: str) -> Any:
    """``runtime``'s own settings, as its registry entry builds them (None: it has none).
    The registry is imported here: it names these settings in its type hints."""
    from torchbeast.runtime.registry import RUNTIMES, function

    build = RUNTIMES[runtime].settings
    return None if build is None else function(build)(flags)


def build_settings(
    flags: argparse.Namespace,
    runtime: str | None = None,
    sources: Mapping[str, str] | None = None,
) -> Settings:
    """The settings of a parsed command line (``config.flags.parse_flags``), with those of
    ``runtime`` ("mono", "poly", "ray") if given; ``sources``: where each flag's value came
    from (``config.flags.parse_flags_and_sources``)."""
    return Settings(
        run=from_flags(
            RunSettings,
            flags,
            flags=tuple(vars(flags).items()),
            sources=tuple((sources or {}).items()),
        ),
        env=env_settings(flags),
        model=model_settings(flags),
        learner=learner_settings(flags),
        replay=from_flags(ReplaySettings, flags),
        actors=from_flags(ActorSettings, flags),
        runtime=runtime_settings(flags, runtime) if runtime else None,
    )


def learner_settings(flags: argparse.Namespace) -> LearnerSettings:
    """The learner's settings: the flags of the same names, and whether LASER's replay is on."""
    return from_flags(LearnerSettings, flags, replays=flags.replay_size > 0)


def model_settings(flags: argparse.Namespace) -> ModelSettings:
    """The model's settings: the flags of the same names."""
    return from_flags(ModelSettings, flags)


def env_side_of(settings: Settings) -> PolyEnvSettings:
    """The env processes ``polybeast`` starts for its learner: the same env, addresses,
    TLS and token; with --serve, clients enough for --num_actors streams."""
    poly, actors = settings.runtime, settings.actors
    per_process = math.ceil(actors.num_actors / poly.network.num_servers) if poly.serve else 1
    return PolyEnvSettings(
        env=settings.env,
        network=poly.network,
        connect=poly.serve,
        clients_per_process=per_process,
        envs_per_stream=actors.envs_per_actor,
    )

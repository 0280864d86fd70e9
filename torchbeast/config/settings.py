"""From the parsed flags to the typed settings that every part of a run takes, once, at the
edge: ``core/`` receives these objects, never an argparse namespace, and nothing edits
them afterwards. What only the checkpoint or the first env stream can tell (a resumed
PolyBeast run's env id, a test run's model) travels in the objects that need it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from torchbeast.config.declared import from_flags
from torchbeast.config.env import env_settings
from torchbeast.config.poly import SECRET_FLAGS, PolyEnvSettings
from torchbeast.config.resolvers import DEFAULT_ENVS_PER_ACTOR
from torchbeast.core.settings import (
    LASER,
    RUN,
    TEST_AND_EVAL,
    TRAINING,
    LearnerSettings,
    ModelSettings,
    flag,
)
from torchbeast.envs.settings import EnvSettings

MODES = ("train", "test", "test_render", "eval")


@dataclass(frozen=True)
class RunSettings:
    """The run as a whole: where it writes, what it logs, what it runs on. (How long it
    trains is the learner's ``total_steps``: its learning rate decays to 0 there.)"""

    flags_group: ClassVar[str] = TRAINING

    mode: Literal[MODES] = flag(
        "train",
        "Training or test mode; eval (new) plays greedy episodes and writes their "
        "statistics to eval.json.",
        group=RUN,
    )
    xpid: str | None = flag(
        None, "Experiment id (default: torchbeast-%%Y%%m%%d-%%H%%M%%S).", group=RUN
    )
    disable_checkpoint: bool = flag(False, "Disable saving checkpoint.")
    savedir: str = flag("~/logs/torchbeast", "Root dir where experiment data will be saved.")
    num_learner_threads: int = flag(
        2, "Number learner threads.", metavar="N", check="positive", aliases=("--num_threads",)
    )
    disable_cuda: bool = flag(False, "Disable CUDA.")
    checkpoint_interval: float = flag(
        600.0, "(new) Seconds between checkpoints while training.", metavar="S", check="positive"
    )
    episodes_for_avg: int = flag(
        0,
        "(new) Print the mean return once N episodes have ended since the last one "
        "printed (0: the last 100 episodes on every progress line).",
        metavar="N",
        check="nonnegative",
    )
    suppress_logs: bool = flag(
        False,
        "(new) Only progress lines (steps, SPS, time left, mean return, entropy) and "
        "warnings on the console; out.log keeps everything.",
    )
    num_episodes: int = flag(
        10,
        "(new) Episodes to play in test and eval modes.",
        metavar="N",
        check="positive",
        group=TEST_AND_EVAL,
    )
    video: str | None = flag(
        None,
        "(new) Test and eval modes record the games they play, as the env draws them (not "
        "the agent's 84x84 input), into this GIF: the first --video_steps agent steps.",
        metavar="FILE.gif",
        group=TEST_AND_EVAL,
    )
    random_policy: bool = flag(
        False,
        "(new) Test and eval modes play uniformly random actions instead of the model: "
        "the random policy's level on the run's env, with the reward flags of this command "
        "line, as the model's eval takes them (eval writes eval_random.json; without a "
        "checkpoint, give --env).",
        group=TEST_AND_EVAL,
    )
    sample_actions: bool = flag(
        False,
        "(new) Test and eval modes play actions drawn from the policy, as training does, "
        "instead of its most likely ones: varied games where the env and the greedy policy "
        "are deterministic (Riverraid plays one game from every start); --seed repeats them.",
        group=TEST_AND_EVAL,
    )
    video_steps: int = flag(
        450,
        "(new) Agent steps --video records (Atari: 15 a second of play, so 30 s).",
        metavar="N",
        check="positive",
        group=TEST_AND_EVAL,
    )
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
    """LASER's shared experience replay (``--replay_size`` 0: off); its trust region is
    the learner's (``LearnerSettings.trust_region_threshold``)."""

    flags_group: ClassVar[str] = LASER

    replay_size: int = flag(
        0,
        "(new) Replay capacity in transitions, shared by all actors; 0 turns replay off.",
        metavar="N",
        check="nonnegative",
    )
    replay_ratio: int = flag(
        1,
        "(new) Replayed rollouts per online rollout in each learner batch: "
        "B online + B*K replayed (7 is the paper's 87.5%% replay).",
        metavar="K",
        check="positive",
    )
    learn_start: int = flag(
        10000,
        "(new) Transitions in the replay before it is sampled (at most --replay_size).",
        metavar="N",
        check="nonnegative",
    )
    replay_checkpoint_gib: float = flag(
        2.0,
        "(new) With each checkpoint, the replay's newest transitions up to this size are "
        "saved beside it (replay.tar), and a resumed run starts from them; 0: not saved "
        "(a resumed run's replay starts empty).",
        metavar="GIB",
        check="nonnegative",
    )


@dataclass(frozen=True)
class ActorSettings:
    """How many actors (PolyBeast: env streams) step how many envs each, and (MonoBeast)
    how many shared-memory buffers their rollouts go through. None until resolved
    (``config.resolvers``)."""

    flags_group: ClassVar[str] = TRAINING

    num_actors: int | None = flag(
        None,
        "Number of actors (default: half the machine's cores, at least 2 where it has "
        "2, or one per core where the learner is on a GPU; the run's log says which "
        "layout it chose).",
        metavar="N",
        check="positive",
    )
    envs_per_actor: int | None = flag(
        None,
        "(new) Environments each actor steps, with one batched forward pass for all "
        f"(default: {DEFAULT_ENVS_PER_ACTOR}, so 2 x 8 on 2 cores and 8 x 8 on 16, "
        "16 x 8 with a GPU; "
        "1 if only --num_actors is given, as in the original).",
        metavar="N",
        check="positive",
    )
    # Every runtime takes the flag, as the original's command lines give it; only those
    # whose registry entry keeps shared-memory buffers resolve it (dropped to None elsewhere).
    num_buffers: int | None = flag(
        None,
        "Number of shared-memory buffers "
        "(default: max(2*num_actors*envs_per_actor, batch_size + num_actors*(envs_per_actor-1))); "
        "MonoBeast's only: the other runtimes keep none, and say so when it is given.",
        metavar="N",
        check="positive",
    )
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
    """``runtime``'s own settings, of the class its registry entry names (None: it has
    none). The registry is imported here: it names these settings in its type hints."""
    from torchbeast.runtime.registry import RUNTIMES, function

    settings_type = RUNTIMES[runtime].settings
    return None if settings_type is None else from_flags(function(settings_type), flags)


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
            flags=tuple((k, v) for k, v in vars(flags).items() if k not in SECRET_FLAGS),
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
    TLS and token; with --serve, clients enough for --num_actors streams; without, no more
    servers than the learner dials (--num_actors streams, round robin)."""
    poly, actors = settings.runtime, settings.actors
    network, per_process = poly.network, 1
    if poly.serve:  # exactly --num_actors streams: at most --num_servers processes, alike
        processes = max(
            count
            for count in range(1, min(network.num_servers, actors.num_actors) + 1)
            if actors.num_actors % count == 0
        )
        network = replace(network, num_servers=processes)
        per_process = actors.num_actors // processes
    elif network.env_servers is None:  # the learner dials one stream a server, round robin
        network = replace(network, num_servers=min(network.num_servers, actors.num_actors))
    return PolyEnvSettings(
        env=settings.env,
        network=network,
        connect=poly.serve,
        clients_per_process=per_process,
        envs_per_stream=actors.envs_per_actor,
    )

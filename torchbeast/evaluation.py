"""Test and eval modes: a trained model plays whole games greedily (``--sample_actions``:
drawing its actions, as training does), in every runtime.

``--mode test`` logs each episode's return. ``--mode eval`` also measures what reward
misspecification studies compare (the proxy return the agent was trained on and the env's
episode extras, e.g. Riverraid's true return and true move measure, per episode and, for
returns, per step), prints mean ± std, and writes the figures to ``savedir/xpid/eval.json``.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import torch

from torchbeast import envs, video
from torchbeast.config.layers import DEFAULT
from torchbeast.config.settings import Settings
from torchbeast.core import checkpoint
from torchbeast.core.errors import first_line, shown, write_failure
from torchbeast.core.files import replaced_whole
from torchbeast.core.models import Agent, create_model, model_config
from torchbeast.core.precision import PRECISIONS, compute_dtype
from torchbeast.core.settings import ModelSettings
from torchbeast.core.spec import EnvSpec
from torchbeast.envs.family import family_of
from torchbeast.envs.settings import EnvSettings
from torchbeast.runtime.acting import act, as_tensors
from torchbeast.runtime.console import setup_console_logging

log = logging.getLogger("torchbeast")


@dataclasses.dataclass
class Episode:
    """One whole game; ``episode_return`` is the sum of the reward the agent trains on,
    ``extras`` the env's episode extras by name. ``return_name``: how the figures name it,
    "return", or "proxy_return" where the reward is not the env's own (a reward proxy)."""

    episode_return: float
    extras: dict[str, float]
    length: int
    return_name: str = "return"
    actions: str = ""  # a digest of the actions played: games alike in figures may differ

    def figures(self) -> dict[str, float]:
        """The returns and extras, then each return (a figure named ``return`` or
        ``*_return``) per step."""
        totals = {self.return_name: self.episode_return, **self.extras}
        per_step = {
            f"{name}_per_step": value / self.length
            for name, value in totals.items()
            if name == "return" or name.endswith("_return")
        }
        return {**totals, **per_step, "episode_length": float(self.length)}


class RandomPolicy:
    """Uniformly random actions, seeded (``--random_policy``): what a trained agent's
    figures are compared with."""

    def __init__(self, num_actions: int, seed: int | None):
        self.num_actions = num_actions
        self.generator = torch.Generator().manual_seed(seed or 0)

    def initial_state(self, batch_size: int) -> tuple:
        return ()

    def __call__(self, inputs: dict[str, torch.Tensor], core_state: tuple) -> tuple[dict, tuple]:
        batch = inputs["reward"].shape  # [1, E]
        action = torch.randint(self.num_actions, batch, generator=self.generator)
        return {"action": action}, core_state


@dataclasses.dataclass(frozen=True)
class Trained:
    """A trained run's checkpoint, and the environments to play it on: ``--env``, or if
    not given the run's own."""

    state: dict
    path: str
    env: EnvSettings


def load_trained(settings: Settings) -> Trained:
    """The run's checkpoint, with the env id resolved. A random policy needs none where
    ``--env`` is given."""
    run_dir = settings.run.run_dir
    path = checkpoint.path_in(run_dir)
    if not os.path.exists(path):
        if settings.run.random_policy:
            if settings.env.env:
                return Trained({}, "", settings.env)
            raise checkpoint.CheckpointError(
                f"no checkpoint at {path} to take the env from: give the random policy its "
                "env with --env"
            )
        if os.path.exists(os.path.join(run_dir, "logs.csv")):  # a run, not yet saved
            raise checkpoint.CheckpointError(
                f"the run in {run_dir} has no checkpoint yet: it writes one every "
                "--checkpoint_interval seconds and as it ends (none with --disable_checkpoint)"
            )
    state = checkpoint.load(path)
    env = settings.env
    if env.env is None:
        env = dataclasses.replace(env, env=checkpoint.saved_env_id(state, path))
    # The env plays with the command line's family flags (a proxy-trained agent is
    # evaluated on the game score so): each that differs from training is said once, if
    # they apply to the env at all. A random policy plays nothing the run trained.
    family = envs.checked_family(env)
    if not settings.run.random_policy:
        for line in family.played_unlike_trained(env, state.get("flags", {})):
            log.warning("%s", line)
    return Trained(state, path, env)


def checkpoint_model_config(
    model: ModelSettings,
    trained: Trained,
    observation_shape: Sequence[int],
    given: Collection[str] = (),
) -> dict:
    """The checkpoint's model, so that test and eval commands need not repeat the model
    flags; a model flag that is given must match it. ``given``: the switches given (a
    file's or the command line's, on or off: ``--no_use_lstm`` is said, not left out)."""
    config = model_config(model, observation_shape)
    state, path = trained.state, trained.path
    saved = state.get("model_config", {})
    if model.hidden_size is None and "hidden_size" in saved:
        config["hidden_size"] = saved["hidden_size"]
    if model.num_layers is None and "num_layers" in saved:
        config["num_layers"] = saved["num_layers"]
    if "use_lstm" not in given and "use_lstm" in saved:
        config["use_lstm"] = saved["use_lstm"]
    # --no_use_resnet says only what the torso is not.
    resnet_said = model.use_resnet or ("use_resnet" in given and saved.get("kind") == "resnet")
    if model.torso is None and not resnet_said and "kind" in saved:
        config["kind"] = saved["kind"]
    checkpoint.check_compatible(state, trained.env.env, config, path)
    return config


def play(settings: Settings, trained: Trained, render: bool = False) -> list[Episode]:
    """Plays ``--num_episodes`` whole games with the checkpoint's model (greedily, or drawing
    its actions with ``--sample_actions``); with ``--video``, records the first
    ``--video_steps`` agent steps of them."""
    run = settings.run
    recorder = None if run.video is None else video.Recorder(run.video, run.video_steps)
    render_mode = "human" if render else ("rgb_array" if recorder else None)
    with envs.environment_errors():
        env = envs.create_env(trained.env, num_envs=1, render=render_mode)
    proxy = envs.reward_description(trained.env) is not None
    return_name = "proxy_return" if proxy else "return"
    try:
        model = policy(settings, trained, env.spec)
        spec = env.spec
        episodes: list[Episode] = []
        with envs.environment_errors():
            env_output = as_tensors(env.reset(seed=play_seed(trained.env.seed)))
        core_state = model.initial_state(1)
        actions = hashlib.blake2b(digest_size=8)  # of the game under way
        if recorder is not None:  # its first picture: a video it cannot record, said now
            with envs.environment_errors():
                recorder.add(env.frame())
        progress = EpisodeProgress(settings.run.num_episodes)
        while len(episodes) < settings.run.num_episodes:
            agent_output, core_state = act(model, env_output, core_state)
            with envs.environment_errors():
                step = env.step(agent_output["action"].numpy())
            actions.update(agent_output["action"].numpy().tobytes())
            env_output = as_tensors(step)
            progress.step(len(episodes))
            if recorder is not None and not recorder.full:
                with envs.environment_errors():
                    recorder.add(env.frame())
            if step["episode_end"][0]:
                episodes.append(ended_episode(step, spec, return_name, actions.hexdigest()))
                actions = hashlib.blake2b(digest_size=8)
                check_finite(episodes[-1], len(episodes))
                log.info(
                    "Episode %d ended after %d steps. Return: %.1f",
                    len(episodes),
                    episodes[-1].length,
                    episodes[-1].episode_return,
                )
        if recorder is not None:
            save_video(recorder)
        return episodes
    finally:
        env.close()


def ended_episode(step: dict, spec: EnvSpec, return_name: str, actions: str) -> Episode:
    """The game the (first) env's ``step`` ended, with the digest of its ``actions``."""
    return Episode(
        episode_return=float(step["episode_return"][0]),
        extras={
            name: float(step[key][0])
            for name, key in zip(spec.episode_extras, spec.extra_keys, strict=True)
        },
        length=int(step["episode_step"][0]),
        return_name=return_name,
        actions=actions,
    )


def save_video(recorder: video.Recorder) -> None:
    """Writes the video; one that cannot be written is a warning: the games' figures are
    kept (eval.json follows)."""
    try:
        log.info(
            "Recorded %d steps of play in %s (%.1f s).",
            recorder.save(),
            recorder.path,
            recorder.seconds,
        )
    except OSError as error:
        log.warning("Could not write the video %s: %s", recorder.path, write_failure(error))


def play_seed(seed: int | None) -> int | None:
    """--seed as the games take it: below 2**31, where ale-py's 32-bit seeds overflowed
    (training's seeds wrap alike: ``envs.worker_seed``)."""
    return None if seed is None else seed % envs.SEED_RANGE


def check_finite(episode: Episode, number: int) -> None:
    """Refuses an episode whose figures are NaN or infinite: eval.json (JSON) cannot hold
    them, and a mean over them says nothing."""
    for name, value in {"return": episode.episode_return, **episode.extras}.items():
        if not np.isfinite(value):
            raise envs.EnvError(
                f"episode {number}'s {name} is {value}: the environment's rewards hold NaN "
                "or inf, or add up past float32's range: fix (or scale) what its step returns"
            )


PROGRESS_INTERVAL_S = 60.0


class EpisodeProgress:
    """A line every minute of a game that goes on (an env without a time limit can play
    one forever): how many steps the episode under way has taken."""

    def __init__(self, num_episodes: int):
        self.num_episodes = num_episodes
        self.steps = 0
        self.episodes = 0
        self.next_line = time.monotonic() + PROGRESS_INTERVAL_S

    def step(self, episodes_ended: int) -> None:
        if episodes_ended != self.episodes:
            self.episodes, self.steps = episodes_ended, 0
        self.steps += 1
        if time.monotonic() >= self.next_line:
            self.next_line += PROGRESS_INTERVAL_S
            log.info(
                "Playing episode %d of %d: %d steps so far (an env without a time limit may "
                "never end one).",
                self.episodes + 1,
                self.num_episodes,
                self.steps,
            )


def played_precision(settings: Settings, trained: Trained, given: Collection[str]) -> str:
    """The --precision the model plays in: the one given, or else the one the run trained
    with (its actors played in it: a run trained in fp32 is not played in bf16)."""
    trained_with = trained.state.get("flags", {}).get("precision")
    if "precision" in given or trained_with not in PRECISIONS:
        return settings.model.precision
    return trained_with


def policy(settings: Settings, trained: Trained, spec: EnvSpec) -> Agent | RandomPolicy:
    """The checkpoint's model, playing greedily; or a random policy."""
    if settings.run.random_policy:
        return RandomPolicy(spec.num_actions, trained.env.seed)
    given = {name for name, source in settings.run.sources if source != DEFAULT}
    config = checkpoint_model_config(settings.model, trained, spec.observation_shape, given)
    checkpoint.check_spec(trained.state, spec, trained.path)  # the env's code changed since
    if "model_state_dict" not in trained.state:
        raise checkpoint.CheckpointError(
            f"{trained.path} is damaged: it has no model_state_dict: {checkpoint.RESTORE_IT}"
        )
    try:  # what the checkpoint records of its model, and its weights, are the file's
        dtype = compute_dtype(played_precision(settings, trained, given), "cpu", config["kind"])
        model = create_model(
            config,
            spec.observation_shape,
            spec.num_actions,
            compute_dtype=dtype,
            inference_only=True,
        )
        model.load_state_dict(trained.state["model_state_dict"])
    except (KeyError, RuntimeError, TypeError, ValueError) as error:
        reason = first_line(error, "")
        raise checkpoint.CheckpointError(
            f"{trained.path} is damaged: the model it records cannot be built, or its "
            "weights do not fit it "
            f"({shown(f'{type(error).__name__}: {reason}', quote=False)}): "
            f"{checkpoint.RESTORE_IT}"
        ) from None
    model.train(settings.run.sample_actions)  # drawn from the policy, or its most likely
    if settings.run.sample_actions and trained.env.seed is not None:
        torch.manual_seed(trained.env.seed)  # the draws, as the games, repeat with --seed
    return model


def test(settings: Settings, render: bool = False) -> list[float]:
    """--mode test: plays ``num_episodes`` whole games greedily and logs their returns."""
    setup_console_logging()
    trained = load_trained(settings)
    returns = [episode.episode_return for episode in play(settings, trained, render)]
    log.info("Average returns over %i episodes: %.1f", len(returns), np.mean(returns))
    return returns


def one_game(episodes: list[Episode]) -> bool:
    """Whether several games were one game: the same actions and the same figures (a solved
    CartPole scores 500 in every game, from other starts, with other actions)."""
    return (
        len(episodes) > 1
        and len({episode.actions for episode in episodes}) == 1
        and all(episode.figures() == episodes[0].figures() for episode in episodes)
    )


def summarize(episodes: list[Episode]) -> dict[str, dict[str, float]]:
    """Mean and standard deviation of each figure over the episodes."""
    table = [episode.figures() for episode in episodes]
    return {
        name: {
            "mean": float(np.mean([row[name] for row in table])),
            "std": float(np.std([row[name] for row in table])),
        }
        for name in table[0]
    }


def evaluate(settings: Settings) -> dict:
    """--mode eval: plays greedily, prints mean ± std of each figure, writes eval.json."""
    setup_console_logging()
    trained = load_trained(settings)
    state, xpid = trained.state, settings.run.xpid
    family_figures = family_of(trained.env.env).evaluation_figures(
        trained.env, state.get("flags", {})
    )
    name = "eval_random.json" if settings.run.random_policy else "eval.json"
    eval_path = os.path.join(settings.run.run_dir, name)
    if settings.run.random_policy:
        os.makedirs(settings.run.run_dir, exist_ok=True)
    check_writable(eval_path)  # before the games, not after them all
    episodes = play(settings, trained)
    summary = summarize(episodes)
    for name, figure in summary.items():
        log.info("%-22s %10.2f ± %.2f", name, figure["mean"], figure["std"])
    greedy = not (settings.run.random_policy or settings.run.sample_actions)
    if greedy and one_game(episodes):
        log.warning(
            "The %d games were one game played %d times: the env and the greedy policy are "
            "deterministic from these starts. --sample_actions draws the policy's actions, "
            "as training did, for varied games.",
            len(episodes),
            len(episodes),
        )
    report: dict[str, object] = {"xpid": xpid, "env": trained.env.env}
    if "step" in state and not settings.run.random_policy:  # which checkpoint was played
        report["step"] = state["step"]
    report["num_episodes"] = len(episodes)
    if settings.run.random_policy:
        report["policy"] = "random"
    else:
        report["actions"] = "sampled" if settings.run.sample_actions else "greedy"
        # The models hold parameters only (no buffers such as batch-norm statistics).
        report["parameters"] = sum(t.numel() for t in state["model_state_dict"].values())
    report |= {**family_figures, **summary, "episodes": [e.figures() for e in episodes]}
    write_json_atomically(eval_path, report)
    parameters = f" ({report['parameters']} parameters)" if "parameters" in report else ""
    log.info("Wrote %s%s.", eval_path, parameters)
    return report


def check_writable(path: str) -> None:
    """Raises the OSError that writing ``path`` (``write_json_atomically``) would, naming
    it: a read-only folder, or a folder at ``path``."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    probe = f"{path}.{os.getpid()}.tmp"  # its own: another eval of the run may be writing
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from error


def write_json_atomically(path: str, value: dict) -> None:
    """Writes ``value`` to ``path`` whole or not at all (``replaced_whole``: another eval of
    the run may be writing its own); an error names ``path`` (a folder there, say)."""
    try:
        with replaced_whole(Path(path)) as temporary, open(temporary, "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from error

"""Environments: ``create_env(settings)`` for any Gymnasium id, stepped N at a time.

Atari ids (``*NoFrameskip-v4``, ``ALE/*-v5``) run on ale-py's ``AtariVectorEnv`` (C++,
threaded) with the DeepMind preprocessing TorchBeast used: up to 30 no-ops on reset,
action repeat 4 with a max over the last two frames, fire on reset, 84x84 grayscale, a
stack of 4 (uint8 [4, 84, 84]), and episodic life: a lost life ends the episode for the
learner (done) while the game goes on, and the next step presses FIRE in place of the
agent's action in games that have it (the original's wrappers press it on every reset,
including after a lost life; ``--no_fire_on_life_loss`` turns this off). Episode returns
are the unclipped game score of the whole game. Other ids (CartPole-v1,
MinAtar/Breakout-v1, ...) run on Gymnasium's ``SyncVectorEnv``.

Every step returns numpy arrays with a leading [N] dimension, TorchBeast style: when an
episode ends the env resets at once, so ``frame`` is the new episode's first frame while
``reward``/``done`` describe the step that ended the old one.

An environment may report extra per-episode figures besides its return: it declares them
in its metadata, ``metadata["episode_extras"] = {name: info_key}``, and each step's
``info[info_key]`` adds up over the episode as ``episode_<name>``, as the reward adds up
to ``episode_return``. Riverraid with a reward proxy (``envs.riverraid``) declares two; it
runs on Gymnasium's Python Atari wrappers instead, with the same preprocessing, since the
proxy needs each emulator frame's score and the RAM.
"""

from __future__ import annotations

import importlib
import threading

import gymnasium as gym
import numpy as np

from torchbeast.core.errors import UserError
from torchbeast.core.spec import EnvSpec
from torchbeast.envs import cue, riverraid
from torchbeast.envs.settings import EnvSettings

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
LIST_IDS_HINT = "list valid ids with: python -m torchbeast.envs"


SUPPORTED_OBSERVATION_DTYPES = tuple(
    np.dtype(name)
    for name in ("uint8", "int8", "int16", "int32", "int64", "float32", "float64", "bool")
)


class EnvError(UserError, ValueError):
    """An environment id or space that torchbeast cannot run; the message says why."""


_registering = threading.Lock()


def _register_optional_envs() -> None:
    # Under a lock: an env client process creates its envs from several threads at once,
    # and gymnasium's registry is a plain dict (a concurrent registration raised
    # "dictionary changed size during iteration" and stopped every client of the process).
    with _registering:
        import ale_py

        gym.register_envs(ale_py)
        cue.register()
        try:
            import minatar.gym
        except ImportError:
            return
        if "MinAtar/Breakout-v1" not in gym.registry:
            minatar.gym.register_envs()


def worker_seed(seed: int | None, worker: int, num_envs: int) -> int | None:
    """The seed of a worker's first environment (its other ``num_envs`` - 1 take the next
    seeds): distinct for every worker of a run and derived from ``--seed`` alone, so that
    a seeded run can be reproduced. ``worker`` numbers the run's workers from 0 (actors and
    their restarts, env streams and their redials); None without a seed."""
    if seed is None:
        return None
    return seed * 100_003 + worker * num_envs


def gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id``; ``module:Id`` imports ``module`` first."""
    _register_optional_envs()
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        return gym.spec(name)
    except ImportError as error:
        raise EnvError(f"cannot import {module!r} for environment {env_id!r} ({error})") from None
    except gym.error.Error as error:
        hint = "install it with: pip install MinAtar; " if env_id.startswith("MinAtar/") else ""
        raise EnvError(
            f"unknown environment id {env_id!r} ({error}); {hint}{LIST_IDS_HINT}"
        ) from None


def is_atari(env_id: str) -> bool:
    return gym_spec(env_id).entry_point == ATARI_ENTRY_POINT


class BatchedEnv:
    """N environments stepped together, with episode bookkeeping TorchBeast-style."""

    def __init__(
        self,
        vector_env: gym.vector.VectorEnv,
        env_id: str,
        track_lives: bool,
        fire_action: int | None = None,
    ):
        self.env = vector_env
        self.num_envs = vector_env.num_envs
        space = vector_env.single_observation_space
        action_space = vector_env.single_action_space
        if not isinstance(action_space, gym.spaces.Discrete):
            raise EnvError(
                f"{env_id} has a {type(action_space).__name__} action space; "
                "torchbeast supports Discrete action spaces only"
            )
        if not isinstance(space, gym.spaces.Box):
            raise EnvError(
                f"{env_id} has a {type(space).__name__} observation space; "
                "torchbeast supports Box observations only"
            )
        dtype = np.dtype(space.dtype)
        if dtype not in SUPPORTED_OBSERVATION_DTYPES:
            raise EnvError(
                f"{env_id} has {dtype} observations; torchbeast supports "
                + ", ".join(d.name for d in SUPPORTED_OBSERVATION_DTYPES)
            )
        # float64 observations are stored and learned from as float32.
        self.cast_to = np.dtype(np.float32) if dtype == np.float64 else None
        stored = self.cast_to or dtype
        # The env's own figures: name -> the key of each step's share in its info.
        extra_info_keys = dict(vector_env.metadata.get("episode_extras", {}))
        try:
            self.spec = EnvSpec(
                env_id, tuple(space.shape), stored, int(action_space.n), tuple(extra_info_keys)
            )
        except ValueError as error:
            raise EnvError(str(error)) from None
        self.track_lives = track_lives
        n = self.num_envs
        self.episode_return = np.zeros(n, dtype=np.float32)
        # (rollout key, info key, running total [N]) of each episode extra.
        self.extras = [
            (key, info_key, np.zeros(n, dtype=np.float32))
            for key, info_key in zip(self.spec.extra_keys, extra_info_keys.values(), strict=True)
        ]
        self.episode_step = np.zeros(n, dtype=np.int32)
        self.lives = np.zeros(n, dtype=np.int64)
        # The action pressed, in place of the agent's, right after a lost life (as the
        # original's episodic-life + fire-reset wrappers do); None: never.
        self.fire_action = fire_action
        self.fire_next = np.zeros(n, dtype=bool)

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        frame, info = self.env.reset(seed=seed)
        if self.cast_to is not None:
            frame = frame.astype(self.cast_to)
        n = self.num_envs
        self.episode_return[:] = 0
        for _, _, total in self.extras:
            total[:] = 0
        self.episode_step[:] = 0
        if self.track_lives:
            self.lives[:] = info["lives"]
        self.fire_next[:] = False
        return dict(
            frame=frame,
            reward=np.zeros(n, dtype=np.float32),
            done=np.ones(n, dtype=bool),
            episode_return=np.zeros(n, dtype=np.float32),
            **{key: np.zeros(n, dtype=np.float32) for key, _, _ in self.extras},
            episode_step=np.zeros(n, dtype=np.int32),
            episode_end=np.zeros(n, dtype=bool),
            last_action=np.zeros(n, dtype=np.int64),
        )

    def step(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        pressed = actions
        if self.fire_next.any():
            pressed = np.where(self.fire_next, self.fire_action, actions).astype(actions.dtype)
        frame, reward, terminated, truncated, info = self.env.step(pressed)
        if self.cast_to is not None:
            frame = frame.astype(self.cast_to)
        reward = reward.astype(np.float32, copy=False)
        game_over = np.logical_or(terminated, truncated)
        done = game_over
        if self.track_lives:
            lives = info["lives"]
            # Episodic life: a lost life is an episode end for the learner only.
            lost_life = lives < self.lives
            done = game_over | lost_life
            self.lives[:] = lives
            if self.fire_action is not None:
                # The game goes on after a lost life; games that wait for FIRE get it.
                self.fire_next = lost_life & ~game_over
        self.episode_return += reward
        for _, info_key, total in self.extras:
            total += step_info(info, info_key)
        self.episode_step += 1
        output = dict(
            frame=frame,
            reward=reward,
            done=done,
            episode_return=self.episode_return.copy(),
            episode_step=self.episode_step.copy(),
            episode_end=game_over,
            last_action=np.asarray(actions, dtype=np.int64),
        )
        self.episode_return[game_over] = 0
        for key, _, total in self.extras:
            output[key] = total.copy()
            total[game_over] = 0
        self.episode_step[game_over] = 0
        return output

    def close(self) -> None:
        self.env.close()


def step_info(info: dict, key: str) -> np.ndarray:
    """``info[key]`` of a vector step, [N]; an env that ended and was reset in this step
    reports its last step's value, which the vector env keeps under "final_info"."""
    if key not in info:
        raise EnvError(
            f"the environment declares an episode extra from info[{key!r}] but its "
            "steps' info has no such key"
        )
    values = np.asarray(info[key], dtype=np.float32).copy()
    if "final_info" in info:
        ended = info["_final_info"]
        values[ended] = np.asarray(info["final_info"][key], dtype=np.float32)[ended]
    return values


def _atari_vector_env(env_id: str, num_envs: int, num_threads: int) -> gym.vector.VectorEnv:
    from ale_py.vector_env import AtariVectorEnv

    kwargs = gym_spec(env_id).kwargs
    return AtariVectorEnv(
        kwargs["game"],
        num_envs,
        num_threads=num_threads,
        repeat_action_probability=kwargs.get("repeat_action_probability", 0.0),
        full_action_space=kwargs.get("full_action_space", False),
        max_num_frames_per_episode=kwargs.get("max_num_frames_per_episode", 108000),
        autoreset_mode="SameStep",
        noop_max=30,
        frameskip=4,
        maxpool=True,
        img_height=84,
        img_width=84,
        grayscale=True,
        stack_num=4,
        episodic_life=False,  # ale-py resets the whole game on a life loss; we track lives
        reward_clipping=False,  # the learner clips; returns are reported unclipped
        use_fire_reset=True,
    )


class FireOnReset(gym.Wrapper):
    """Presses FIRE after reset, for games that wait for it."""

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        if "FIRE" in self.env.unwrapped.get_action_meanings():
            observation, _, terminated, truncated, info = self.env.step(1)
            if terminated or truncated:
                observation, info = self.env.reset(**kwargs)
        return observation, info


def make_single_atari(
    env_id: str, render_mode: str | None = None, proxy: riverraid.RewardProxy | None = None
) -> gym.Env:
    """The same preprocessing from Gymnasium's wrappers: for rendering one game, and for
    Riverraid's reward proxies, which need each emulator frame's score."""
    frame_limit = gym_spec(env_id).kwargs.get("max_num_frames_per_episode", 108000)
    env = gym.make(
        env_id, frameskip=1, render_mode=render_mode, max_num_frames_per_episode=frame_limit
    )
    if proxy is not None:
        env = frame_scores = riverraid.FrameScores(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    if proxy is not None:
        env = riverraid.ProxyReward(env, frame_scores, proxy)
    env = FireOnReset(env)
    return gym.wrappers.FrameStackObservation(env, 4)


def create_env(
    settings: EnvSettings | str,
    num_envs: int = 1,
    seed: int | None = None,
    num_threads: int = 1,
    render: bool = False,
) -> BatchedEnv:
    """Creates ``num_envs`` copies of ``settings.env`` (or of the id given, with the
    defaults) as one BatchedEnv.

    ``num_threads`` is the number of C++ threads stepping Atari games (ignored otherwise).
    Call ``reset(seed)`` on the result before stepping it.
    """
    if isinstance(settings, str):
        settings = EnvSettings(settings)
    env_id = settings.env
    spec = gym_spec(env_id)
    atari = spec.entry_point == ATARI_ENTRY_POINT
    proxy = riverraid.proxy_from_flags(settings)
    if proxy is not None and not riverraid.is_riverraid(spec):
        raise EnvError(
            f"--fuel_multiplier, --move_penalty and --true_move_penalty are Riverraid's reward "
            f"proxies; {env_id} has none: leave them out or use RiverraidNoFrameskip-v4"
        )
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    if atari and not render and proxy is None:
        vector_env = _atari_vector_env(env_id, num_envs, num_threads)
    elif atari:
        render_mode = "human" if render else None
        vector_env = gym.vector.SyncVectorEnv(
            [lambda: make_single_atari(env_id, render_mode, proxy)] * num_envs,
            autoreset_mode=autoreset,
        )
    else:
        make_kwargs = {"render_mode": "human"} if render else {}
        vector_env = gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id, **make_kwargs)] * num_envs, autoreset_mode=autoreset
        )
    fire_on_life_loss = not settings.no_fire_on_life_loss
    return BatchedEnv(
        vector_env,
        env_id,
        track_lives=atari,
        fire_action=fire_action(env_id) if atari and fire_on_life_loss else None,
    )


def log_training_reward(settings: EnvSettings, reward_clipping: str) -> None:
    """Says which reward trains the agent where it is not the env's own (a Riverraid reward
    proxy), with a warning where ``reward_clipping`` hides it."""
    riverraid.log_training_reward(settings, reward_clipping)


def fire_action(env_id: str) -> int | None:
    """The index of FIRE in the game's action set, or None if it has no FIRE."""
    env = gym.make(env_id)
    try:
        meanings = env.unwrapped.get_action_meanings()
    finally:
        env.close()
    return meanings.index("FIRE") if "FIRE" in meanings else None


def env_spec(settings: EnvSettings | str) -> EnvSpec:
    """Observation shape/dtype and number of actions, from one throwaway env."""
    env = create_env(settings, num_envs=1)
    try:
        return env.spec
    finally:
        env.close()

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

The N envs' episode bookkeeping is ``envs.batched``'s; looking an id up, ``envs.registry``'s.
"""

from __future__ import annotations

import gymnasium as gym

from torchbeast.core.spec import EnvSpec
from torchbeast.envs import riverraid
from torchbeast.envs.batched import BatchedEnv
from torchbeast.envs.registry import EnvError, gym_spec
from torchbeast.envs.settings import EnvSettings

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


def worker_seed(seed: int | None, worker: int, num_envs: int) -> int | None:
    """The seed of a worker's first environment (its other ``num_envs`` - 1 take the next
    seeds): distinct for every worker of a run and derived from ``--seed`` alone, so that
    a seeded run can be reproduced. ``worker`` numbers the run's workers from 0 (actors and
    their restarts, env streams and their redials); None without a seed."""
    if seed is None:
        return None
    return seed * 100_003 + worker * num_envs


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
    """Presses FIRE after reset, for games that wait for it.

    ``first_input_frame``: a game that ignores the controller for its first frames (Riverraid)
    gets NOOPs until that emulator frame, then FIRE; pressed earlier, FIRE would leave the
    new game waiting for the agent, which a survival proxy pays to never start it.
    """

    def __init__(self, env: gym.Env, first_input_frame: int = 0):
        super().__init__(env)
        self.first_input_frame = first_input_frame

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        if "FIRE" not in self.env.unwrapped.get_action_meanings():
            return observation, info
        console = self.env.unwrapped.ale
        terminated = truncated = False
        while console.getEpisodeFrameNumber() < self.first_input_frame and not terminated:
            observation, _, terminated, truncated, info = self.env.step(0)
        if not terminated:
            observation, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            observation, info = self.env.reset(**kwargs)
        return observation, info


def make_single_atari(
    env_id: str, render_mode: str | None = None, proxy: riverraid.RewardProxy | None = None
) -> gym.Env:
    """The same preprocessing from Gymnasium's wrappers: for rendering one game, and for
    Riverraid's reward proxies, which need each emulator frame's score."""
    spec = gym_spec(env_id)
    frame_limit = spec.kwargs.get("max_num_frames_per_episode", 108000)
    env = gym.make(
        env_id, frameskip=1, render_mode=render_mode, max_num_frames_per_episode=frame_limit
    )
    if proxy is not None:
        env = frame_scores = riverraid.FrameScores(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    if proxy is not None:
        env = riverraid.ProxyReward(env, frame_scores, proxy)
    first_input_frame = riverraid.FIRST_INPUT_FRAME if riverraid.is_riverraid(spec) else 0
    env = FireOnReset(env, first_input_frame)
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


def reward_description(settings: EnvSettings) -> str | None:
    """What trains the agent where it is not the env's own reward (a Riverraid reward
    proxy), or None."""
    proxy = riverraid.proxy_from_flags(settings)
    return None if proxy is None else proxy.describe()


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

"""``BatchedEnv``: N environments of one Gymnasium vector env stepped together, with the
episode bookkeeping of TorchBeast (returns, lengths, extras, lives, FIRE after a lost life)
on numpy arrays [N]."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from torchbeast.core.spec import ACCEPTED_DTYPES, EnvSpec
from torchbeast.envs.registry import EnvError, cannot_draw

SUPPORTED_OBSERVATION_DTYPES = tuple(np.dtype(name) for name in ACCEPTED_DTYPES)


def space_problem(observation_space: gym.Space, action_space: gym.Space) -> str | None:
    """Why torchbeast cannot train on these spaces ("a Box action space; ..."), or None."""
    if not isinstance(action_space, gym.spaces.Discrete):
        return (
            f"a {type(action_space).__name__} action space; "
            "torchbeast supports Discrete action spaces only"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        return (
            f"a {type(observation_space).__name__} observation space; "
            "torchbeast supports Box observations only"
        )
    if observation_space.shape == ():
        return (
            "a Box observation of shape () (a single number); torchbeast takes arrays: give "
            "the env a shape of (1,), e.g. with gymnasium.wrappers.ReshapeObservation"
        )
    dtype = np.dtype(observation_space.dtype)
    if dtype not in SUPPORTED_OBSERVATION_DTYPES:
        return f"{dtype} observations; torchbeast supports " + ", ".join(
            d.name for d in SUPPORTED_OBSERVATION_DTYPES
        )
    return None


class BatchedEnv:
    """N environments stepped together, with episode bookkeeping TorchBeast-style."""

    def __init__(
        self,
        vector_env: gym.vector.VectorEnv,
        env_id: str,
        track_lives: bool,
        fire_action: int | None = None,
        frame_stack: bool = False,
    ):
        """``frame_stack``: each observation [stack, ...] holds the latest frames, the
        newest last; an episode (a game, or a life) then starts with all of them its first
        frame, as the original's FrameStack does, not with blank or the last life's frames."""
        self.env = vector_env
        self.frame_stack = frame_stack
        # Steps since each env's episode began (0: its first frame); kept for a frame stack.
        self.frames_in_episode = np.zeros(vector_env.num_envs, dtype=np.int64)
        self.num_envs = vector_env.num_envs
        space = vector_env.single_observation_space
        problem = space_problem(space, vector_env.single_action_space)
        if problem is not None:
            raise EnvError(f"{env_id} has {problem}")
        dtype = np.dtype(space.dtype)
        action_space = vector_env.single_action_space
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
        # The agent's actions are 0..n-1; a Discrete(n, start=s) env takes s..s+n-1.
        self.action_start = int(action_space.start)
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
        # What every step where no time limit ended an episode returns (never written to).
        self.no_truncation = np.zeros(n, dtype=bool)
        self.no_final_frames = np.zeros((0, *space.shape), dtype=stored)

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        frame, info = self.env.reset(seed=seed)
        if self.cast_to is not None:
            frame = frame.astype(self.cast_to)
        if self.frame_stack:
            self.frames_in_episode[:] = 0
            self.fill_stacks_before_episode_start(frame)
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
            truncated=self.no_truncation,
            final_frame=self.no_final_frames,
        )

    def step(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        pressed = actions
        if self.fire_next.any():
            pressed = np.where(self.fire_next, self.fire_action, actions).astype(actions.dtype)
        if self.action_start:
            pressed = pressed + self.action_start
        frame, reward, terminated, truncated, info = self.env.step(pressed)
        if self.cast_to is not None:
            frame = frame.astype(self.cast_to)
        reward = reward.astype(np.float32, copy=False)
        game_over = np.logical_or(terminated, truncated)
        done = game_over
        lost_life = None
        if self.track_lives:
            lives = info["lives"]
            # Episodic life: a lost life is an episode end for the learner only.
            lost_life = lives < self.lives
            done = game_over | lost_life
            self.lives[:] = lives
            if self.fire_action is not None:
                # The game goes on after a lost life; games that wait for FIRE get it.
                self.fire_next = lost_life & ~game_over
        if self.frame_stack:
            self.frames_in_episode += 1
            self.frames_in_episode[done] = 0
            self.fill_stacks_before_episode_start(frame)
        self.episode_return += reward
        for _, info_key, total in self.extras:
            total += step_info(info, info_key)
        self.episode_step += 1
        # A time limit, not the game, ended these episodes: the learner bootstraps their
        # last step from the value of the state they stopped in, ``final_frame``.
        cut_short = self.no_truncation
        if truncated.any():  # rare; steps without any share two empty arrays
            # Not where the game ended too on the limit's step, nor a life (the learner's end).
            ended_anyway = np.logical_or(terminated, False if lost_life is None else lost_life)
            if (truncated & ~ended_anyway).any():
                cut_short = truncated & ~ended_anyway
        output = dict(
            frame=frame,
            reward=reward,
            done=done,
            episode_return=self.episode_return.copy(),
            episode_step=self.episode_step.copy(),
            episode_end=game_over,
            last_action=np.asarray(actions, dtype=np.int64),
            truncated=cut_short,
            final_frame=self.final_frames(info, cut_short),
        )
        self.episode_return[game_over] = 0
        for key, _, total in self.extras:
            output[key] = total.copy()
            total[game_over] = 0
        self.episode_step[game_over] = 0
        return output

    def final_frames(self, info: dict, cut_short: np.ndarray) -> np.ndarray:
        """[K, ...]: the last observation of each of the K episodes ``cut_short`` ([N]) ended
        in this step, in env order, which the vector env keeps in ``info["final_obs"]``
        (its ``frame`` is already the next episode's first)."""
        if cut_short is self.no_truncation:
            return self.no_final_frames
        final, dtype = info["final_obs"], self.no_final_frames.dtype
        return np.stack([np.asarray(final[env], dtype=dtype) for env in np.flatnonzero(cut_short)])

    def fill_stacks_before_episode_start(self, frame: np.ndarray) -> None:
        """In place, in each stack [N, depth, ...]: the frames from before its episode's
        first (the blank padding of a new game, the last life's frames) become that first
        frame, also in the steps after it, while the env's own stack still holds them."""
        depth = frame.shape[1]
        for env in np.flatnonzero(self.frames_in_episode < depth - 1):
            first = depth - 1 - self.frames_in_episode[env]  # where the episode's first is
            frame[env, :first] = frame[env, first]

    def frame(self) -> np.ndarray:
        """The first env's picture as the env draws it (made with render "rgb_array"):
        e.g. Atari's 210x160 RGB screen, not the 84x84 input the agent sees."""
        pictures = self.env.render()
        if pictures is None or pictures[0] is None:
            raise EnvError(cannot_draw(self.spec.env_id, "its render() returned nothing"))
        return np.asarray(pictures[0])

    def close(self) -> None:
        self.env.close()


def step_info(info: dict, key: str) -> np.ndarray:
    """``info[key]`` of a vector step, [N]; an env that ended and was reset in this step
    reports its last step's value, which the vector env keeps under "final_info" (where
    every env ended, and their resets' info has no such key, only there)."""
    final = info.get("final_info", {})
    if key not in info and key not in final:
        raise EnvError(
            f"the environment declares an episode extra from info[{key!r}] but its "
            "steps' info has no such key"
        )
    ended = info.get("_final_info")
    if key in info:
        values = np.asarray(info[key], dtype=np.float32).copy()
    else:
        values = np.zeros(len(ended), dtype=np.float32)
    if key in final:
        values[ended] = np.asarray(final[key], dtype=np.float32)[ended]
    return values

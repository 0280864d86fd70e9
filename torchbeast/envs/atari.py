"""The Atari family: ale-py's games with the DeepMind preprocessing TorchBeast used, and
Riverraid's reward proxies (``envs.riverraid``) as an option of this family.

Atari ids (``*NoFrameskip-v4``, ``ALE/*-v5``) run on ale-py's ``AtariVectorEnv`` (C++,
threaded): up to 30 no-ops on reset, action repeat 4 with a max over the last two frames,
fire on reset, 84x84 grayscale, a stack of 4 (uint8 [4, 84, 84]), and episodic life: a
lost life ends the episode for the learner (done) while the game goes on, and the next
step presses FIRE in place of the agent's action in games that have it (the original's
wrappers press it on every reset, including after a lost life; ``--no_fire_on_life_loss``
turns this off). Episode returns are the unclipped game score of the whole game.

Riverraid with a reward proxy runs on Gymnasium's Python Atari wrappers instead, with the
same preprocessing, since the proxy needs each emulator frame's score and the RAM; it
declares its true return and true move as episode extras.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import gymnasium as gym

import torchbeast.envs.riverraid as riverraid
from torchbeast.core.settings import flag
from torchbeast.envs.batched import BatchedEnv
from torchbeast.envs.family import EnvFamily, Preset, flag_differences
from torchbeast.envs.registry import EnvError, gym_spec
from torchbeast.envs.settings import EnvSettings

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


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
    # Only a proxy's Riverraid waits for its first input frame: without a proxy the game
    # trains on AtariVectorEnv, which presses FIRE at once, and a video of it must play
    # the game it trained on.
    first_input_frame = 0
    if proxy is not None and riverraid.is_riverraid(spec):
        first_input_frame = riverraid.FIRST_INPUT_FRAME
    env = FireOnReset(env, first_input_frame)
    return gym.wrappers.FrameStackObservation(env, 4)


def fire_action(env_id: str) -> int | None:
    """The index of FIRE in the game's action set, or None if it has no FIRE."""
    env = gym.make(env_id)
    try:
        meanings = env.unwrapped.get_action_meanings()
    finally:
        env.close()
    return meanings.index("FIRE") if "FIRE" in meanings else None


def proxy_of(settings: EnvSettings) -> riverraid.RewardProxy | None:
    return riverraid.proxy_from_flags(dict(settings.options))


SURVIVAL = Preset(
    "Riverraid survival proxy",
    {"normalize_values": True, "normalize_advantages": True, "unroll_length": 80, "batch_size": 4},
    "`--fuel_multiplier 1 --move_penalty 0`, seeds 1 and 2: the 100-game mean length from "
    "~700 steps to 1,085-1,156 by 500K, kept to 1M (the defaults: lost again after 200K)",
    "`--env RiverraidNoFrameskip-v4 --fuel_multiplier 1 --move_penalty 0` (survival)",
)


@dataclasses.dataclass(frozen=True)
class AtariOptions:
    """The Atari family's flags. A proxy flag left out is None, so that "none given" (train
    on the game score) can be told apart from the defaults (``riverraid.RewardProxy``)."""

    no_fire_on_life_loss: bool = flag(
        False,
        "(new) Do not press FIRE after a lost life (the original's wrappers do; "
        "games such as Breakout and Riverraid wait for it).",
    )
    fuel_multiplier: float | None = flag(
        None,
        "(new) Riverraid proxy: M >= 0 makes fuel canisters worth 80*M; M < 0 is the "
        "pacifist proxy; M = 1 (the default where another proxy flag is given) is the move "
        "proxy of --move_penalty. No proxy flag at all: the game score. See the manual's "
        "table of proxies (docs/reward-misspecification.md).",
        metavar="M",
        check="finite",
    )
    move_penalty: float | None = flag(
        None,
        "(new) Riverraid proxy when --fuel_multiplier is 1: 10 per step alive, minus "
        "P per sideways move (P >= 0) or plus P*(x-76)^2/20 (P < 0) (default 0).",
        metavar="P",
        check="finite",
    )
    true_move_penalty: float | None = flag(
        None,
        "(new) Riverraid: the move measure with Q, logged as the true move, "
        "never trained on (default 0).",
        metavar="Q",
        check="finite",
    )


class AtariFamily(EnvFamily):
    name = "Atari"
    summary = "ale-py's Atari games, DeepMind preprocessing"
    options = AtariOptions

    def cannot_train(self, env_id: str) -> str | None:
        if gym_spec(env_id).kwargs.get("obs_type", "rgb") != "rgb":
            return "RAM observations; the family trains on frames: use the id without -ram"
        return None

    def check(self, settings: EnvSettings) -> None:
        problem = self.cannot_train(settings.env)
        if problem is not None:
            raise EnvError(f"{settings.env}: {problem}")
        self.check_proxy(settings)

    def takes(self, env_id: str, spec: gym.envs.registration.EnvSpec) -> bool:
        return spec.entry_point == ATARI_ENTRY_POINT

    def presets(self, env_id: str, given: Mapping[str, object]) -> list[Preset]:
        proxy = riverraid.proxy_from_flags(given)
        if proxy is None or proxy.kind != "move" or proxy.move_penalty != 0:
            return []
        if not riverraid.is_riverraid(gym_spec(env_id)):  # refused by check_proxy
            return []
        return [SURVIVAL]

    def known_presets(self) -> list[Preset]:
        return [SURVIVAL]

    def check_proxy(self, settings: EnvSettings) -> None:
        if proxy_of(settings) is not None and not riverraid.is_riverraid(gym_spec(settings.env)):
            raise EnvError(
                f"--fuel_multiplier, --move_penalty and --true_move_penalty are Riverraid's "
                f"reward proxies; {settings.env} has none: leave them out or use "
                "RiverraidNoFrameskip-v4"
            )

    def make(
        self, settings: EnvSettings, num_envs: int, num_threads: int, render: str | None
    ) -> BatchedEnv:
        env_id, proxy = settings.env, proxy_of(settings)
        if not render and proxy is None:
            vector_env = _atari_vector_env(env_id, num_envs, num_threads)
        else:
            vector_env = gym.vector.SyncVectorEnv(
                [lambda: make_single_atari(env_id, render, proxy)] * num_envs,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            )
        fire_on_life_loss = not settings.option("no_fire_on_life_loss", False)
        return BatchedEnv(
            vector_env,
            env_id,
            track_lives=True,
            fire_action=fire_action(env_id) if fire_on_life_loss else None,
            frame_stack=True,
        )

    def reward_description(self, settings: EnvSettings) -> str | None:
        proxy = proxy_of(settings)
        return None if proxy is None else proxy.describe()

    def log_training_reward(self, settings: EnvSettings, reward_clipping: str) -> None:
        riverraid.log_training_reward(proxy_of(settings), reward_clipping)

    def played_unlike_trained(self, settings: EnvSettings, trained_flags: Mapping) -> list[str]:
        """The reward proxy is compared as a whole, its defaults filled in (a proxy flag
        not given and one given its default value are the same proxy)."""
        lines = flag_differences(self.options, ["no_fire_on_life_loss"], settings, trained_flags)
        played_with, trained_with = proxies_played_and_trained(settings, trained_flags)
        if played_with != trained_with:
            lines.append(
                f"Playing with reward proxy {played_with or 'none (game score)'}, but the run "
                f"was trained with {trained_with or 'none (game score)'}."
            )
        return lines

    def compared_options(self, options: Mapping[str, object]) -> dict[str, object]:
        """The reward proxy as a whole, its defaults filled in (``--move_penalty 0`` and
        ``--fuel_multiplier 1 --move_penalty 0`` are one proxy, survival)."""
        proxy = riverraid.proxy_from_flags(options)  # None: each proxy flag stays None
        filled = {} if proxy is None else dataclasses.asdict(proxy)
        return super().compared_options(options) | filled

    def evaluation_figures(self, settings: EnvSettings, trained_flags: Mapping) -> dict:
        """The reward proxy evaluated with and the one trained with (defaults filled in;
        {} for the game score)."""
        evaluated_with, trained_with = proxies_played_and_trained(settings, trained_flags)
        return {"reward_proxy": evaluated_with, "trained_with_reward_proxy": trained_with}


def proxies_played_and_trained(settings: EnvSettings, trained_flags: Mapping) -> tuple[dict, dict]:
    """The reward proxy of ``settings`` and of ``trained_flags``, each as its settings with
    the defaults filled in ({} for the game score)."""
    return tuple(
        {} if proxy is None else dataclasses.asdict(proxy)
        for proxy in (proxy_of(settings), riverraid.proxy_from_flags(trained_flags))
    )

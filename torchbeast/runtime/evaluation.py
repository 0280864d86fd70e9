"""Test and eval modes: a trained model plays whole games greedily, in every runtime.

``--mode test`` logs each episode's return. ``--mode eval`` also measures what reward
misspecification studies compare (the proxy return the agent was trained on, the game's
true return, the true move measure, per episode and per step), prints mean ± std, and
writes the figures to ``savedir/xpid/eval.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Sequence

import numpy as np
import torch

from torchbeast import envs
from torchbeast.config.settings import model_settings
from torchbeast.core import checkpoint
from torchbeast.core.models import create_model, model_config
from torchbeast.envs import riverraid
from torchbeast.runtime.console import setup_console_logging

log = logging.getLogger("torchbeast")


@dataclasses.dataclass
class Episode:
    """One whole game; ``proxy_return`` is the reward the agent trains on (the game score
    when no proxy is on)."""

    proxy_return: float
    true_return: float
    true_move: float
    length: int

    def figures(self) -> dict[str, float]:
        return {
            "proxy_return": self.proxy_return,
            "true_return": self.true_return,
            "true_move": self.true_move,
            "proxy_return_per_step": self.proxy_return / self.length,
            "true_return_per_step": self.true_return / self.length,
            "episode_length": float(self.length),
        }


def load_trained(flags: argparse.Namespace) -> tuple[dict, str]:
    """The run's checkpoint and its path; ``flags.env`` defaults to the run's env."""
    path = os.path.join(flags.savedir, flags.xpid, "model.tar")
    state = checkpoint.load(path)
    if flags.env is None:
        if "env" not in state:
            raise checkpoint.CheckpointError(f"{path} is not a torchbeast checkpoint (no env)")
        flags.env = state["env"]
    return state, path


def checkpoint_model_config(
    flags: argparse.Namespace, observation_shape: Sequence[int], state: dict, path: str
) -> dict:
    """The checkpoint's model, so that test and eval commands need not repeat the model
    flags; a model flag that is given must match it."""
    config = model_config(model_settings(flags), observation_shape)
    saved = state.get("model_config", {})
    if flags.hidden_size is None and "hidden_size" in saved:
        config["hidden_size"] = saved["hidden_size"]
    if flags.num_layers is None and "num_layers" in saved:
        config["num_layers"] = saved["num_layers"]
    if not flags.use_lstm and "use_lstm" in saved:
        config["use_lstm"] = saved["use_lstm"]
    if flags.torso is None and not flags.use_resnet and "kind" in saved:
        config["kind"] = saved["kind"]
    checkpoint.check_compatible(state, flags.env, config, path)
    return config


def play(flags: argparse.Namespace, state: dict, path: str, render: bool = False) -> list[Episode]:
    """Plays ``flags.num_episodes`` whole games greedily with the checkpoint's model."""
    env = envs.create_env(flags, num_envs=1, render=render)
    try:
        spec = env.spec
        config = checkpoint_model_config(flags, spec.observation_shape, state, path)
        model = create_model(config, spec.observation_shape, spec.num_actions)
        model.load_state_dict(state["model_state_dict"])
        model.eval()  # greedy actions
        episodes: list[Episode] = []
        env_output = {k: torch.from_numpy(v) for k, v in env.reset(seed=flags.seed).items()}
        core_state = model.initial_state(1)
        while len(episodes) < flags.num_episodes:
            with torch.inference_mode():
                inputs = {k: v.unsqueeze(0) for k, v in env_output.items()}
                outputs, core_state = model(inputs, core_state)
            step = env.step(outputs["action"][0].numpy())
            env_output = {k: torch.from_numpy(v) for k, v in step.items()}
            if step["episode_end"][0]:
                episodes.append(
                    Episode(
                        proxy_return=float(step["episode_return"][0]),
                        true_return=float(step["episode_true_return"][0]),
                        true_move=float(step["episode_true_move"][0]),
                        length=int(step["episode_step"][0]),
                    )
                )
                log.info(
                    "Episode %d ended after %d steps. Return: %.1f",
                    len(episodes),
                    episodes[-1].length,
                    episodes[-1].proxy_return,
                )
        return episodes
    finally:
        env.close()


def test(flags: argparse.Namespace, render: bool = False) -> list[float]:
    """--mode test: plays ``num_episodes`` whole games greedily and logs their returns."""
    setup_console_logging()
    state, path = load_trained(flags)
    returns = [episode.proxy_return for episode in play(flags, state, path, render)]
    log.info("Average returns over %i episodes: %.1f", len(returns), np.mean(returns))
    return returns


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


def proxy_flags(flags: argparse.Namespace | dict) -> dict[str, float]:
    """The proxy flags as the run uses them (defaults filled in), {} for the game score."""
    values = vars(flags) if isinstance(flags, argparse.Namespace) else flags
    proxy = riverraid.proxy_from_flags(argparse.Namespace(**values))
    return {} if proxy is None else dataclasses.asdict(proxy)


def evaluate(flags: argparse.Namespace) -> dict:
    """--mode eval: plays greedily, prints mean ± std of each figure, writes eval.json."""
    setup_console_logging()
    state, path = load_trained(flags)
    trained_with = proxy_flags(state.get("flags", {}))
    evaluated_with = proxy_flags(flags)
    if trained_with != evaluated_with:
        log.warning(
            "Evaluating with reward proxy %s, but %s was trained with %s.",
            evaluated_with or "none (game score)",
            flags.xpid,
            trained_with or "none (game score)",
        )
    episodes = play(flags, state, path)
    summary = summarize(episodes)
    # The models hold parameters only (no buffers such as batch-norm statistics).
    parameters = sum(tensor.numel() for tensor in state["model_state_dict"].values())
    for name, figure in summary.items():
        log.info("%-22s %10.2f ± %.2f", name, figure["mean"], figure["std"])
    report = {
        "xpid": flags.xpid,
        "env": flags.env,
        "num_episodes": len(episodes),
        "parameters": parameters,
        "reward_proxy": evaluated_with,
        "trained_with_reward_proxy": trained_with,
        **summary,
        "episodes": [episode.figures() for episode in episodes],
    }
    eval_path = os.path.join(flags.savedir, flags.xpid, "eval.json")
    write_json_atomically(eval_path, report)
    log.info("Wrote %s (%d parameters).", eval_path, parameters)
    return report


def write_json_atomically(path: str, value: dict) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(temporary, path)

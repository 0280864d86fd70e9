"""What ends Riverraid's lives, under a random policy or a trained one.

    python docs/analysis/riverraid_lives.py --lives 115
    python docs/analysis/riverraid_lives.py --checkpoint ~/logs/torchbeast/rr_nvna/model.tar
    python docs/analysis/riverraid_lives.py --action DOWNFIRE --lives 40
    python docs/analysis/riverraid_lives.py --checkpoint CKPT --screens crashes.png

Plays one game after another (the survival proxy's env, as training sees it: FIRE after a
lost life) until ``--lives`` lives are lost, and prints how long a life lasted, what the fuel
meter read 60 agent steps before each life was taken (about when the plane crashed: the
game takes the life some 40 steps after the crash), and how often each action was taken.
With ``--checkpoint`` the actions are sampled from the trained policy (as in training), with
``--action`` one action is pressed throughout, otherwise actions are uniformly at random.
``--screens`` saves the screen at each of the first 8 crashes (the step at which the plane
stopped moving, before the game put it back in the middle and took the life). With a
checkpoint trained on the survival proxy it also prints the critic's value in the steps
before each life was taken beside the return that was actually left (a critic that saw the
crash coming would match it). The figures of the README's Riverraid section come from it.
"""

from __future__ import annotations

import argparse
import collections
import os

import numpy as np
import torch
from PIL import Image

from torchbeast import envs
from torchbeast.core import checkpoint
from torchbeast.core.models import create_model
from torchbeast.envs import riverraid
from torchbeast.envs.settings import EnvSettings

STEPS_BEFORE_LOSS = 60
CRASH_SCREENS = 8
MAX_STILL_AFTER_CRASH = 27
BEFORE_LOSS = (120, 90, 60, 45, 30, 15, 1)  # steps before a life is taken


def crash_step(positions: list[int]) -> int:
    """The step of one life (an index into ``positions``, the plane's x at each step) at
    which the plane crashed.

    After a crash the plane stays where it hit for 20 to 27 steps (measured under random
    play), then the game puts it back in the middle and takes the life, at once or some
    20 steps later: the crash is where the last still stretch but one begins, and no more
    than 27 steps before the jump (a plane that flew straight was still before it hit).
    """
    jump = len(positions) - 1
    while jump > 0 and positions[jump - 1] == positions[jump]:
        jump -= 1
    hit = max(jump - 1, 0)
    while hit > max(jump - MAX_STILL_AFTER_CRASH, 0) and positions[hit - 1] == positions[hit]:
        hit -= 1
    return hit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a run's model.tar (default: a random policy)")
    parser.add_argument("--action", help="press this action throughout, e.g. DOWNFIRE")
    parser.add_argument("--lives", type=int, default=100, help="lives to play (default 100)")
    parser.add_argument("--screens", help="save the first crashes' screens to this PNG")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the policy's sampled actions

    settings = EnvSettings(
        "RiverraidNoFrameskip-v4", options={"fuel_multiplier": 1.0, "move_penalty": 0.0}
    )
    env = envs.create_env(settings, num_envs=1)
    ale = env.env.envs[0].unwrapped.ale
    action_names = env.env.envs[0].unwrapped.get_action_meanings()
    model = None
    if args.checkpoint:
        state = checkpoint.load(os.path.expanduser(args.checkpoint))
        spec = env.spec
        model = create_model(state["model_config"], spec.observation_shape, spec.num_actions)
        model.load_state_dict(state["model_state_dict"])
        model.train()  # sample actions, as the actors do
        core_state = model.initial_state(1)
        value_scale = state.get("value_scale", {}).get("scale", 1.0)
        discount = state["flags"]["discounting"]
        trained = riverraid.proxy_from_flags(state["flags"])
        survival = trained == riverraid.RewardProxy()  # +10 per step alive, nothing else
    rng = np.random.default_rng(args.seed)

    env_output = {k: torch.from_numpy(v) for k, v in env.reset(seed=args.seed).items()}
    counts: collections.Counter[str] = collections.Counter()
    life_lengths, fuel_before_loss, fuel_trace = [], [], []
    positions, screens, crashes, values = [], [], [], []
    critic, left = collections.defaultdict(list), collections.defaultdict(list)
    while len(life_lengths) < args.lives:
        if args.action:
            action = np.array([action_names.index(args.action)])
        elif model is None:
            action = rng.integers(len(action_names), size=1)
        else:
            with torch.inference_mode():
                inputs = {k: v.unsqueeze(0) for k, v in env_output.items()}
                outputs, core_state = model(inputs, core_state)
            action = outputs["action"][0].numpy()
            values.append(float(outputs["baseline"].flatten()[0]) * value_scale)
        counts[action_names[int(action[0])]] += 1
        step = env.step(action)
        env_output = {k: torch.from_numpy(v) for k, v in step.items()}
        fuel_trace.append(int(ale.getRAM()[riverraid.FUEL_METER_HIGH]))
        positions.append(int(ale.getRAM()[riverraid.PLAYER_X]))
        if args.screens:
            screens = screens[-STEPS_BEFORE_LOSS:] + [ale.getScreenRGB()]
        if step["done"][0]:
            life_lengths.append(len(fuel_trace))
            if len(fuel_trace) > STEPS_BEFORE_LOSS:
                fuel_before_loss.append(fuel_trace[-STEPS_BEFORE_LOSS])
            if args.screens and len(crashes) < CRASH_SCREENS:
                crashes.append(screens[max(crash_step(positions) - len(positions), -len(screens))])
            for steps in BEFORE_LOSS if values and survival else ():
                if steps <= len(values):
                    critic[steps].append(values[-steps])
                    alive = steps - 1  # the step that takes the life pays 0
                    left[steps].append((1 - discount**alive) / (1 - discount))
            fuel_trace, positions, values = [], [], []
    env.close()
    if crashes:
        Image.fromarray(np.concatenate(crashes, axis=1)).save(args.screens)

    print(f"lives {len(life_lengths)}: {np.mean(life_lengths):.0f} steps on average")
    fuel = np.array(fuel_before_loss)
    print(
        f"fuel meter {STEPS_BEFORE_LOSS} steps before a life was taken: "
        f"min {fuel.min()}, median {np.median(fuel):.0f}, max {fuel.max()} (full: 255)"
    )
    total = sum(counts.values())
    sideways = sum(n for name, n in counts.items() if "LEFT" in name or "RIGHT" in name)
    print(f"sideways actions (LEFT or RIGHT in the name): {sideways / total:.3f}")
    print(" ".join(f"{name} {n / total:.3f}" for name, n in counts.most_common()))
    if critic:
        print("steps before a life was taken: critic's value / discounted return left")
        print("  ".join(f"{k}: {np.mean(critic[k]):.1f}/{np.mean(left[k]):.1f}" for k in critic))


if __name__ == "__main__":
    main()

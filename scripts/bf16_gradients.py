"""How far a bf16 torso moves an update from fp32's, beside how far the batch alone moves it.

Plays real rollouts ([T+1, B] as the recipe learns from) with a model (a checkpoint's, or a
fresh one), then takes the gradient of the real IMPALA loss (V-trace, clipped surrogate,
baseline, entropy) on each batch twice: with the torso in fp32 and in bf16, from the same
weights. Per weight tensor it prints the mean relative distance of the bf16 gradient from
the fp32 one, the same distance between two consecutive batches' fp32 gradients (how
noisy the gradient is anyway), and whether bf16's error points the same way from batch to
batch (a bias would add up over updates where noise averages out).

    python scripts/bf16_gradients.py
    python scripts/bf16_gradients.py --checkpoint ~/logs/torchbeast/latest/model.tar

Needs a CPU that runs bf16 (natively fast with AVX512-BF16 or AMX; emulated elsewhere).
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import numpy as np
import torch
import torch.nn.functional as F

from torchbeast import envs
from torchbeast.core import checkpoint
from torchbeast.core.loss_terms import loss_terms
from torchbeast.core.models import Agent, create_model, model_config
from torchbeast.core.settings import LearnerSettings, ModelSettings
from torchbeast.core.value_scale import ValueScale

OBSERVATION_SHAPE = (4, 84, 84)


def play(model: Agent, env_id: str, batches: int, warmup: int, seed: int) -> list[dict]:
    """``batches`` consecutive [T+1, B] batches of ``model``'s own play, after ``warmup``
    steps; T and B are the recipe's (``LearnerSettings``' defaults)."""
    defaults = LearnerSettings()
    T, B = defaults.unroll_length, defaults.batch_size
    env = envs.create_env(env_id, num_envs=B)

    def tensors(output: dict) -> dict[str, torch.Tensor]:
        return {key: torch.as_tensor(np.asarray(value)) for key, value in output.items()}

    observed = tensors(env.reset(seed=seed))
    last_action = torch.zeros(B, dtype=torch.int64)
    steps = []
    for _ in range(warmup + (T + 1) * batches):
        inputs = {
            "frame": observed["frame"][None],
            "reward": observed["reward"][None].float(),
            "done": observed["done"][None].bool(),
            "last_action": last_action[None],
        }
        with torch.no_grad():
            outputs, _ = model(inputs)
        steps.append({key: value[0] for key, value in inputs.items()})
        steps[-1].update({key: outputs[key][0] for key in ("action", "policy_logits")})
        last_action = outputs["action"][0]
        observed = tensors(env.step(last_action.numpy()))
    steps = steps[warmup:]
    rollouts = [steps[i : i + T + 1] for i in range(0, len(steps), T + 1)]
    return [
        {key: torch.stack([s[key] for s in rollout]) for key in steps[0]} for rollout in rollouts
    ]


def gradients(model: Agent, batch: dict) -> dict[str, torch.Tensor]:
    """The weights' gradients of the recipe's total loss on ``batch``."""
    model.zero_grad()
    terms = loss_terms(LearnerSettings(), model, ValueScale(False), batch, (), None)
    terms.total_loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters()}


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b|."""
    return ((a - b).norm() / b.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a run's model.tar (AtariNet); default: fresh")
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=300, help="env steps before the batches")
    parser.add_argument("--seed", type=int, default=1)
    flags = parser.parse_args()

    torch.manual_seed(flags.seed)
    torch.set_num_threads(1)
    env_spec = envs.env_spec(flags.env)
    config = model_config(ModelSettings(), env_spec.observation_shape)

    def agent(dtype: torch.dtype) -> Agent:
        return create_model(
            config, env_spec.observation_shape, env_spec.num_actions, "orthogonal", dtype
        )

    fp32, bf16 = agent(torch.float32), agent(torch.bfloat16)
    if flags.checkpoint:
        fp32.load_state_dict(checkpoint.load(flags.checkpoint)["model_state_dict"])
    bf16.load_state_dict(fp32.state_dict())
    fp32.train()  # its actions are sampled
    batches = play(fp32, flags.env, flags.batches, flags.warmup, flags.seed)
    exact = [gradients(fp32, batch) for batch in batches]
    lowered = [gradients(bf16, batch) for batch in batches]

    def whole(grads: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([grad.flatten() for grad in grads.values()])

    rows = [(name, lambda grads, name=name: grads[name]) for name in exact[0] if "weight" in name]
    print(f"{'weights':22} {'bf16 vs fp32':>13} {'batch vs batch':>15} {'bias (cos)':>11}")
    for name, pick in [*rows, ("all", whole)]:
        error = statistics.mean(
            distance(pick(a), pick(b)) for a, b in zip(lowered, exact, strict=True)
        )
        noise = statistics.mean(distance(pick(a), pick(b)) for a, b in itertools.pairwise(exact))
        errors = [pick(a) - pick(b) for a, b in zip(lowered, exact, strict=True)]
        bias = statistics.mean(
            F.cosine_similarity(a.flatten(), b.flatten(), 0).item()
            for a, b in itertools.pairwise(errors)
        )
        print(f"{name:22} {error:13.3f} {noise:15.3f} {bias:11.2f}")


if __name__ == "__main__":
    main()

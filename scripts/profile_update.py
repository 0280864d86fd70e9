"""Where one learner update's time goes, alone in its process: wall milliseconds per update
for a few batch sizes, then a profile of the largest costs (CPU and device time by op) and
how many kernels an update launches. Beside the scaling table (learner busy ~100% on an
H200 at 23-37 ms per update, the GPU 11-17% busy), it tells whether the update itself is
that slow, or the rest of the learner process (batching, the dispatcher, central inference,
publishing weights) slows it.

    python scripts/profile_update.py                     # CUDA (each update one graph)
    python scripts/profile_update.py --cuda_graphs off   # CUDA, eager updates
    python scripts/profile_update.py --device cpu --batch_sizes 16 64 --updates 10

Any training flag (``--env``, ``--unroll_length``, ``--epochs``, ...) shapes the update as it
would in training; frames and actions are random.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from torchbeast import envs
from torchbeast.config.flags import parse_flags
from torchbeast.config.settings import build_settings
from torchbeast.core import rollout
from torchbeast.core.learner import Learner
from torchbeast.core.models import create_model, model_config, torso_splits_rows
from torchbeast.core.precision import bf16_on_cpu, compute_dtype
from torchbeast.core.update_graph import UpdateGraph
from torchbeast.runtime import layout
from torchbeast.runtime.mono_actor import SharedWeights


def random_batch(env_spec, unroll_length: int, batch_size: int, device) -> dict:
    """[T+1, B, ...] tensors of the rollout spec, random where it matters to the update."""
    batch = {}
    for name, tensor in rollout.allocate(env_spec, unroll_length, batch_size).items():
        tensor = tensor.transpose(0, 1)
        if name == "frame":
            tensor = torch.randint_like(tensor, 0, 256)
        elif name in ("action", "last_action"):
            tensor = torch.randint_like(tensor, 0, env_spec.num_actions)
        elif tensor.is_floating_point():
            tensor = torch.randn_like(tensor) * 0.1
        batch[name] = tensor.contiguous().to(device)
    return batch


def time_updates(learner: Learner, batch: dict, updates: int, device) -> list[float]:
    times = []
    for _ in range(updates):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        learner.learn(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - started))
    return times


def main(argv: list[str]) -> None:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    own.add_argument("--batch_sizes", type=int, nargs="+", default=[16, 64, 128])
    own.add_argument("--updates", type=int, default=30)
    mine, rest = own.parse_known_args(argv)
    device = torch.device(mine.device)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads per op")
    for batch_size in mine.batch_sizes:
        argv = ["--env", "PongNoFrameskip-v4", *rest, "--batch_size", str(batch_size)]
        settings = build_settings(parse_flags(argv))
        env_spec = envs.env_spec(settings.env)
        config = model_config(settings.model, env_spec.observation_shape)
        dtype = compute_dtype(settings.model.precision, device, config["kind"])
        # The threads a run's learner takes on this machine (core.torso_chunks on a CPU).
        splittable = device.type == "cpu" and torso_splits_rows(config)
        split = layout.torso_threads(layout.learner_cores()[0], splittable)
        print(layout.limit_learner_threads(1, bf16_on_cpu(dtype, device), split))
        model = create_model(
            config,
            env_spec.observation_shape,
            env_spec.num_actions,
            compute_dtype=dtype,
            torso_threads=split,
        )
        learner = Learner(settings.learner, model.to(device))
        if settings.learner.cuda_graphs == "auto" and device.type == "cuda":
            learner.update_graph = UpdateGraph(learner)
        batch = random_batch(env_spec, settings.learner.unroll_length, batch_size, device)
        time_updates(learner, batch, 5, device)  # warm-up: allocations, kernels, handles
        times = time_updates(learner, batch, mine.updates, device)
        weights = SharedWeights(model)
        started = time.perf_counter()
        for _ in range(10):
            weights.publish(model)
        publish_ms = 1e3 * (time.perf_counter() - started) / 10
        steps = batch_size * settings.learner.unroll_length
        median = statistics.median(times)
        print(
            f"B={batch_size}, T={settings.learner.unroll_length}, "
            f"{settings.learner.epochs} pass(es): update {median:.2f} ms median "
            f"(min {min(times):.2f}, max {max(times):.2f}) -> at most "
            f"{1e3 * steps / median:,.0f} SPS; publishing to actors {publish_ms:.2f} ms"
        )
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        time_updates(learner, batch, 5, device)
    averages = profiler.key_averages()
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch")
    launches = sum(e.count for e in averages if e.key in names)
    print(f"Last batch size, 5 updates profiled: {launches / 5:.0f} kernel launches per update")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=25))
    if device.type == "cuda":
        print(averages.table(sort_by="self_cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main(sys.argv[1:])

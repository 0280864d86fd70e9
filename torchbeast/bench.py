"""Benchmark: steady-state SPS of a runtime and the CPU cost of each stage, in one run.

    python -m torchbeast.bench                      # MonoBeast, Pong, AtariNet, B=4, T=80
    python -m torchbeast.bench --runtime poly       # PolyBeast over Unix sockets, same run
    python -m torchbeast.bench --runtime ray        # RayBeast on a local Ray, same run
    python -m torchbeast.bench --env CartPole-v1    # small-model figure

Takes every training flag. After ``--warmup_steps`` it measures ``--bench_steps`` agent
steps: wall-clock SPS, and CPU milliseconds per agent step in each stage. MonoBeast and
RayBeast: stepping environments, actor inference, elsewhere in actors, and the learner
process (batching, learning, publishing weights; for RayBeast the Ray driver, without
Ray's own daemons). PolyBeast: the env server processes (envs and gRPC) and the learner
process (gRPC, batched inference, learning). The stage costs imply a ceiling: cores /
total CPU per step.

The same layout for every runtime: MonoBeast runs ``num_actors`` processes of
``envs_per_actor`` envs, RayBeast as many Ray actors; PolyBeast runs ``num_actors`` env
servers, each streaming ``envs_per_actor`` envs to the learner, which batches inference
over all of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from torchbeast import raybeast
from torchbeast.cli import report_errors
from torchbeast.core.filewriter import setup_console_logging
from torchbeast.core.flags import (
    nonnegative_int,
    parse_flags,
    positive_int,
    resolve_num_buffers,
)
from torchbeast.runtime.mono import MonoTrainer
from torchbeast.runtime.poly import env_side
from torchbeast.runtime.poly.actor_pool import PolyActorPool
from torchbeast.runtime.poly.trainer import (
    PolyTrainer,
    env_flags,
    finish_learner_flags,
    learner_spec,
    limit_intra_op_threads,
    make_learner_parser,
)
from torchbeast.runtime.training import Trainer


def make_bench_parser() -> argparse.ArgumentParser:
    parser = make_learner_parser("Benchmark a runtime: steady-state SPS and per-stage CPU costs.")
    parser.set_defaults(
        env="PongNoFrameskip-v4",
        batch_size=4,
        unroll_length=80,
        num_actors=2,
        envs_per_actor=8,
        total_steps=10**12,
    )
    parser.add_argument("--runtime", default="mono", choices=["mono", "poly", "ray"])
    parser.add_argument("--warmup_steps", type=nonnegative_int, default=20_000)
    parser.add_argument("--bench_steps", type=positive_int, default=60_000)
    return parser


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of other processes, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def stage_totals(trainer: Trainer, env_pids: list[int]) -> np.ndarray:
    """Cumulative CPU seconds per stage and the actors' agent steps, for either runtime."""
    if isinstance(trainer, PolyTrainer):
        return np.array([process_cpu_seconds(env_pids), 0.0, 0.0])
    env_cpu, inference_cpu, actor_cpu, actor_steps = trainer.pool.timing_totals()
    return np.array([env_cpu, inference_cpu, actor_cpu - env_cpu - inference_cpu])


def measure(
    trainer: Trainer, env_pids: list[int], warmup_steps: int, bench_steps: int, result: dict
) -> None:
    """Runs beside training: samples the window after warm-up, then stops the run."""
    learner = trainer.learner
    while (
        trainer.pool is None or learner.step < warmup_steps
    ) and not trainer.stop_requested.is_set():
        time.sleep(0.05)
    if trainer.pool is None:
        return
    stages_before = stage_totals(trainer, env_pids)
    start_time, start_step, start_cpu = time.monotonic(), learner.step, time.process_time()
    while learner.step < start_step + bench_steps and not trainer.stop_requested.is_set():
        time.sleep(0.05)
    elapsed = time.monotonic() - start_time
    learner_cpu = time.process_time() - start_cpu
    steps = learner.step - start_step
    if steps == 0:
        return
    env_ms, inference_ms, actor_other_ms = (
        1e3 * (stage_totals(trainer, env_pids) - stages_before) / steps
    )
    result.update(
        sps=steps / elapsed,
        steps=steps,
        seconds=elapsed,
        env_ms=env_ms,
        inference_ms=inference_ms,
        actor_other_ms=actor_other_ms,
        learner_ms=1e3 * learner_cpu / steps,
    )
    trainer.stop_requested.set()


def run_mono(flags: argparse.Namespace, start_measuring) -> Trainer:
    trainer = MonoTrainer(flags)
    start_measuring(trainer, [])
    trainer.train()
    return trainer


def run_poly(flags: argparse.Namespace, start_measuring, folder: str) -> Trainer:
    """One env server per actor on Unix sockets, streaming ``envs_per_actor`` envs each."""
    flags.num_servers = flags.num_actors
    flags.pipes_basename = f"unix:{folder}/env"
    finish_learner_flags(flags)
    limit_intra_op_threads(flags)
    server_flags = env_flags(flags)
    processes = env_side.start_processes(server_flags)
    pool = PolyActorPool(flags, spec=learner_spec(flags))
    try:
        pool.listen()
        trainer = PolyTrainer(flags, pool)
        start_measuring(trainer, [p.pid for p in processes])
        trainer.train()
    finally:
        pool.stop()
        env_side.stop_processes(processes)
    return trainer


def run_ray(flags: argparse.Namespace, start_measuring) -> Trainer:
    """A local Ray instance with ``num_actors`` Ray actors of ``envs_per_actor`` envs."""
    flags.ray_address = None
    raybeast.prepare_environment(flags)
    from torchbeast.runtime import ray_actors  # imports Ray: after prepare_environment

    connected = ray_actors.connect(flags)
    try:
        trainer = ray_actors.RayTrainer(flags, connected)
        start_measuring(trainer, [])
        trainer.train()
    finally:
        ray_actors.ray.shutdown()
    return trainer


def main(argv: list[str] | None = None) -> int:
    parser = make_bench_parser()
    flags = parse_flags(argv, parser)
    if flags.runtime == "mono":  # the one runtime with shared-memory buffers
        resolve_num_buffers(flags, parser)
    flags.disable_checkpoint = True
    setup_console_logging()
    result: dict = {}
    trainer: Trainer | None = None
    threads: list[threading.Thread] = []

    def start_measuring(started: Trainer, env_pids: list[int]) -> None:
        nonlocal trainer
        trainer = started
        thread = threading.Thread(
            target=measure, args=(started, env_pids, flags.warmup_steps, flags.bench_steps, result)
        )
        threads.append(thread)
        thread.start()

    def run_benchmark() -> None:
        with tempfile.TemporaryDirectory() as folder:
            flags.savedir, flags.xpid = folder, "bench"
            try:
                if flags.runtime == "poly":
                    run_poly(flags, start_measuring, folder)
                elif flags.runtime == "ray":
                    run_ray(flags, start_measuring)
                else:
                    run_mono(flags, start_measuring)
            finally:
                if trainer is not None:
                    trainer.stop_requested.set()
                for thread in threads:
                    thread.join()

    status = report_errors(run_benchmark)
    if status:
        return status
    if not result:
        print("error: the run ended before the measurement window: raise --total_steps")
        return 1
    print_result(flags, trainer, result)
    return 0


def print_result(flags: argparse.Namespace, trainer: Trainer, result: dict) -> None:
    cores = len(os.sched_getaffinity(0))
    total_ms = (
        result["env_ms"] + result["inference_ms"] + result["actor_other_ms"] + result["learner_ms"]
    )
    print()
    if flags.runtime == "poly":
        layout = (
            f"{flags.num_servers} env servers x 1 stream x {flags.envs_per_actor} envs "
            "(Unix sockets)"
        )
        stages = f"env servers {result['env_ms']:.3f}, learner process {result['learner_ms']:.3f}"
    else:
        layout = f"{flags.num_actors} actors x {flags.envs_per_actor} envs"
        stages = (
            f"env {result['env_ms']:.3f}, inference {result['inference_ms']:.3f}, actor other "
            f"{result['actor_other_ms']:.3f}, learner {result['learner_ms']:.3f}"
        )
    name = {"mono": "MonoBeast", "poly": "PolyBeast", "ray": "RayBeast"}[flags.runtime]
    print(
        f"{name} benchmark: {flags.env}, {trainer.config['kind']} model, "
        f"B={flags.batch_size}, T={flags.unroll_length}, {layout}, "
        f"{flags.num_learner_threads} learner threads, learner on {trainer.device}, "
        f"{cores} cores, torch {torch.__version__}"
    )
    print(
        f"steady-state SPS: {result['sps']:.1f}  ({result['steps']} steps in "
        f"{result['seconds']:.1f} s after {flags.warmup_steps} warm-up steps)"
    )
    print(f"CPU ms per agent step: {stages}, total {total_ms:.3f}")
    print(f"ceiling implied by the stage costs on {cores} cores: {1e3 * cores / total_ms:.0f} SPS")
    batcher = getattr(trainer.pool, "batcher", None)
    if batcher is not None:
        sizes = batcher.batch_sizes
        mean = sum(size * count for size, count in sizes.items()) / max(1, sum(sizes.values()))
        print(f"mean inference batch: {mean:.1f} streams")


if __name__ == "__main__":
    sys.exit(main())

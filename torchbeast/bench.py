"""Benchmark: steady-state SPS of MonoBeast and the CPU cost of each stage, in one run.

    python -m torchbeast.bench                      # Pong, AtariNet, B=4, T=80
    python -m torchbeast.bench --env CartPole-v1    # small-model figure

Takes every training flag. After ``--warmup_steps`` it measures ``--bench_steps`` agent
steps: wall-clock SPS, and CPU milliseconds per agent step spent stepping environments,
in actor inference, elsewhere in actors, and in the learner process (batching, learning,
publishing weights). The stage costs imply a ceiling: cores / total CPU per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import torch

from torchbeast.cli import report_errors
from torchbeast.core.filewriter import setup_console_logging
from torchbeast.core.flags import make_parser, nonnegative_int, parse_flags, positive_int
from torchbeast.runtime.mono import MonoTrainer
from torchbeast.runtime.training import Trainer


def make_bench_parser():
    parser = make_parser("Benchmark MonoBeast: steady-state SPS and per-stage CPU costs.")
    parser.set_defaults(
        batch_size=4, unroll_length=80, num_actors=2, envs_per_actor=8, total_steps=10**12
    )
    parser.add_argument("--warmup_steps", type=nonnegative_int, default=20_000)
    parser.add_argument("--bench_steps", type=positive_int, default=60_000)
    return parser


def measure(trainer: Trainer, warmup_steps: int, bench_steps: int, result: dict) -> None:
    """Runs beside training: samples the window after warm-up, then stops the run."""
    learner = trainer.learner
    while (
        trainer.pool is None or learner.step < warmup_steps
    ) and not trainer.stop_requested.is_set():
        time.sleep(0.05)
    pool = trainer.pool
    if pool is None:
        return
    timings_before = pool.timing_totals()
    start_time, start_step, start_cpu = time.monotonic(), learner.step, time.process_time()
    while learner.step < start_step + bench_steps and not trainer.stop_requested.is_set():
        time.sleep(0.05)
    elapsed = time.monotonic() - start_time
    learner_cpu = time.process_time() - start_cpu
    steps = learner.step - start_step
    env_cpu, inference_cpu, actor_cpu, actor_steps = pool.timing_totals() - timings_before
    if steps == 0 or actor_steps == 0:
        return
    result.update(
        sps=steps / elapsed,
        steps=steps,
        seconds=elapsed,
        env_ms=1e3 * env_cpu / actor_steps,
        inference_ms=1e3 * inference_cpu / actor_steps,
        actor_other_ms=1e3 * (actor_cpu - env_cpu - inference_cpu) / actor_steps,
        learner_ms=1e3 * learner_cpu / steps,
    )
    trainer.stop_requested.set()


def main(argv: list[str] | None = None) -> int:
    parser = make_bench_parser()
    flags = parse_flags(argv, parser)
    flags.disable_checkpoint = True
    setup_console_logging()
    result: dict = {}
    trainer: Trainer | None = None

    def run_benchmark() -> None:
        nonlocal trainer
        with tempfile.TemporaryDirectory() as savedir:
            flags.savedir, flags.xpid = savedir, "bench"
            trainer = MonoTrainer(flags)
            thread = threading.Thread(
                target=measure, args=(trainer, flags.warmup_steps, flags.bench_steps, result)
            )
            thread.start()
            try:
                trainer.train()
            finally:
                trainer.stop_requested.set()
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
    print(
        f"MonoBeast benchmark: {flags.env}, {trainer.config['kind']} model, "
        f"B={flags.batch_size}, T={flags.unroll_length}, {flags.num_actors} actors x "
        f"{flags.envs_per_actor} envs, {flags.num_learner_threads} learner threads, "
        f"learner on {trainer.device}, {cores} cores, torch {torch.__version__}"
    )
    print(
        f"steady-state SPS: {result['sps']:.1f}  ({result['steps']} steps in "
        f"{result['seconds']:.1f} s after {flags.warmup_steps} warm-up steps)"
    )
    print(
        f"CPU ms per agent step: env {result['env_ms']:.3f}, inference "
        f"{result['inference_ms']:.3f}, actor other {result['actor_other_ms']:.3f}, "
        f"learner {result['learner_ms']:.3f}, total {total_ms:.3f}"
    )
    print(f"ceiling implied by the stage costs on {cores} cores: {1e3 * cores / total_ms:.0f} SPS")


if __name__ == "__main__":
    sys.exit(main())

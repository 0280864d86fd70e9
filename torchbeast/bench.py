"""Benchmark: steady-state SPS of a runtime and the CPU cost of each stage, in one run.

    python -m torchbeast.bench                      # MonoBeast, Pong, AtariNet, B=4, T=80
    python -m torchbeast.bench --runtime poly       # PolyBeast over Unix sockets, same run
    python -m torchbeast.bench --runtime ray        # RayBeast on a local Ray, same run
    python -m torchbeast.bench --env CartPole-v1    # small-model figure

Takes every training flag; its defaults are the original's batch shape and one gradient
step per batch (``--epochs 1 --ppo_clip 0``), so that its figure measures the data path
and compares with the original's. After ``--warmup_steps`` it measures ``--bench_steps``
agent steps: wall-clock SPS, and CPU milliseconds per agent step in each stage.
MonoBeast and RayBeast: stepping environments, actor inference, elsewhere in actors, and
the learner process (batching, learning, publishing weights; for RayBeast the Ray
driver, without Ray's own daemons); with ``--central_inference``, the inference process
too. PolyBeast: the env server processes (envs and gRPC) and the learner process (gRPC,
batched inference, learning). The stage costs imply a ceiling: cores / total CPU per
step.

The same layout for every runtime: MonoBeast runs ``num_actors`` processes of
``envs_per_actor`` envs, RayBeast as many Ray actors; PolyBeast runs ``num_actors`` env
servers, each streaming ``envs_per_actor`` envs to the learner, which batches inference
over all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import torch

from torchbeast.cli import report_errors
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_bench_parser
from torchbeast.config.settings import build_settings
from torchbeast.core.errors import unwritable
from torchbeast.core.precision import dtype_name
from torchbeast.entry import work_begins
from torchbeast.runtime.console import setup_console_logging
from torchbeast.runtime.mono_inference import PASS_PARTS
from torchbeast.runtime.pool import Pool
from torchbeast.runtime.registry import RUNTIMES
from torchbeast.runtime.supervision import sigterm_handled
from torchbeast.runtime.training import Trainer, TrainingError


class Window:
    """A measurement window: what the run had counted when it opened (CPU seconds by
    stage, the learner's updating time, central inference's and the actors' clocks), and
    the figures of the steps since, at its close."""

    def __init__(self, trainer: Trainer, step: int):
        self.trainer = trainer
        self.stages = trainer.stage_totals()  # CPU seconds by stage
        self.time, self.step, self.cpu = time.monotonic(), step, time.process_time()
        self.updating = trainer.update_seconds()
        self.inference = central_inference_totals(trainer)
        self.walls = trainer.pool.actor_wall_seconds()
        self.gpu = GpuSampler(trainer.device)

    def figures(self, step: int) -> dict:
        """SPS, CPU ms per agent step by stage, how busy the learner (and the GPU, and
        central inference) was, where the actors' time went and what bounds the run, over
        the steps up to ``step``; {} for none."""
        trainer, steps = self.trainer, step - self.step
        elapsed = time.monotonic() - self.time
        if steps <= 0:
            return {}
        stages = {
            name: 1e3 * (seconds - self.stages[name]) / steps
            for name, seconds in trainer.stage_totals().items()
        }  # CPU ms per agent step
        stages["learner process"] = 1e3 * (time.process_time() - self.cpu) / steps
        result = dict(
            sps=steps / elapsed,
            steps=steps,
            seconds=elapsed,
            stages=stages,
            learner_busy=(trainer.update_seconds() - self.updating) / elapsed,
            gpu_utilization=self.gpu.mean(),
            cores=len(os.sched_getaffinity(0)),
        )
        if self.inference is not None:
            result["inference"] = central_inference_figures(
                self.inference, central_inference_totals(trainer), elapsed
            )
        if self.walls:
            result["actor_time"] = actor_time_shares(self.walls, trainer.pool.actor_wall_seconds())
        return result


def measure(trainer: Trainer, warmup_steps: int, bench_steps: int, result: dict) -> None:
    """Runs beside training: samples the window after warm-up, then stops the run."""
    learner = trainer.learner
    while (
        trainer.pool is None or learner.step < warmup_steps
    ) and not trainer.stop_requested.is_set():
        time.sleep(0.05)
    if trainer.pool is None:
        return
    window = Window(trainer, learner.step)
    while learner.step < window.step + bench_steps and not trainer.stop_requested.is_set():
        window.gpu.sample()
        time.sleep(0.05)
    result.update(window.figures(learner.step))
    if result:
        result["bound"] = bound_by(result)
    trainer.stop_requested.set()


class BatchDropper:
    """Takes the pool's batches as they fill and drops them, counting their steps."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.steps = 0

    def take_until(self, steps: int) -> bool:
        """Takes batches until ``steps`` steps in all; False when the pool stopped (a
        signal), and the pool's error as a ``TrainingError`` when an actor failed for good."""
        while self.steps < steps:
            got = self.pool.get_batch()
            if got is None:
                if self.pool.error is not None:
                    raise TrainingError(self.pool.error)
                return False
            done = got[0]["done"]  # [T+1, B]
            self.steps += (done.shape[0] - 1) * done.shape[1]
        return True


def measure_sampling(trainer: Trainer, warmup_steps: int, bench_steps: int, result: dict) -> None:
    """``--sampling_only``: the actors (and central inference) alone. Each batch is taken
    as soon as it fills and dropped, with no update and no new weights, so the SPS is the
    most the sampling side gives this layout, whatever the learner costs. SIGTERM stops it
    as it stops training; a pool that fails says why in one line."""
    pool = trainer.pool = trainer.create_pool()
    dropper = BatchDropper(pool)
    with sigterm_handled(trainer.request_stop):
        try:
            pool.start()
            if not dropper.take_until(warmup_steps):
                return
            window = Window(trainer, dropper.steps)
            while dropper.steps < window.step + bench_steps:
                window.gpu.sample()
                if not dropper.take_until(dropper.steps + 1):  # one batch
                    return
            result.update(window.figures(dropper.steps), sampling_only=True)
            result["bound"] = bound_by(result)
        finally:
            pool.stop()


def central_inference_totals(trainer: Trainer) -> dict[str, float] | None:
    """The central inference server's seconds by part so far, with its passes and the
    envs they served; None where actors run their own inference."""
    seconds = trainer.pool.inference_seconds()
    if not seconds:
        return None
    sizes = trainer.pool.inference_batch_sizes()
    passes, envs = sum(sizes.values()), sum(size * count for size, count in sizes.items())
    return seconds | dict(passes=passes, envs=envs)


def actor_time_shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The share of the actors' wall-clock time in the window that went to each part of
    ``pool.ACTOR_TIME_PARTS``, and to the rest (writing rollouts, handing them over)."""
    delta = {name: after[name] - before[name] for name in after}
    whole = delta.pop("in all")
    if whole <= 0:
        return {}
    shares = {name: seconds / whole for name, seconds in delta.items()}
    return shares | {"the rest": max(0.0, 1.0 - sum(shares.values()))}


def central_inference_figures(
    before: dict[str, float], after: dict[str, float], elapsed: float
) -> dict:
    """What the central inference server did in the window: busy (the share of the time
    it was not waiting for requests), its CPU in cores, envs per pass, and the
    milliseconds per pass of each part of a pass."""
    delta = {name: after[name] - before[name] for name in after}
    passes = max(1, delta["passes"])
    parts = [name for name in PASS_PARTS if name != "waiting"]
    return dict(
        busy=sum(delta[name] for name in parts) / elapsed,
        cpu_cores=delta["cpu"] / elapsed,
        envs_per_pass=delta["envs"] / passes,
        ms_per_pass={name: 1e3 * delta[name] / passes for name in parts},
    )


class GpuSampler:
    """The GPU's utilisation (percent of time a kernel ran, as ``nvidia-smi`` reports it),
    sampled about once a second; nothing on a CPU learner or without ``nvidia-smi``."""

    def __init__(self, device: torch.device):
        self.enabled = device.type == "cuda" and shutil.which("nvidia-smi") is not None
        self.index = 0
        if self.enabled:
            self.index = torch.cuda.current_device() if device.index is None else device.index
        self.samples: list[float] = []
        self.last = 0.0

    def sample(self) -> None:
        if not self.enabled or time.monotonic() - self.last < 1.0:
            return
        self.last = time.monotonic()
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        try:
            output = subprocess.run(
                [*query, f"--id={self.index}"], capture_output=True, text=True, timeout=5
            ).stdout
            self.samples.append(float(output.strip().splitlines()[0]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            self.enabled = False  # no figure rather than a wrong one

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


# How the learner steps on each batch, as the JSON figures record it.
LEARNER_SHAPE = ("batch_size", "unroll_length", "epochs", "ppo_clip")

# A learner busy this much of the time, or cores used this much, set the speed.
BUSY = 0.9


def bound_by(result: dict) -> str:
    """Which stage sets a run's speed, from its measured figures: the learner when it is
    busy updating nearly all the time (more actors cannot help); else central inference,
    when its server is (the actors wait for their actions); else the CPU when every core is
    busy (its largest stage named); else the actors, which leave cores idle and the learner
    waiting (more actors, or more envs each, would help)."""
    stages = result["stages"]
    if result["learner_busy"] >= BUSY:
        gpu = result.get("gpu_utilization")
        return "learner" + (f" (GPU {gpu:.0f}% busy)" if gpu is not None else "")
    inference = result.get("inference")
    if inference is not None and inference["busy"] >= BUSY:
        return f"central inference (busy {100 * inference['busy']:.0f}% of the time)"
    cores_used = sum(stages.values()) * result["sps"] / 1e3
    if cores_used >= BUSY * result["cores"]:
        largest = max(stages, key=stages.get)
        return f"CPU (all cores busy; largest stage: {largest})"
    if result.get("sampling_only"):
        return "actors (cores idle)"
    return "actors (cores idle, learner waiting)"


def in_folder(flags: argparse.Namespace, folder: str) -> argparse.Namespace:
    """The flags of a benchmark run in ``folder``, without checkpoints, with those its
    runtime sets for a benchmark (PolyBeast: one env server per stream, in ``folder``)."""
    bench = dict(savedir=folder, xpid="bench", disable_checkpoint=True)
    bench.update(RUNTIMES[flags.runtime].bench_overrides(flags, folder))
    return argparse.Namespace(**{**vars(flags), **bench})


def main(argv: list[str] | None = None) -> int:
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    flags = parse_flags(argv, make_bench_parser(list(RUNTIMES)))
    if flags.json and (problem := unwritable(flags.json, "--json")):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    window_end = flags.warmup_steps + flags.bench_steps
    if flags.total_steps < window_end:  # it measured what part ran, exit 0: a wrong figure
        print(
            f"error: --total_steps {flags.total_steps} ends the run before the measurement "
            f"window does (--warmup_steps + --bench_steps = {window_end}): raise it, or leave "
            "it out",
            file=sys.stderr,
        )
        return 2
    setup_console_logging(flags.suppress_logs)
    result: dict = {}
    trainer: Trainer | None = None

    def run_benchmark() -> None:
        nonlocal trainer, flags
        with tempfile.TemporaryDirectory() as folder:
            flags = in_folder(flags, folder)
            settings = build_settings(flags, flags.runtime)
            runtime = RUNTIMES[flags.runtime].load(settings)
            thread: threading.Thread | None = None
            try:
                with runtime.session(settings) as trainer:
                    window = (trainer, flags.warmup_steps, flags.bench_steps, result)
                    if flags.sampling_only:
                        measure_sampling(*window)
                        return
                    thread = threading.Thread(target=measure, args=window)
                    thread.start()
                    trainer.train()
            finally:
                if trainer is not None:
                    trainer.stop_requested.set()
                if thread is not None:
                    thread.join()

    status = report_errors(run_benchmark)
    if status:
        return status
    if not result:
        print(
            "error: the run ended before the measurement window: raise --total_steps",
            file=sys.stderr,
        )
        return 1
    print_result(flags, trainer, result)
    if flags.json:
        with open(flags.json, "w") as file:
            learner = {name: getattr(flags, name) for name in (*LEARNER_SHAPE, "learning_rate")}
            layout = dict(
                layout=trainer.actor_layout(),
                device=trainer.device.type,
                torso_dtype=torso_dtype(trainer),
            )
            json.dump({**result, **layout, "learner": learner}, file)
    return 0


def torso_dtype(trainer: Trainer) -> str:
    """What the learner's torso computes in (``--precision``), "bf16" or "fp32"."""
    return dtype_name(trainer.learner.model.compute_dtype)


def epochs_text(flags: argparse.Namespace) -> str:
    """How the learner steps on each batch, e.g. "2 epochs, PPO clip 0.2"."""
    text = f"{flags.epochs} epoch{'s' if flags.epochs > 1 else ''}"
    return text + (f", PPO clip {flags.ppo_clip:g}" if flags.ppo_clip > 0 else "")


def print_result(flags: argparse.Namespace, trainer: Trainer, result: dict) -> None:
    cores = len(os.sched_getaffinity(0))
    total_ms = sum(result["stages"].values())
    stages = ", ".join(f"{name} {ms:.3f}" for name, ms in result["stages"].items())
    layout = trainer.actor_layout()
    print()
    name = RUNTIMES[flags.runtime].title
    print(
        f"{name} benchmark: {flags.env}, {trainer.config['kind']} model, "
        f"B={flags.batch_size}, T={flags.unroll_length}, {epochs_text(flags)}, {layout}, "
        f"{flags.num_learner_threads} learner threads, learner on {trainer.device} "
        f"(torso in {torso_dtype(trainer)}), "
        f"{cores} cores, torch {torch.__version__}"
    )
    if result.get("sampling_only"):
        print("sampling alone (--sampling_only): each batch dropped as it filled, no update")
    print(
        f"steady-state SPS: {result['sps']:.1f}  ({result['steps']} steps in "
        f"{result['seconds']:.1f} s after {flags.warmup_steps} warm-up steps)"
    )
    print(f"CPU ms per agent step: {stages}, total {total_ms:.3f}")
    print(f"ceiling implied by the stage costs on {cores} cores: {1e3 * cores / total_ms:.0f} SPS")
    gpu = result["gpu_utilization"]
    print(
        f"learner busy {100 * result['learner_busy']:.0f}% of the time"
        + (f", GPU {gpu:.0f}% busy" if gpu is not None else "")
        + f"; bound by: {result['bound']}"
    )
    if result.get("actor_time"):
        shares = ", ".join(
            f"{name} {100 * share:.0f}%" for name, share in result["actor_time"].items()
        )
        print(f"actors' wall-clock time: {shares}")
    inference = result.get("inference")
    if inference is not None:
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in inference["ms_per_pass"].items())
        print(
            f"central inference: busy {100 * inference['busy']:.0f}% of the time, "
            f"{inference['cpu_cores']:.2f} cores of CPU, {inference['envs_per_pass']:.1f} "
            f"envs per pass; ms per pass: {parts}"
        )
        return
    sizes = trainer.pool.inference_batch_sizes()
    if sizes:
        mean = sum(size * count for size, count in sizes.items()) / max(1, sum(sizes.values()))
        print(f"mean inference batch: {mean:.1f} actors or streams")


if __name__ == "__main__":
    sys.exit(main())

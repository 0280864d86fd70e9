"""Scaling benchmark: the shipped training recipe's steady-state speed over actor layouts
and devices, as one table.

    python -m torchbeast.scaling                          # layouts and devices of this machine
    python -m torchbeast.scaling --layouts 2x8 8x8 --devices cuda
    python -m torchbeast.scaling --env MinAtar/SpaceInvaders-v1 --torso grid

Each row is one run of ``python -m torchbeast.bench`` in its own process, with the
training defaults' learner (batch size, unroll length, epochs, PPO clip: what
``python -m torchbeast.monobeast`` trains with, the batch and its learning rate grown with
the row's envs as training grows them) where the one-step benchmark keeps the original's.
Any other flag is passed to every run, and wins over those defaults. A row gives the
layout, the learner's batch, the device the learner ran on, SPS, the CPU milliseconds per
agent step of each stage, how busy the learner and the GPU were, and which stage bounds the
run (``bench.bound_by``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

from torchbeast.bench import LEARNER_SHAPE
from torchbeast.config.argparser import FlagParser
from torchbeast.config.layers import DEFAULT, parse_in_layers
from torchbeast.config.parsers import make_bench_parser, make_mono_parser
from torchbeast.config.resolvers import RECIPE, default_layout, grown_batch
from torchbeast.config.values import nonnegative_int, positive_int
from torchbeast.core.errors import unwritable
from torchbeast.entry import work_begins
from torchbeast.runtime.processes import sigterm_as_ctrl_c
from torchbeast.runtime.registry import RUNTIMES

# The training recipe's learner, which the one-step benchmark leaves at the original's.
RECIPE_FLAGS = LEARNER_SHAPE
ENVS_PER_ACTOR = 8


# The flags whose values, set anywhere, keep training's batch from growing with the envs
# (``resolvers.resolve_learner_batch``).
GROWTH_KEEPERS = set(RECIPE)


LAYOUT_FLAGS = ("--num_actors", "--envs_per_actor", "--disable_cuda")  # set per row


def set_elsewhere(passed: list[str]) -> set[str]:
    """The recipe's flags (and the learning rate) that ``passed`` sets, itself or through
    the env's presets or a --config file."""
    if not passed:
        return set()
    sources = parse_in_layers(make_bench_parser(list(RUNTIMES)), list(passed))[1]
    names = (*RECIPE_FLAGS, "learning_rate")
    return {name for name in names if sources.get(name, DEFAULT) != DEFAULT}


def recipe_arguments(envs: int | None = None, passed: list[str] = ()) -> list[str]:
    """The training defaults of RECIPE_FLAGS, as command-line arguments; for ``envs``
    environments in all, the batch and learning rate training grows with them
    (``grown_batch``). What ``passed`` sets (``set_elsewhere``) is left out: the benchmark
    run takes it from there, as training would (on the command line, the recipe's values
    would win over a preset); and as in training, such a batch, learning rate or unroll
    length keeps the batch from growing."""
    training = make_mono_parser()
    given = set_elsewhere(passed)
    values = {name: training.get_default(name) for name in RECIPE_FLAGS}
    if envs is not None and not given & GROWTH_KEEPERS:
        values["batch_size"], values["learning_rate"] = grown_batch(envs)
    arguments: list[str] = []
    for name, value in values.items():
        if name not in given:
            arguments += [f"--{name}", str(value)]
    return arguments


def layout(text: str) -> tuple[int, int]:
    """ "AxE": A actors of E envs each."""
    actors, _, envs = text.partition("x")
    try:
        parsed = int(actors), int(envs)
    except ValueError:
        parsed = (0, 0)
    if min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a layout: write ACTORSxENVS, e.g. 4x8")
    return parsed


def default_layouts(cores: int) -> list[tuple[int, int]]:
    """1, 2, 4, ... actors up to the cores (and the cores themselves), 8 envs each, and the
    layout a run chooses by itself on this machine."""
    actors = sorted({1 << k for k in range(cores.bit_length()) if 1 << k <= cores} | {cores})
    layouts = [(count, ENVS_PER_ACTOR) for count in actors]
    chosen = default_layout(cores, torch.cuda.is_available())
    return layouts if chosen in layouts else [*layouts, chosen]


def make_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        description="The training recipe's steady-state SPS over actor layouts and devices; "
        "other flags go to every run (python -m torchbeast.bench --help lists them).",
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        type=layout,
        default=None,
        metavar="AxE",
        help="Actor layouts to run, A actors of E envs each "
        "(default: 1, 2, 4, ... actors up to the cores, 8 envs each, and the machine's own).",
    )
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=["cpu", "cuda"],
        default=None,
        help="Where the learner runs (default: cuda and cpu where CUDA is available, else cpu).",
    )
    parser.add_argument("--warmup_steps", type=nonnegative_int, default=10_000)
    parser.add_argument("--bench_steps", type=positive_int, default=30_000)
    parser.add_argument("--json", default=None, metavar="FILE", help="Also write the rows here.")
    return parser


def run_row(
    actors: int, envs: int, device: str, steps: tuple[int, int], passed: list[str], folder: str
) -> dict:
    """One benchmark run in its own process: its figures, or its error."""
    path = os.path.join(folder, f"{actors}x{envs}-{device}.json")
    command = [sys.executable, "-m", "torchbeast.bench", *recipe_arguments(actors * envs, passed)]
    command += passed
    command += ["--num_actors", str(actors), "--envs_per_actor", str(envs), "--json", path]
    command += ["--warmup_steps", str(steps[0]), "--bench_steps", str(steps[1])]
    if device == "cpu":
        command.append("--disable_cuda")
    finished = subprocess.run(command, capture_output=True, text=True)
    row = dict(actors=actors, envs=envs, device=device)
    if finished.returncode != 0 or not os.path.exists(path):
        lines = (finished.stdout + finished.stderr).strip().splitlines() or ["no output"]
        return row | dict(error=lines[-1])
    with open(path) as file:
        return row | json.load(file)


def format_row(row: dict) -> str:
    layout = f"{row['actors']} x {row['envs']}"
    if "error" in row:
        return f"| {layout} | | {row['device']} | failed: {row['error']} |"
    stages = " / ".join(f"{ms:.3f}" for ms in row["stages"].values())
    gpu = row.get("gpu_utilization")
    gpu_text = "-" if gpu is None else f"{gpu:.0f}%"
    learner = row["learner"]
    return (
        f"| {layout} | {learner['batch_size']} ({learner['learning_rate']:g}) | "
        f"{row['device']} | {row['sps']:.0f} | {stages} | "
        f"{100 * row['learner_busy']:.0f}% | {gpu_text} | {row['torso_dtype']} | {row['bound']} |"
    )


def inference_table(rows: list[dict]) -> str:
    """What the central inference server did in each row that had one (``bench``'s
    figures), as a table of its own; "" where no row had one."""
    lines = []
    for row in rows:
        figures = row.get("inference")
        if figures is None:
            continue
        if not lines:
            parts = " / ".join(figures["ms_per_pass"])
            lines += [
                f"| actors x envs | central inference busy | its CPU (cores) | envs per pass "
                f"| ms per pass: {parts} |",
                "|---|---|---|---|---|",
            ]
        ms = " / ".join(f"{value:.2f}" for value in figures["ms_per_pass"].values())
        lines.append(
            f"| {row['actors']} x {row['envs']} | {100 * figures['busy']:.0f}% | "
            f"{figures['cpu_cores']:.2f} | {figures['envs_per_pass']:.1f} | {ms} |"
        )
    return "\n".join(lines)


def actor_time_table(rows: list[dict]) -> str:
    """Where the actors' wall-clock time went, per row (MonoBeast's rows)."""
    lines = []
    for row in rows:
        shares = row.get("actor_time")
        if not shares:
            continue
        if not lines:
            lines += [
                f"| actors x envs | actors' wall-clock time: {' / '.join(shares)} |",
                "|---|---|",
            ]
        percents = " / ".join(f"{100 * share:.0f}%" for share in shares.values())
        lines.append(f"| {row['actors']} x {row['envs']} | {percents} |")
    return "\n".join(lines)


def header(stage_names: list[str]) -> str:
    names = " / ".join(stage_names) or "stages"
    return (
        f"| actors x envs | batch (learning rate) | learner on | SPS | CPU ms per agent step: "
        f"{names} | learner busy | GPU busy | torso in | bound by |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )


def main(argv: list[str] | None = None) -> int:
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    flags, passed = make_parser().parse_known_args(argv)
    cores = len(os.sched_getaffinity(0))
    layouts = flags.layouts or default_layouts(cores)
    devices = flags.devices or (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"])
    if "cuda" in devices and not torch.cuda.is_available():
        print("error: --devices cuda, but PyTorch sees no CUDA device: use --devices cpu",
              file=sys.stderr)  # fmt: skip
        return 2
    if flags.json and (problem := unwritable(flags.json, "--json")):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if layout_flags := [word for word in passed if word.split("=")[0] in LAYOUT_FLAGS]:
        print(  # each row sets its own: the header named them, the rows ran without
            f"error: {layout_flags[0].split('=')[0]} is each row's own: give the rows with "
            "--layouts ACTORSxENVS,... (and --devices)",
            file=sys.stderr,
        )
        return 2
    recipe = " ".join(recipe_arguments(passed=passed))
    if not set_elsewhere(passed) & GROWTH_KEEPERS:
        recipe += ", the batch and its learning rate grown with the envs"
    changed = f"; every row with {' '.join(passed)}" if passed else ""
    print(f"Scaling benchmark on {cores} cores: the training recipe ({recipe}{changed}), ", end="")
    print(f"{flags.bench_steps} steps measured after {flags.warmup_steps}; one run per row.")
    rows: list[dict] = []
    sigterm_as_ctrl_c()
    try:
        with tempfile.TemporaryDirectory() as folder:
            for device in devices:
                for actors, envs in layouts:
                    steps = (flags.warmup_steps, flags.bench_steps)
                    # Stopped, subprocess.run kills the row's benchmark before it unwinds.
                    row = run_row(actors, envs, device, steps, passed, folder)
                    if not rows:
                        print(header(list(row.get("stages", {}))))
                    rows.append(row)
                    print(format_row(row), flush=True)
    except KeyboardInterrupt:  # the rows measured are kept
        if flags.json:
            write_rows(flags.json, rows)
        kept = f", written to {flags.json}" if flags.json else ""
        print(f"interrupted after {len(rows)} rows{kept}", file=sys.stderr)
        return 130
    if table := inference_table(rows):
        print(f"\n{table}")
    if table := actor_time_table(rows):
        print(f"\n{table}")
    if flags.json:
        write_rows(flags.json, rows)
    return 1 if any("error" in row for row in rows) else 0


def write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w") as file:
        json.dump(rows, file, indent=1)


if __name__ == "__main__":
    sys.exit(main())

"""Studies: a grid of training runs, each an ordinary run in its own folder, each evaluated
when it has trained, gathered into one table (CSV and JSON).

    python -m torchbeast.study capacity.toml [--parallel N]

A study file (TOML) names the entry point, the flags every cell shares, the axes (any flag,
each a list of values: the grid is every combination) and the flags of the evaluation:

    runtime = "mono"                 # mono, poly or ray
    [flags]
    env = "CartPole-v1"
    total_steps = 200000
    savedir = "~/logs/torchbeast"    # the study's folder is savedir/<study name>
    [axes]
    hidden_size = [64, 256, 1024]
    seed = [1, 2]
    [eval]
    num_episodes = 10

Each cell trains as ``python -m torchbeast.<runtime> --config <cell>/study_flags.toml``
(so a wrong flag is one line, as in any config file), then plays ``--mode eval`` with the
same flags (its own reward settings; eval.json holds the true reward too where the env has
one). A study run again skips the cells that finished and resumes the others from their
checkpoints; a cell that fails is recorded with its last error line and the others go on.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import dataclasses
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

from torchbeast.curves import read_logs, return_last_100_curve

ENTRY_POINTS = {
    "mono": "torchbeast.monobeast",
    "poly": "torchbeast.polybeast",
    "ray": "torchbeast.raybeast",
}
SPEC_NAME = "study.json"  # in the study's folder: what the study is, and its table
TABLE_NAME = "study.csv"
CELL_FLAGS = "study_flags.toml"  # in a cell's folder: the flags it trains with
CELL_STATE = "study_cell.json"  # in a cell's folder: how the cell ended
CELL_LOG = "study.log"  # in a cell's folder: its commands' console output


class StudyError(Exception):
    """A study file or folder the user must fix; the message says how."""


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    runtime: str
    flags: dict[str, object]
    axes: dict[str, list[object]]
    eval_flags: dict[str, object]

    @property
    def folder(self) -> Path:
        savedir = str(self.flags.get("savedir", "~/logs/torchbeast"))
        return Path(savedir).expanduser() / self.name

    def spec(self) -> dict:
        """What makes the study itself, as its folder records it."""
        return {
            "runtime": self.runtime,
            "flags": self.flags,
            "axes": self.axes,
            "eval": self.eval_flags,
        }

    def cells(self) -> list[Cell]:
        """Every combination of the axes' values, in the file's order."""
        names = list(self.axes)
        return [
            Cell(self, dict(zip(names, values, strict=True)))
            for values in itertools.product(*(self.axes[name] for name in names))
        ]


@dataclasses.dataclass(frozen=True)
class Cell:
    study: Study
    values: dict[str, object]  # axis -> this cell's value

    @property
    def name(self) -> str:
        """The cell's folder name (its xpid): "hidden_size-64_seed-1"."""
        parts = [f"{axis}-{value}" for axis, value in self.values.items()]
        return re.sub(r"[^\w.\-]+", "_", "_".join(parts)) or "cell"

    @property
    def folder(self) -> Path:
        return self.study.folder / self.name

    def flags(self) -> dict[str, object]:
        """The flags the cell trains with: the study's, then its axes' values."""
        flags = {k: v for k, v in self.study.flags.items() if k not in ("savedir", "xpid")}
        return flags | self.values

    def command(self, *extra: str) -> list[str]:
        module = ENTRY_POINTS[self.study.runtime]
        where = ["--savedir", str(self.study.folder), "--xpid", self.name]
        return [
            sys.executable,
            "-m",
            module,
            "--config",
            str(self.folder / CELL_FLAGS),
            *where,
            *extra,
        ]

    def finished(self) -> bool:
        """Trained to its steps and evaluated (a study run again skips it)."""
        return self.state().get("status") == "finished" and (self.folder / "eval.json").exists()

    def state(self) -> dict:
        try:
            return json.loads((self.folder / CELL_STATE).read_text())
        except (OSError, ValueError):
            return {}


def read_study(path: str) -> Study:
    """The study a TOML file describes; StudyError for what does not make one."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as error:
        raise StudyError(f"cannot read the study file {path} ({error.strerror or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise StudyError(f"{path} is not valid TOML ({error})") from None
    unknown = set(table) - {"runtime", "name", "flags", "axes", "eval"}
    if unknown:
        raise StudyError(
            f"{path}: unknown key {sorted(unknown)[0]!r}: a study file has runtime, name, "
            "[flags], [axes] and [eval]"
        )
    runtime = table.get("runtime", "mono")
    if runtime not in ENTRY_POINTS:
        raise StudyError(f"{path}: runtime {runtime!r}: use one of {', '.join(ENTRY_POINTS)}")
    axes = {name.replace("-", "_"): values for name, values in table.get("axes", {}).items()}
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise StudyError(f"{path}: axis {name} must be a list of values, e.g. [64, 256]")
    flags = {name.replace("-", "_"): value for name, value in table.get("flags", {}).items()}
    overlap = sorted(set(flags) & set(axes))
    if overlap:
        raise StudyError(f"{path}: {overlap[0]} is both a flag and an axis: keep one")
    eval_flags = {name.replace("-", "_"): value for name, value in table.get("eval", {}).items()}
    name = table.get("name", Path(path).stem)
    if not re.fullmatch(r"[\w.\-]+", str(name)):
        raise StudyError(f"{path}: name {name!r} must be a folder name (letters, digits, . _ -)")
    return Study(str(name), runtime, flags, axes, eval_flags)


def toml_value(value: object) -> str:
    """A flag's value as TOML (a study's values are strings, numbers and booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    raise StudyError(f"{value!r} is not a flag value: use a string, a number or true/false")


def flag_words(flags: dict[str, object]) -> list[str]:
    """Flags as command-line words: ``--name=value``, a switch as ``--name`` (or none)."""
    words = []
    for name, value in flags.items():
        if isinstance(value, bool):
            words += [f"--{name}"] if value else []
        else:
            words.append(f"--{name}={value}")
    return words


def claim_folder(study: Study) -> None:
    """Makes the study's folder, or takes it back for the same study; another study's
    folder is refused: nothing a study writes may overwrite another's."""
    folder = study.folder
    spec_path = folder / SPEC_NAME
    if spec_path.exists():
        recorded = json.loads(spec_path.read_text()).get("study")
        if recorded != json.loads(json.dumps(study.spec())):
            raise StudyError(
                f"{folder} holds another study (its {SPEC_NAME} has other flags or axes): "
                "give this study another name (name = ... in the file), or another savedir"
            )
    elif folder.exists() and any(folder.iterdir()):
        raise StudyError(
            f"{folder} holds files of something other than this study: give the study "
            "another name (name = ... in the file), or another savedir"
        )
    folder.mkdir(parents=True, exist_ok=True)


class Runner:
    """Runs cells, ``parallel`` at a time, each in its own subprocesses; ``stop`` (Ctrl-C,
    SIGTERM) starts no more and asks the runs it trains to stop (they checkpoint)."""

    def __init__(self, study: Study, parallel: int):
        self.study, self.parallel = study, parallel
        self.print_lock = threading.Lock()
        self.stopping = threading.Event()
        self.running: set[subprocess.Popen] = set()
        self.running_lock = threading.Lock()

    def stop(self) -> None:
        self.stopping.set()
        with self.running_lock:
            for process in self.running:
                process.send_signal(signal.SIGTERM)

    def say(self, text: str) -> None:
        with self.print_lock:
            print(text, flush=True)

    def run_cell(self, cell: Cell) -> None:
        if self.stopping.is_set():
            return
        if cell.finished():
            self.say(f"{cell.name}: finished before, skipped")
            return
        cell.folder.mkdir(parents=True, exist_ok=True)
        (cell.folder / CELL_FLAGS).write_text(
            "".join(f"{name} = {toml_value(value)}\n" for name, value in cell.flags().items())
        )
        started = time.monotonic()
        self.say(f"{cell.name}: training")
        status, error = "finished", None
        returncode, last = self.call(cell, cell.command())
        if self.stopping.is_set():
            return  # stopped, not failed: the same command goes on with it
        if returncode == 0:
            eval_flags = flag_words(self.study.eval_flags)
            self.say(f"{cell.name}: evaluating")
            returncode, last = self.call(cell, cell.command("--mode", "eval", *eval_flags))
        if returncode != 0:
            status, error = "failed", last
        seconds = time.monotonic() - started + cell.state().get("seconds", 0.0)
        state = {"status": status, "error": error, "seconds": round(seconds, 1)}
        (cell.folder / CELL_STATE).write_text(json.dumps(state, indent=2) + "\n")
        self.say(f"{cell.name}: {status}" + (f" ({error})" if error else ""))

    def call(self, cell: Cell, command: list[str]) -> tuple[int, str]:
        """Runs one command of a cell, its output appended to the cell's log; its exit
        code and its last line on stderr (or stdout)."""
        with open(cell.folder / CELL_LOG, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            with self.running_lock:
                if self.stopping.is_set():
                    return 1, "stopped"
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.PIPE, text=True)
                self.running.add(process)
            _, stderr = process.communicate()
            with self.running_lock:
                self.running.discard(process)
            log.write(stderr)
        lines = stderr.strip().splitlines()
        return process.returncode, lines[-1] if lines else f"exit code {process.returncode}"

    def run(self, cells: list[Cell]) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(self.parallel)
        futures = [pool.submit(self.run_cell, cell) for cell in cells]
        try:
            for future in futures:
                future.result()
        except BaseException:  # Ctrl-C or SIGTERM: the runs checkpoint, nothing new starts
            self.stop()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def cell_row(cell: Cell) -> dict[str, object]:
    """One row of the study's table: the cell's settings, how it ended, what it learned."""
    state = cell.state()
    row: dict[str, object] = {"cell": cell.name, **cell.values}
    row.update(status=state.get("status", "not run"), error=state.get("error") or "")
    row["seconds"] = state.get("seconds", math.nan)
    try:
        logs = read_logs(cell.folder)
        steps, returns = return_last_100_curve(logs)
        row["steps"] = int(logs["step"][-1])
        row["train_return_last_100"] = float(returns[-1]) if returns.size else math.nan
        row["train_return_best_100"] = float(returns.max()) if returns.size else math.nan
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        report = json.loads((cell.folder / "eval.json").read_text())
    except (OSError, ValueError):
        return row
    row["parameters"] = report.get("parameters")
    for name, figure in report.items():
        if isinstance(figure, dict) and "mean" in figure:
            row[f"eval_{name}"] = figure["mean"]
            row[f"eval_{name}_std"] = figure.get("std")
    return row


def write_table(study: Study, cells: list[Cell]) -> list[dict]:
    """The study's table, CSV and JSON, in its folder; returns its rows."""
    rows = [cell_row(cell) for cell in cells]
    columns = list(dict.fromkeys(name for row in rows for name in row))
    with open(study.folder / TABLE_NAME, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    spec = {"study": study.spec(), "cells": rows}
    temporary = study.folder / (SPEC_NAME + ".tmp")
    temporary.write_text(json.dumps(spec, indent=2, default=str) + "\n")
    os.replace(temporary, study.folder / SPEC_NAME)
    return rows


def default_parallel() -> int:
    """Cells at once: one per two cores (each run uses at least two: actors, learner)."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torchbeast.study",
        description="Train, evaluate and tabulate a grid of runs described by a study file.",
    )
    parser.add_argument("study", help="the study file (TOML)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="cells trained at once (default: one per two cores)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        study = read_study(args.study)
        parallel = args.parallel or default_parallel()
        if parallel < 1:
            raise StudyError(f"--parallel must be at least 1, got {parallel}")
        claim_folder(study)
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    cells = study.cells()
    write_table(study, cells)  # the folder says what it holds from the start
    print(f"Study {study.name}: {len(cells)} cells, {parallel} at a time, in {study.folder}")
    signal.signal(signal.SIGTERM, raise_interrupt)  # a scheduler's stop, as Ctrl-C's
    try:
        Runner(study, parallel).run(cells)
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        write_table(study, cells)
        print("stopped: run the same command to go on; finished cells are kept", file=sys.stderr)
        return 130
    rows = write_table(study, cells)
    failed = [row["cell"] for row in rows if row["status"] != "finished"]
    print(f"Table: {study.folder / TABLE_NAME} ({len(rows)} cells)")
    if failed:
        print(
            f"error: {len(failed)} of {len(rows)} cells failed: {', '.join(failed)} "
            f"(their last error line is in the table; the whole output in each {CELL_LOG})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

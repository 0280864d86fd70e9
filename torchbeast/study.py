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
    reward = [{ name = "score" }, { name = "fuel5", fuel_multiplier = 5.0 }]  # sets of flags
    seed = [1, 2]
    [eval]
    num_episodes = 10
    [resources]                      # what one cell takes (default: 2 CPUs, no GPU)
    cpus = 2

Each cell trains as ``python -m torchbeast.<runtime> --config <cell>/study_flags.toml``
(so a wrong flag is one line, as in any config file), then plays ``--mode eval`` with the
same flags (its own reward settings; eval.json holds the true reward too where the env has
one). A study run again skips the cells that finished and resumes the others from their
checkpoints; a cell that fails is recorded with its last error line and the others go on.

Cells run on this machine, ``--parallel`` at a time (default: as many as its cores hold
cells of ``cpus``), or on an existing Ray cluster with ``--ray_address`` (``study_cluster``),
each placed by Ray on a node with the cell's CPUs and GPUs free.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import fcntl
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from torchbeast.config.argparser import FlagParser
from torchbeast.config.resolvers import default_layout, expand_savedir, unset_variable
from torchbeast.core.errors import os_error_line
from torchbeast.core.files import write_whole
from torchbeast.curves import LOGS_NAME, best_last_100_curve, read_logs, return_last_100_curve
from torchbeast.entry import work_begins
from torchbeast.runtime.processes import (
    child_dies_with_parent,
    further_stops_said,
    sigterm_as_ctrl_c,
)
from torchbeast.runtime.registry import RUNTIMES

if TYPE_CHECKING:
    from torchbeast.config.settings import Settings
    from torchbeast.envs.settings import EnvSettings

SPEC_NAME = "study.json"  # in the study's folder: what the study is, and its table
TABLE_NAME = "study.csv"
CELL_FLAGS = "study_flags.toml"  # in a cell's folder: the flags it trains with
CELL_STATE = "study_cell.json"  # in a cell's folder: how the cell ended
CELL_LOG = "study.log"  # in a cell's folder: its commands' console output
LOCK_NAME = ".study.lock"  # in the study's folder: held while a command runs the study
REPLACING = (".incoming", ".outgoing")  # beside a cell's folder while a cluster replaces it


class StudyError(Exception):
    """A study file or folder the user must fix; the message says how."""


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one cell takes: the CPUs its actors and learner use, and its GPUs."""

    cpus: int = 2
    gpus: float = 0.0


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    runtime: str
    flags: dict[str, object]
    axes: dict[str, list[object]]
    eval_flags: dict[str, object]
    resources: Resources = dataclasses.field(default_factory=lambda: Resources())
    random_policy: bool = True  # each cell's random-policy level too

    @property
    def folder(self) -> Path:
        """savedir/<name>, savedir as a run resolves its --savedir (~ and $VARS): the
        folder its cells train in."""
        savedir = str(self.flags.get("savedir", "~/logs/torchbeast"))
        # Absolute: a cell on a Ray node resolved a relative one from its own directory.
        return Path(os.path.abspath(expand_savedir(savedir))) / self.name

    def spec(self) -> dict:
        """What makes the study itself, as its folder records it."""
        return {
            "runtime": self.runtime,
            "flags": self.flags,
            "axes": self.axes,
            "eval": self.eval_flags,
            "resources": dataclasses.asdict(self.resources),
            "random_policy": self.random_policy,
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
    values: dict[str, object]  # axis -> this cell's value (a flag's, or a named set's)

    @property
    def labels(self) -> dict[str, object]:
        """Axis -> the value's label: the flag's value, or the named set's name."""
        return {axis: label(value) for axis, value in self.values.items()}

    @property
    def name(self) -> str:
        """The cell's folder name (its xpid, ASCII as --xpid takes): "hidden_size-64_seed-1"."""
        parts = [f"{axis}-{value}" for axis, value in self.labels.items()]
        return re.sub(r"[^\w.\-]+", "_", "_".join(parts), flags=re.ASCII) or "cell"

    @property
    def folder(self) -> Path:
        return self.study.folder / self.name

    def flags(self) -> dict[str, object]:
        """The flags the cell trains with: the study's, then its axes' values; where
        neither sets num_actors, the actors a run chooses for the cell's CPUs (not for
        every core of the machine or node it lands on), with their envs unless set; and
        what its runtime sets to run apart from other cells (``Runtime.apart_flags``)."""
        flags = {k: v for k, v in self.study.flags.items() if k not in ("savedir", "xpid")}
        for axis, value in self.values.items():
            if isinstance(value, dict):  # a named set of flags
                flags |= {k: v for k, v in value.items() if k != "name"}
            else:
                flags[axis] = value
        if "num_actors" not in flags:
            actors, envs = default_layout(self.study.resources.cpus)
            flags |= {"num_actors": actors, "envs_per_actor": flags.get("envs_per_actor", envs)}
        # Cells side by side on one machine must not meet (PolyBeast's env servers).
        return flags | RUNTIMES[self.study.runtime].apart_flags(flags, str(self.folder))

    def job(self) -> CellJob:
        flags = {k: v for k, v in self.study.eval_flags.items() if k != "video"}
        video = self.study.eval_flags.get("video")
        return CellJob(
            name=self.name,
            module=RUNTIMES[self.study.runtime].entry_point,
            savedir=str(self.study.folder),
            eval_words=tuple(flag_words(flags)),
            random_words=tuple(flag_words(flags)) if self.study.random_policy else None,
            cpus=self.study.resources.cpus,
            # In the cell's folder, wherever it runs (read_study refuses others).
            video=None if video is None else os.path.normpath(expand_savedir(str(video))),
        )

    def flags_text(self) -> str:
        """The cell's ``CELL_FLAGS`` file: its flags as TOML."""
        return "".join(f"{name} = {toml_value(value)}\n" for name, value in self.flags().items())

    def write_flags(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / CELL_FLAGS).write_text(self.flags_text())
        if video := self.job().video:  # "clips/play.gif": its folder, in the cell's
            (self.folder / video).parent.mkdir(parents=True, exist_ok=True)

    def finished(self) -> bool:
        """Trained to its steps and evaluated as the study evaluates now (a study run again
        skips it; after its [eval] changed, it plays again)."""
        state = self.state()
        evaluated = state.get("evaluated")  # (``record_earlier_evaluations`` for older ones)
        return (
            state.get("status") == "finished"
            and evaluated == self.job().evaluation_record()
            and (self.folder / "eval.json").exists()
        )

    def state(self) -> dict:
        return read_state(self.folder)


def earlier_record(cell: Cell) -> dict:
    """The cell's record from an earlier run, without where that ran it (a node of a
    cluster): a failure here is not that node's."""
    return {k: v for k, v in cell.state().items() if k not in ("node", "node_id")}


def read_state(folder: Path) -> dict:
    """How the cell in ``folder`` ended (``CELL_STATE``), or {} before it has."""
    try:
        return json.loads((folder / CELL_STATE).read_text())
    except (OSError, ValueError):
        return {}


def write_state(folder: Path, state: dict) -> None:
    """Records how the cell in ``folder`` ended (``CELL_STATE``)."""
    folder.mkdir(parents=True, exist_ok=True)
    # Whole: half a record read as none trained a finished cell again.
    write_whole(folder / CELL_STATE, json.dumps(state, indent=2) + "\n")


def replacing(folder: Path) -> tuple[Path, Path]:
    """Where ``study_cluster.replace_folder`` puts a cell folder's new files (``incoming``)
    and its old ones (``outgoing``) as it replaces it, beside it."""
    incoming, outgoing = (folder.with_name(folder.name + ending) for ending in REPLACING)
    return incoming, outgoing


def finish_replacing(folder: Path) -> None:
    """Finishes a cell folder's replacement that a crash cut off between its renames (the
    folder gone, its files in the new copy, or in the old one): the folder holds them
    again, not the next run's fresh start, which had deleted them."""
    incoming, outgoing = replacing(folder)
    if not folder.exists() and outgoing.is_dir():
        # The new copy was whole before the old folder moved out of the way.
        os.replace(incoming if incoming.is_dir() else outgoing, folder)
    if folder.is_dir():  # what a replacement left beside it
        for leftover in (incoming, outgoing):
            shutil.rmtree(leftover, ignore_errors=True)


def json_safe(value: object) -> object:
    """``value``, a NaN or infinite float as null: JSON has no NaN, and jq and JavaScript
    refuse the ``NaN`` Python's json writes."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclasses.dataclass(frozen=True)
class CellJob:
    """Running one cell, as plain data (it travels to a Ray node): the cell's folder is
    savedir/name, and its flags are in its ``CELL_FLAGS`` file there."""

    name: str
    module: str  # the entry point, "torchbeast.monobeast"
    savedir: str  # the study's folder
    eval_words: tuple[str, ...]  # the evaluation's flags, but its video
    # The random policy's evaluation's (eval_random.json), or None: none.
    random_words: tuple[str, ...] | None
    cpus: int  # the learner process's threads are limited to them
    video: str | None = None  # [eval] video, relative to the cell's folder

    @property
    def folder(self) -> Path:
        return Path(self.savedir) / self.name

    def evaluations(self, folder: Path | None = None) -> list[tuple[str, ...]]:
        """The words each evaluation adds to the cell's command: the trained policy's,
        then the random policy's (with the cell's reward settings) where it has one; each
        records its video, if the study asks for one, in ``folder`` (the cell's), the
        random policy's as ``<stem>_random``."""
        folder = self.folder if folder is None else folder
        video = None if self.video is None else folder / self.video
        trained = () if video is None else (f"--video={video}",)
        evaluations = [("--mode", "eval", *self.eval_words, *trained)]
        if self.random_words is not None:
            random = (
                () if video is None else (f"--video={video.with_stem(video.stem + '_random')}",)
            )
            evaluations.append(("--mode", "eval", "--random_policy", *self.random_words, *random))
        return evaluations

    def evaluation_record(self) -> list[list[str]]:
        """The evaluations' words as the cell's record keeps them (JSON: lists): its video
        relative to its folder, which a copied cell ran elsewhere."""
        return [list(words) for words in self.evaluations(folder=Path("."))]

    def command(self, *extra: str) -> list[str]:
        config = str(self.folder / CELL_FLAGS)
        where = ["--savedir", self.savedir, "--xpid", self.name]
        return [sys.executable, "-m", self.module, "--config", config, *where, *extra]


class CellProcess:
    """Runs a cell's commands one at a time, each in its own process; ``stop`` asks the
    running one to stop (SIGTERM: it writes its checkpoint) and starts no more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.stopped = False

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.process is not None:
                self.process.send_signal(signal.SIGTERM)

    def call(self, job: CellJob, command: list[str]) -> tuple[int, str]:
        """Runs ``command`` with its output appended to the cell's log; its exit code
        and its last line on stderr (or stdout)."""
        # The cell's CPUs, not the machine's: OMP_NUM_THREADS bounds the learner's threads.
        env = os.environ | {"OMP_NUM_THREADS": str(job.cpus)}
        with open(job.folder / CELL_LOG, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            with self.lock:
                if self.stopped:
                    return 1, "stopped"
                self.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    # A study killed outright takes its runs along.
                    preexec_fn=child_dies_with_parent(),
                )
            _, stderr = self.process.communicate()
            with self.lock:
                returncode, self.process = self.process.returncode, None
            log.write(stderr)
        lines = stderr.strip().splitlines()
        return returncode, lines[-1] if lines else f"exit code {returncode}"


def train_and_evaluate(
    job: CellJob, process: CellProcess, where: dict[str, str] | None = None
) -> dict | None:
    """Trains the cell (from its checkpoint if it has one) and evaluates it, and records
    how it ended in its folder (with ``where`` it ran); returns that record, or None when
    it was stopped (its wall-clock is kept: the same study goes on with it)."""
    started = time.monotonic()
    returncode, last = process.call(job, job.command())
    for evaluation in job.evaluations():
        if returncode == 0 and not process.stopped:
            returncode, last = process.call(job, job.command(*evaluation))
    seconds = time.monotonic() - started + read_state(job.folder).get("seconds", 0.0)
    if process.stopped:
        status, error = "stopped", None
    elif returncode == 0:
        status, error = "finished", None
    else:
        status, error = "failed", last
    state = {"status": status, "error": error, "seconds": round(seconds, 1), **(where or {})}
    if status == "finished":
        state["evaluated"] = job.evaluation_record()  # [eval] changed: it plays again
    write_state(job.folder, state)
    return None if status == "stopped" else state


def read_study(path: str) -> Study:
    """The study a TOML file describes; StudyError for what does not make one."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as error:
        raise StudyError(f"cannot read the study file {path} ({error.strerror or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise StudyError(f"{path} is not valid TOML ({error})") from None
    except UnicodeDecodeError:  # a binary file, or one saved in Latin-1
        raise StudyError(f"{path} is not a study file: TOML is UTF-8 text") from None
    keys = {"runtime", "name", "random_policy", "flags", "axes", "eval", "resources"}
    unknown = set(table) - keys
    if unknown:
        raise StudyError(
            f"{path}: unknown key {sorted(unknown)[0]!r}: a study file has runtime, name, "
            "random_policy, [flags], [axes], [eval] and [resources]"
        )
    for key in ("flags", "axes", "eval", "resources"):
        if not isinstance(table.get(key, {}), dict):
            raise StudyError(f"{path}: {key} must be a table: [{key}], then name = value lines")
    random_policy = table.get("random_policy", True)
    if not isinstance(random_policy, bool):
        raise StudyError(f"{path}: random_policy must be true or false")
    runtime = table.get("runtime", "mono")
    if runtime not in RUNTIMES:
        raise StudyError(f"{path}: runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    axes = underscored(path, "[axes]", table.get("axes", {}))
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise StudyError(f"{path}: axis {name} must be a list of values, e.g. [64, 256]")
        for value in values:
            if isinstance(value, dict) and not isinstance(value.get("name"), str):
                raise StudyError(
                    f"{path}: axis {name}: a set of flags needs a name, e.g. "
                    '{ name = "fuel5", fuel_multiplier = 5.0 }'
                )
        # A named set's flags as its cells' flags file reads them (disable-checkpoint is
        # disable_checkpoint), so that the checks below see what the cells will run with.
        axes[name] = [
            underscored(path, f"the set {value['name']!r} of axis {name}", value)
            if isinstance(value, dict)
            else value
            for value in values
        ]
    for name in axes:
        if name in TABLE_COLUMNS or name.startswith(FIGURE_PREFIXES):
            raise StudyError(
                f"{path}: axis {name}: the study's table ({TABLE_NAME}) has a column of its "
                f"own by that name ({', '.join(TABLE_COLUMNS)}, and eval_ and random_ "
                "figures): give the axis another name"
            )
    flags = underscored(path, "[flags]", table.get("flags", {}))
    overlap = sorted(set(flags) & set(axes))
    if overlap:
        raise StudyError(f"{path}: {overlap[0]} is both a flag and an axis: keep one")
    eval_flags = underscored(path, "[eval]", table.get("eval", {}))
    check_values(path, flags, axes, eval_flags)
    if not flags and not axes:  # an empty file trained Pong for 5M steps
        raise StudyError(f"{path} has no [flags] and no [axes]: nothing to study")
    name = table.get("name", Path(path).stem)
    if not re.fullmatch(r"[\w.\-]+", str(name)) or name in (".", ".."):
        if "name" in table:
            raise StudyError(
                f"{path}: name {name!r} must be a folder name (letters, digits, . _ -)"
            )
        raise StudyError(  # the user gave no name: say where this one came from
            f"{path}: a study is named for its file, and {name!r} is no folder name "
            '(letters, digits, . _ -): rename the file, or give it name = "..."'
        )
    resources = read_resources(path, table)
    if unset := unset_variable(str(flags.get("savedir", ""))):
        raise StudyError(
            f"{path}: savedir names {unset}, which is not set: set it, or give the path"
        )
    study = Study(str(name), runtime, flags, axes, eval_flags, resources, random_policy)
    refuse_shared_folders(path, study.cells())
    return study


def underscored(path: str, where: str, table: dict) -> dict:
    """``table`` with its keys as flags are named (batch-size is batch_size, as the flags
    file reads it); StudyError where two of its keys name one flag (one would be lost)."""
    named: dict[str, str] = {}
    for key in table:
        name = key.replace("-", "_")
        if name in named:
            raise StudyError(f"{path}: {where} sets {named[name]} and {key}, one flag: keep one")
        named[name] = key
    return {name: table[key] for name, key in named.items()}


# The table's own columns besides the axes' (``cell_row``): an axis of one of these names
# would be overwritten in its rows, and its figures and plots would match no cell.
TABLE_COLUMNS = (
    "cell", "status", "error", "seconds", "node", "steps", "train_return_last_100",
    "train_return_best_100", "parameters",
)  # fmt: skip
FIGURE_PREFIXES = ("eval_", "random_")


# Keys a study sets for each evaluation itself: in [eval] they would undo it.
EVAL_OWN_KEYS = {
    "mode": "each cell's evaluation is --mode eval",
    "random_policy": "the study evaluates a random policy of its own: random_policy = true "
    "or false at the top of the file, before any [table]",
    "savedir": "the cells are in the study's folder",
    "xpid": "each cell's name is its folder's",
}


# Flags about reading a command line, which no cell's run may take: why.
COMMAND_LINE_KEYS = {
    "help": "a cell's run would print its help and end: see python -m torchbeast.monobeast "
    "--help (or .polybeast, .raybeast)",
    "print_settings": "a cell's run would print its settings and end: leave it out",
    "config": "the study writes each cell's flags file itself: put the file's flags in [flags]",
}


# Flags a study decides for its cells' training: the one value it takes (in [flags] or an
# axis), and why.
TRAINING_OWN_KEYS = {
    "mode": ("train", "each cell trains (--mode train), then is evaluated"),
    "disable_checkpoint": (False, "each cell's evaluation plays its checkpoint"),
}


def check_values(
    path: str, flags: dict[str, object], axes: dict[str, list], eval_flags: dict[str, object]
) -> None:
    """Refuses, before anything runs, what no cell could take: a value that is no flag
    value, a named set of flags that sets a flag or another axis of the study (the cell's
    label would say one value and the run take another), a key of the study's own in
    [eval]."""
    from_axes: list[tuple[str, object]] = []  # each flag an axis value sets, and its value
    for axis, axis_values in axes.items():
        for value in axis_values:
            if not isinstance(value, dict):
                from_axes.append((axis, value))
                continue
            for name, flag_value in value.items():
                if name == "name":
                    continue
                from_axes.append((name, flag_value))
                if name in flags or (name in axes and name != axis):
                    where = "a flag" if name in flags else "an axis"
                    raise StudyError(
                        f"{path}: the set {value['name']!r} of axis {axis} sets {name}, "
                        f"which is also {where} of the study: keep one"
                    )
    trained = [*flags.items(), *from_axes]
    for name, value in [*trained, *eval_flags.items()]:
        if name in COMMAND_LINE_KEYS:
            raise StudyError(f"{path}: {name} = {value!r}: {COMMAND_LINE_KEYS[name]}")
        try:
            toml_value(value)
        except StudyError as error:
            raise StudyError(f"{path}: {name} = {value!r}: {error}") from None
    if own := sorted(set(eval_flags) & set(EVAL_OWN_KEYS)):
        raise StudyError(f"{path}: [eval] sets {own[0]}, but {EVAL_OWN_KEYS[own[0]]}")
    video = os.path.normpath(expand_savedir(str(eval_flags.get("video", "."))))
    if os.path.isabs(video) or video.split(os.sep)[0] == "..":
        raise StudyError(  # every cell's video was written to the one file, each over the last
            f"{path}: [eval] video = {eval_flags['video']!r}: each cell records its own, in "
            'its folder: give a file name, e.g. video = "play.gif"'
        )
    for name, value in trained:
        if name == "xpid":  # it was dropped without a word
            raise StudyError(
                f"{path}: the cells' training sets xpid = {toml_value(value)}, but "
                f"{EVAL_OWN_KEYS['xpid']}: leave it out"
            )
        if name in TRAINING_OWN_KEYS and value != TRAINING_OWN_KEYS[name][0]:
            reason = TRAINING_OWN_KEYS[name][1]
            raise StudyError(
                f"{path}: the cells' training sets {name} = {toml_value(value)}, but {reason}"
            )


def check_cells(path: str, study: Study, draws_here: bool = True) -> None:
    """Parses each cell's commands, its training's and its evaluations', as its runs will,
    before any runs: a flag a run refuses is one line now, not a failed cell after others
    trained (and a study that, fixed, is another study). ``draws_here``: the cells run on
    this machine, so that an [eval] video's env is seen to draw here (a cluster's nodes may
    have what this machine lacks)."""
    drawn: set[EnvSettings] = set()  # the envs whose pictures --video was seen to take
    with tempfile.TemporaryDirectory() as folder:
        flags_file = Path(folder) / CELL_FLAGS
        for cell in study.cells():
            flags = cell.flags()
            for name, value in study.eval_flags.items():
                if value is False and flags.get(name) is True:
                    raise StudyError(
                        f"{path}: [eval] {name} = false cannot turn off the training's "
                        f"{name} = true (cell {cell.name}): leave it out of one of them"
                    )
            flags_file.write_text(cell.flags_text())
            job = dataclasses.replace(cell.job(), savedir=str(study.folder))
            trained, evaluated = (
                parse_cell_command(path, cell, what, job, words, flags_file)
                for what, words in (("training", ()), ("evaluation", job.evaluations()[0]))
            )
            # The env the evaluation plays (its own flags; the checkpoint's id unless given).
            played = evaluated.env
            played = played if played.env else dataclasses.replace(played, env=trained.env.env)
            if "video" in study.eval_flags and draws_here and played not in drawn:
                check_draws(path, cell, played)
                drawn.add(played)


def parse_cell_command(
    path: str, cell: Cell, what: str, job: CellJob, words: tuple[str, ...], flags_file: Path
) -> Settings:
    """The settings of the cell's ``what`` ("training", "evaluation": ``words`` added to its
    command), with its flags from ``flags_file``, as its run will parse them; StudyError
    (one line naming the cell) where the run would refuse them."""
    from torchbeast.cli import parse_command  # noqa: PLC0415 - only here
    from torchbeast.config.parsers import make_runtime_parser  # noqa: PLC0415

    command = job.command(*words)
    command[command.index("--config") + 1] = str(flags_file)
    parser = make_runtime_parser(cell.study.runtime)
    parser.prog = f"python -m {job.module}"
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            # Its folder is made later: its --video's folder too.
            return parse_command(parser, command[3:], cell.study.runtime, check_files=False)
    except SystemExit:
        lines = refused.getvalue().strip().splitlines()
        line = lines[-1] if lines else "it ends before it runs (exit code 0)"
        reason = line.partition(" error: ")[2].rpartition("; see ")[0] or line
        reason = reason.replace(f"--config {flags_file}: ", "")  # a passing file
        raise StudyError(f"{path}: cell {cell.name}'s {what}: {reason}") from None


def check_draws(path: str, cell: Cell, env: EnvSettings) -> None:
    """Refuses a [eval] video of an env that cannot draw itself here (classic control
    without pygame, an env without render modes): each cell trained, then failed."""
    from torchbeast import envs, video  # noqa: PLC0415 - only here, and only for a video

    try:
        drawing = envs.create_env(env, num_envs=1, render="rgb_array")
        try:
            drawing.reset(seed=0)
            video.as_picture(drawing.frame())
        finally:
            drawing.close()
    except Exception as error:  # the one line its evaluation would have ended with
        raise StudyError(f"{path}: cell {cell.name}'s evaluation: [eval] video: {error}") from None


def refuse_shared_folders(path: str, cells: list[Cell]) -> None:
    """Two cells of one name would share a folder (one skipped as finished, or both
    training into the same files): a repeated value, or values of one folder name."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        if cell.name.endswith(REPLACING):  # another cell's folder, as a cluster replaces it
            raise StudyError(
                f"{path}: the cell {cell.name}'s folder name ends as the folders a Ray "
                f"cluster copies cells back into ({' and '.join(REPLACING)}): give its "
                "axis values another ending"
            )
        if cell.name in seen:
            first, second = (
                ", ".join(f"{axis} = {value!r}" for axis, value in each.labels.items())
                for each in (seen[cell.name], cell)
            )
            raise StudyError(
                f"{path}: the cells {first} and {second} would share the folder {cell.name}: "
                "give each axis distinct values (and each set of flags its own name) that "
                "differ in letters or digits"
            )
        seen[cell.name] = cell


def read_resources(path: str, table: dict) -> Resources:
    """The [resources] table: ``cpus`` (a whole number, at least 1) and ``gpus`` (0 or more;
    a fraction shares a GPU between cells)."""
    resources = dict(table.get("resources", {}))
    unknown = set(resources) - {"cpus", "gpus"}
    if unknown:
        raise StudyError(f"{path}: [resources] has cpus and gpus, not {sorted(unknown)[0]!r}")
    cpus = resources.get("cpus", Resources.cpus)
    gpus = resources.get("gpus", Resources.gpus)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise StudyError(f"{path}: [resources] cpus must be a whole number of at least 1")
    valid = not isinstance(gpus, bool) and isinstance(gpus, (int, float))
    if not valid or not math.isfinite(gpus) or gpus < 0:  # nan passes "< 0"
        raise StudyError(f"{path}: [resources] gpus must be a number of at least 0")
    return Resources(cpus, float(gpus))


def label(value: object) -> object:
    """An axis value as the table and the cell's name show it: a named set of flags (a
    TOML table, e.g. ``{ name = "pacifist", fuel_multiplier = -1.0 }``) by its name."""
    return value["name"] if isinstance(value, dict) else value


def toml_value(value: object) -> str:
    """A flag's value as TOML (a study's values are strings, numbers and booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # TOML's nan, inf, -inf (JSON's NaN is no TOML)
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    raise StudyError("not a flag value: use a string, a number or true/false")


def flag_words(flags: dict[str, object]) -> list[str]:
    """Flags as command-line words: ``--name=value``, a switch as ``--name`` (or none)."""
    words = []
    for name, value in flags.items():
        if isinstance(value, bool):
            words += [f"--{name}"] if value else []
        else:
            words.append(f"--{name}={value}")
    return words


def claim_folder(study: Study) -> Study:
    """Makes the study's folder, or takes it back for the same study (its axes in the
    order the folder has them: a cell's name follows it); another study's folder is
    refused: nothing a study writes may overwrite another's."""
    folder = study.folder
    if (recorded := recorded_study(folder)) is not None:
        recorded_axes = list(recorded["axes"].keys())  # a dict, as written
        if differs := spec_differences(recorded, json.loads(json.dumps(study.spec()))):
            raise StudyError(
                f"{folder} holds another study (its {SPEC_NAME} has other {differs}): give "
                "this study another name (name = ... in the file) or another savedir, or "
                f"move {folder} away to start this one there anew"
            )
        study = dataclasses.replace(study, axes={axis: study.axes[axis] for axis in recorded_axes})
    elif folder.exists() and any(path.name != LOCK_NAME for path in folder.iterdir()):
        raise StudyError(
            f"{folder} holds files of something other than this study: give the study "
            "another name (name = ... in the file), or another savedir"
        )
    folder.mkdir(parents=True, exist_ok=True)
    return study


def recorded_study(folder: Path) -> dict | None:
    """The study that ``folder``'s ``SPEC_NAME`` records, or None where it has none yet."""
    spec_path = folder / SPEC_NAME
    if not spec_path.exists():
        return None
    try:
        recorded = json.loads(spec_path.read_text()).get("study")
        if not isinstance(recorded.get("axes"), dict):
            raise TypeError
        return recorded
    except (ValueError, AttributeError, TypeError, UnicodeDecodeError):
        raise StudyError(  # not JSON, or not ours
            f"{spec_path} is damaged, so which study {folder} holds cannot be told: "
            "restore it (a copy of it), or give this study another name or savedir"
        ) from None


def record_earlier_evaluations(study: Study) -> None:
    """Writes into each finished cell's record, where it has none (a study of an earlier
    release), the evaluations it had: those of the study its folder records, which may
    differ from this one's [eval] (``Cell.finished`` then plays them again). Only under the
    study's lock (``only_run_of``): a command that finds the study running changes nothing."""
    recorded = recorded_study(study.folder)
    if recorded is None:  # a new study's folder: no earlier cells
        return
    earlier = dataclasses.replace(
        study,
        eval_flags=recorded.get("eval", study.eval_flags),
        # A release before random_policy had no random policy's evaluation.
        random_policy=recorded.get("random_policy", False),
    )
    for cell in earlier.cells():
        state = cell.state()
        if state.get("status") == "finished" and "evaluated" not in state:
            write_state(cell.folder, state | {"evaluated": cell.job().evaluation_record()})


# What a study may change and stay the same study: how its cells are evaluated (finished
# cells play again, ``Cell.finished``), not how they train.
EVALUATION_KEYS = ("eval", "random_policy")
# What a study's cells ran with before its folder recorded the key: [resources]'s defaults.
BEFORE_THEIR_KEY = {"resources": dataclasses.asdict(Resources())}


def spec_differences(recorded: dict, spec: dict) -> str:
    """What makes ``spec`` another study than the ``recorded`` one ("flags, axes"), or ""
    for the same: an axis's values in another order are the same values."""

    def as_set(values: list) -> list[str]:
        # A set's flags with dashes, as an earlier release recorded them, are the same flags.
        return sorted(
            json.dumps(
                {k.replace("-", "_"): v for k, v in value.items()}
                if isinstance(value, dict)
                else value,
                sort_keys=True,
            )
            for value in values
        )

    differs = []
    for key in spec:
        if key in EVALUATION_KEYS:
            continue
        if key == "axes":
            same = {a: as_set(v) for a, v in recorded["axes"].items()} == {
                a: as_set(v) for a, v in spec["axes"].items()
            }
        elif key == "flags":  # not where the study is: the folder it is read from says that
            same = without_savedir(recorded.get(key)) == without_savedir(spec[key])
        else:  # a key the release that wrote it had not: what its cells ran with
            same = recorded.get(key, BEFORE_THEIR_KEY.get(key)) == spec[key]
        if not same:
            differs.append("[resources]" if key == "resources" else key)
    return ", ".join(differs)


def without_savedir(flags: object) -> object:
    """A study's flags but its savedir: the same folder spelled another way ("runs/" and
    "runs"), or the study moved with its folder to another disk, is the same study."""
    return {k: v for k, v in flags.items() if k != "savedir"} if isinstance(flags, dict) else flags


@contextlib.contextmanager
def only_run_of(study: Study) -> Iterator[None]:
    """Holds the study's folder for this command: the same study started twice at once
    would train each cell twice, into the same files."""
    with open(study.folder / LOCK_NAME, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StudyError(
                f"the study in {study.folder} is running already (another python -m "
                "torchbeast.study): wait for it to end, or stop it (Ctrl-C) and start again"
            ) from None
        yield


class Executor(Protocol):
    """Where a study's cells run: this machine (``LocalCells``) or a Ray cluster
    (``study_cluster.ClusterCells``)."""

    parallel: int  # cells handed to it at once
    where: str  # for the study's first line: "2 at a time on this machine"
    starting: str  # what a cell handed to it does first: "training, then evaluating"

    def run(self, cell: Cell, started: Callable[[], None]) -> dict | None:
        """Trains and evaluates ``cell`` (its flags file written), calling ``started`` as
        it starts (on a cluster, once a node has taken it); its record, or None when
        stopped."""
        ...

    def stop(self) -> None:
        """Asks every running cell to stop (they checkpoint); starts no more."""
        ...


class LocalCells:
    """Cells on this machine, ``parallel`` at a time, each in its own subprocesses."""

    def __init__(self, parallel: int):
        self.parallel = parallel
        self.where = f"{parallel} at a time on this machine"
        self.starting = "training, then evaluating"
        self.lock = threading.Lock()
        self.running: set[CellProcess] = set()
        self.stopping = False

    def run(self, cell: Cell, started: Callable[[], None]) -> dict | None:
        process = CellProcess()
        with self.lock:
            if self.stopping:
                return None
            self.running.add(process)
        started()
        try:
            return train_and_evaluate(cell.job(), process)
        finally:
            with self.lock:
                self.running.discard(process)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for process in self.running:
                process.stop()


def say(text: str) -> None:
    """A line on the console; a console that went away (``| head``) costs no cell: the
    table and each cell's log hold it all."""
    try:
        print(text, flush=True)
    except OSError:  # BrokenPipeError: nobody reads it; the next lines (and the exit's
        with contextlib.suppress(OSError):  # flush) go nowhere rather than fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@dataclasses.dataclass
class Progress:
    """What the table says of this command's cells besides what their folders hold: which
    run, and the record of each whose folder could not hold it (a file in its place)."""

    running: set[str] = dataclasses.field(default_factory=set)
    unrecorded: dict[str, dict] = dataclasses.field(default_factory=dict)


class Runner:
    """Hands cells to an executor, as many at a time as it takes; ``stop`` (Ctrl-C,
    SIGTERM) starts no more and asks the runs it trains to stop (they checkpoint)."""

    def __init__(
        self, executor: Executor, on_change: Callable[[Progress], None] = lambda progress: None
    ):
        self.executor = executor
        # E.g. rewrite the table, so that it shows progress: called as a cell starts and as
        # it ends.
        self.on_change = on_change
        self.print_lock = threading.Lock()
        self.stopping = threading.Event()
        self.progress = Progress()  # its running: the cells handed to the executor

    def stop(self) -> None:
        self.stopping.set()
        self.executor.stop()

    def say(self, text: str) -> None:
        with self.print_lock:
            say(text)

    def run_cell(self, cell: Cell) -> None:
        if self.stopping.is_set():
            return
        if cell.finished():
            self.say(f"{cell.name}: finished before, skipped")
            return

        def started() -> None:  # the table says it runs (its end says why not)
            with self.print_lock:
                self.progress.running.add(cell.name)
                with contextlib.suppress(OSError):
                    self.on_change(self.progress)

        try:
            cell.write_flags()
            self.say(f"{cell.name}: {self.executor.starting}")
            state = self.executor.run(cell, started)
        except OSError as error:  # its folder unwritable (a full disk): it fails, not the rest
            state = {**earlier_record(cell), "status": "failed", "error": str(error)}
            try:
                write_state(cell.folder, state)
            except OSError:  # the same error again: the table holds it (and the line below)
                self.progress.unrecorded[cell.name] = state
        finally:
            with self.print_lock:
                self.progress.running.discard(cell.name)
        if state is None:
            return  # stopped, not failed: the same command goes on with it
        where = f" on {state['node']}" if "node" in state else ""
        error = f" ({state['error']})" if state.get("error") else ""
        with self.print_lock:
            # The table unwritable (a full disk) costs no other cell; the next write, or the
            # study's last, says so.
            with contextlib.suppress(OSError):
                self.on_change(self.progress)
            say(f"{cell.name}: {state['status']}{where}{error}")

    def run(self, cells: list[Cell]) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(self.executor.parallel)
        futures = [pool.submit(self.run_cell, cell) for cell in cells]
        try:
            for future in futures:
                future.result()
        except BaseException:  # Ctrl-C or SIGTERM: the runs checkpoint, nothing new starts
            # A second signal (Ctrl-C twice; `timeout`, which signals the study and then
            # its group) left here at once, and the runs died mid-checkpoint with it.
            with further_stops_said(
                "stopping: the runs are writing their checkpoints (a moment; kill -9 loses "
                "what they learned since their last)"
            ):
                self.stop()
                pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def cell_row(cell: Cell, progress: Progress | None = None) -> dict[str, object]:
    """One row of the study's table: the cell's settings, how it ended (or "running",
    where ``progress`` runs it), what it learned."""
    progress = progress or Progress()
    running = progress.running
    state = progress.unrecorded.get(cell.name) or cell.state()
    # A cell with logs and no record, not running, was stopped before it could write one
    # (a second Ctrl-C): it trained, it is not "not run".
    started = (cell.folder / LOGS_NAME).exists()
    status = state.get("status", "stopped" if started else "not run")
    if cell.name in running:
        status = "running"
    row: dict[str, object] = {"cell": cell.name, **cell.labels}
    row.update(status=status, error=state.get("error") or "")
    row["seconds"] = state.get("seconds", math.nan)
    if "node" in state:  # where a cluster ran it
        row["node"] = state["node"]
    try:
        logs = read_logs(cell.folder)
        _, returns = return_last_100_curve(logs)
        row["steps"] = int(logs["step"][-1])
        row["train_return_last_100"] = float(returns[-1]) if returns.size else math.nan
        # The best so far at the last row: NaN where 100 episodes never ended.
        row["train_return_best_100"] = float(best_last_100_curve(logs)[-1])
    except (OSError, ValueError, KeyError, IndexError):
        pass
    evaluations = [("eval.json", "eval_")]
    if cell.study.random_policy:  # one of an earlier [eval] with it stays unread
        evaluations.append(("eval_random.json", "random_"))
    for file, prefix in evaluations:
        try:
            report = json.loads((cell.folder / file).read_text())
        except (OSError, ValueError):
            continue
        if "parameters" in report:
            row["parameters"] = report["parameters"]
        for name, figure in report.items():
            if isinstance(figure, dict) and "mean" in figure:
                row[f"{prefix}{name}"] = figure["mean"]
                row[f"{prefix}{name}_std"] = figure.get("std")
    return row


def write_table(study: Study, cells: list[Cell], progress: Progress | None = None) -> list[dict]:
    """The study's table, CSV and JSON, in its folder (``progress``: this command's); returns
    its rows."""
    rows = [cell_row(cell, progress) for cell in cells]
    columns = list(dict.fromkeys(name for row in rows for name in row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_whole(study.folder / TABLE_NAME, text.getvalue())
    # NaN figures (no 100 episodes yet, a cell not run) as null; the axes' values as given,
    # the spec's and the rows' alike (the study is known by them, the plots match them).
    figures = [{k: v if k in study.axes else json_safe(v) for k, v in row.items()} for row in rows]
    spec = {"study": study.spec(), "cells": figures}
    write_whole(study.folder / SPEC_NAME, json.dumps(spec, indent=2, default=str) + "\n")
    return rows


def default_parallel(study: Study) -> int:
    """Cells at once on this machine: as many as its cores hold cells of the study's CPUs."""
    return max(1, len(os.sched_getaffinity(0)) // study.resources.cpus)


@contextlib.contextmanager
def executor_for(study: Study, args: argparse.Namespace, cells: int) -> Iterator[Executor]:
    """This machine's cells, or the Ray cluster's (joined here, left at the end)."""
    if args.ray_address is None:
        parallel = args.parallel or default_parallel(study)
        yield LocalCells(parallel)
        return
    from torchbeast import study_cluster  # imports Ray only for a study on a cluster

    with study_cluster.cluster_cells(study, args.ray_address, args.files, cells) as executor:
        yield executor


def make_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="python -m torchbeast.study",
        description="Train, evaluate and tabulate a grid of runs described by a study file.",
    )
    parser.add_argument("study", help="the study file (TOML)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="cells trained at once on this machine (default: its cores divided by the "
        "cells' [resources] cpus, 2 unless the study file says)",
    )
    parser.add_argument(
        "--ray_address",
        default=None,
        metavar="HOST:PORT",
        help="run the cells on this Ray cluster (or auto), each on a node with its "
        "[resources] free, instead of on this machine",
    )
    parser.add_argument(
        "--files",
        choices=("auto", "shared", "copy"),
        default="auto",
        help="on a Ray cluster: shared, every node sees the study's folder at its path "
        "(shared storage); copy, a cell's folder travels to its node and back; auto "
        "(default), shared where the node sees it, else copy",
    )
    return parser


def run_study(args: argparse.Namespace) -> tuple[Study, list[dict]]:
    """Runs the study the command line names; the study and its table's rows. The table
    is written as each cell ends, and when the study is stopped (KeyboardInterrupt)."""
    study = read_study(args.study)
    if args.parallel is not None and args.ray_address is not None:
        raise StudyError(
            "--parallel is for this machine; on a Ray cluster (--ray_address) "
            "Ray runs as many cells as its nodes have [resources] for"
        )
    if args.files != "auto" and args.ray_address is None:  # it was ignored
        raise StudyError(
            f"--files {args.files} says where a Ray cluster's cells keep their folders: give "
            "--ray_address too, or leave --files out (on this machine they are in place)"
        )
    if args.parallel is not None and args.parallel < 1:
        raise StudyError(f"--parallel must be at least 1, got {args.parallel}")
    check_cells(args.study, study, draws_here=args.ray_address is None)
    made_folder = not study.folder.exists()
    study = claim_folder(study)
    cells = study.cells()
    progress = Progress()
    try:
        with only_run_of(study):
            for cell in cells:
                finish_replacing(cell.folder)
            record_earlier_evaluations(study)
            try:
                with executor_for(study, args, len(cells)) as executor:
                    write_table(study, cells)  # the folder says what it holds from the start
                    where = f"{executor.where}, in {study.folder}"
                    say(f"Study {study.name}: {len(cells)} cells, {where}")
                    runner = Runner(executor, lambda progress: write_table(study, cells, progress))
                    progress = runner.progress
                    runner.run(cells)
            except KeyboardInterrupt:
                write_table(study, cells, progress)
                raise
            return study, write_table(study, cells, progress)
    finally:
        if made_folder:
            remove_if_unused(study.folder)


def remove_if_unused(folder: Path) -> None:
    """Removes a study's folder this command made and wrote nothing into but its lock (a
    cluster refused it, or Ctrl-C came before the first table): it would otherwise say the
    study was there."""
    with contextlib.suppress(OSError):  # what went wrong before is what the user sees
        if [path.name for path in folder.iterdir()] == [LOCK_NAME]:
            (folder / LOCK_NAME).unlink()
            folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    args = make_parser().parse_args(argv)
    sigterm_as_ctrl_c()
    try:
        study, rows = run_study(args)
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # e.g. savedir under a file, a full disk
        print(f"error: {os_error_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped: run the same command to go on; finished cells are kept", file=sys.stderr)
        return 130
    failed = [row["cell"] for row in rows if row["status"] != "finished"]
    say(f"Table: {study.folder / TABLE_NAME} ({len(rows)} cells)")
    if failed:
        print(
            f"error: {len(failed)} of {len(rows)} cells failed: {', '.join(failed)} "
            f"(their last error line is in the table; the whole output in each {CELL_LOG})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    # As the package's module, not as __main__: the classes the cluster module imports
    # from torchbeast.study (StudyError, CellJob) are then the ones this code uses.
    from torchbeast.study import main as study_main

    sys.exit(study_main())

"""Run folder ``savedir/xpid/``: logs.csv, fields.csv, meta.json, out.log, TensorBoard.

The layout is TorchBeast's: ``logs.csv`` starts with a ``# ``-commented header line and has
one row per learner update; a resumed run appends (with a new header line if the fields
changed). A run that starts afresh where another run left its files (no checkpoint to
resume: ``--disable_checkpoint``, or a deleted model.tar) moves them into
``earlier/<time>/`` first, so that no curve mixes two runs. ``meta.json`` holds flags,
times, versions and the git commit, never the process environment, which may hold secrets.
"""

from __future__ import annotations

import csv
import datetime
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from importlib import metadata

log = logging.getLogger("torchbeast")

VERSIONED_PACKAGES = ("torch", "numpy", "gymnasium", "ale-py", "torchbeast")
# What a run leaves in its folder besides its checkpoint and the files FileWriter names.
EARLIER_RUN_FILES = ("eval.json",)
TENSORBOARD_PREFIX = "events.out.tfevents."


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for package in VERSIONED_PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def git_commit() -> str | None:
    source = os.path.dirname(os.path.abspath(__file__))
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


class FileWriter:
    """Writes the run folder ``savedir/xpid``; ``flags`` (every flag's value) goes into
    meta.json as given, and ``sources`` (where each value came from: default, preset,
    file, command line, derived) beside it. The console's log lines are the caller's to set up."""

    def __init__(
        self,
        savedir: str,
        xpid: str,
        flags: Mapping[str, object],
        tensorboard: bool = True,
        sources: Mapping[str, str] | None = None,
        resuming: bool = False,
    ):
        """``resuming``: the run goes on from its checkpoint, and appends to its files;
        otherwise another run's files in the folder are set aside (``set_aside``)."""
        self.directory = os.path.join(savedir, xpid)
        os.makedirs(self.directory, exist_ok=True)
        self._link_latest(savedir, xpid)
        self.paths = {
            name: os.path.join(self.directory, name)
            for name in ("logs.csv", "fields.csv", "meta.json", "out.log")
        }
        set_aside = None if resuming else self.set_aside_earlier_run()

        self._file_handler = logging.FileHandler(self.paths["out.log"])
        self._file_handler.setFormatter(
            logging.Formatter("[%(levelname)s:%(process)d %(asctime)s] %(message)s")
        )
        log.addHandler(self._file_handler)
        if set_aside is not None:
            log.warning(
                "%s held the files of an earlier run and no checkpoint to resume from: moved "
                "them to %s, so that this run's logs start afresh.",
                self.directory,
                set_aside,
            )

        now = datetime.datetime.now().isoformat()
        previous = self._read_previous_meta()
        self.meta = {
            "flags": dict(flags),
            "sources": dict(sources or {}),
            "date_start": previous.get("date_start", now),
            "dates_resumed": previous.get("dates_resumed", []) + ([now] if previous else []),
            "date_end": None,
            "successful": False,
            "versions": versions(),
            "git_commit": git_commit(),
            "command": sys.argv,
        }
        self._write_meta()

        self.fieldnames: list[str] = []
        self._tick = self._count_rows()  # a resumed run continues the tick count
        self._logs_file = open(self.paths["logs.csv"], "a", newline="")  # noqa: SIM115
        self._tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=self.directory)

    def set_aside_earlier_run(self) -> str | None:
        """Moves an earlier run's files (logs, meta.json, out.log, TensorBoard events,
        eval.json) into ``earlier/<time>/`` of the folder; returns that folder, or None if
        there were none."""
        names = sorted(
            name
            for name in os.listdir(self.directory)
            if name in (*EARLIER_RUN_FILES, *self.paths) or name.startswith(TENSORBOARD_PREFIX)
        )
        if not names:
            return None
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        folder = os.path.join(self.directory, "earlier", stamp)
        os.makedirs(folder)
        for name in names:
            os.replace(os.path.join(self.directory, name), os.path.join(folder, name))
        return folder

    def _read_previous_meta(self) -> dict:
        try:
            with open(self.paths["meta.json"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _count_rows(self) -> int:
        try:
            with open(self.paths["logs.csv"]) as f:
                return sum(1 for line in f if line.strip() and not line.startswith("#"))
        except OSError:
            return 0

    def _link_latest(self, savedir: str, xpid: str) -> None:
        link = os.path.join(savedir, "latest")
        try:
            if os.path.islink(link):
                os.remove(link)
            if not os.path.exists(link):
                os.symlink(xpid, link)
        except OSError as error:
            log.warning("could not point %s at %s: %s", link, xpid, error)

    def _write_meta(self) -> None:
        tmp_path = self.paths["meta.json"] + ".tmp"
        with open(tmp_path, "w") as f:
            json.dump(self.meta, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp_path, self.paths["meta.json"])

    def log(self, stats: dict) -> None:
        """Appends one row to logs.csv and the same scalars to TensorBoard."""
        row = {"_tick": self._tick, "_time": time.time(), **stats}
        self._tick += 1
        new_fields = [key for key in row if key not in self.fieldnames]
        if new_fields:
            self.fieldnames += new_fields
            with open(self.paths["fields.csv"], "w") as f:
                f.write(",".join(self.fieldnames) + "\n")
            self._logs_file.write("# " + ",".join(self.fieldnames) + "\n")
        writer = csv.DictWriter(self._logs_file, fieldnames=self.fieldnames, restval="")
        writer.writerow({key: _cell(value) for key, value in row.items()})
        self._logs_file.flush()
        if self._tensorboard is not None and "step" in stats:
            for key, value in stats.items():
                if key != "step" and isinstance(value, (int, float)) and value == value:
                    self._tensorboard.add_scalar(key, value, stats["step"])

    def close(self, successful: bool = True) -> None:
        self.meta["date_end"] = datetime.datetime.now().isoformat()
        self.meta["successful"] = successful
        self._write_meta()
        self._logs_file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        log.removeHandler(self._file_handler)
        self._file_handler.close()


def _cell(value: object) -> object:
    if isinstance(value, float) and value != value:
        return ""  # NaN: no episode ended in this update
    return value

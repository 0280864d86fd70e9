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
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import metadata

from torchbeast.core.errors import RunFolderError, UserError, write_failure

log = logging.getLogger("torchbeast")

# What a resumed start reads of meta.json, and the type each must have.
META_FIELD_TYPES: dict[str, type] = {
    "flags": dict,
    "seeds": list,
    "date_start": str,
    "dates_resumed": list,
}

VERSIONED_PACKAGES = ("torch", "numpy", "gymnasium", "ale-py", "torchbeast")
# What a run leaves in its folder besides its checkpoint and the files FileWriter names.
EARLIER_RUN_FILES = ("eval.json",)
TENSORBOARD_PREFIX = "events.out.tfevents."
LATEST = "latest"  # savedir/latest: a link to the last run that started there


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
        resumed_step: int | None = None,
        command: Sequence[str] | None = None,
    ):
        """``command``: the command line to record (default ``sys.argv``; the caller hides
        secrets in it). ``resumed_step``: the step of the checkpoint the run goes on from;
        it appends to its files, less the rows of later updates (a run killed before it
        could save them). None: a new run; another run's files in the folder are set aside
        (``set_aside``)."""
        resuming = resumed_step is not None
        self.directory = os.path.join(savedir, xpid)
        os.makedirs(self.directory, exist_ok=True)
        self.paths = {
            name: os.path.join(self.directory, name)
            for name in ("logs.csv", "fields.csv", "meta.json", "out.log")
        }
        if resuming:
            self._refuse_files_not_regular("logs.csv", "meta.json")
        set_aside = None if resuming else self.set_aside_earlier_run()

        self._file_handler = RunLogHandler(self.paths["out.log"])
        self._file_handler.setFormatter(
            logging.Formatter("[%(levelname)s:%(process)d %(asctime)s] %(message)s")
        )
        log.addHandler(self._file_handler)
        self._link_latest(savedir, xpid)  # what it says is in out.log too
        if set_aside is not None:
            log.warning(
                "%s held the files of an earlier run and no checkpoint to resume from: moved "
                "them to %s, so that this run's logs start afresh.",
                self.directory,
                set_aside,
            )

        now = datetime.datetime.now().isoformat()
        previous = self._read_previous_meta()
        # Each start's seed (a start without --seed draws its own: "flags" has this one's).
        earlier = previous.get("seeds") or [previous.get("flags", {}).get("seed")] * bool(previous)
        self.meta = {
            "flags": dict(flags),
            "seeds": [*earlier, dict(flags).get("seed")],
            "sources": dict(sources or {}),
            "date_start": previous.get("date_start", now),
            "dates_resumed": previous.get("dates_resumed", []) + ([now] if previous else []),
            "date_end": None,
            "successful": False,
            "versions": versions(),
            "git_commit": git_commit(),
            "command": list(sys.argv if command is None else command),
        }

        self.fieldnames: list[str] = []
        try:
            if resuming:
                self._drop_partial_row()
                self._drop_rows_after(resumed_step)
            self._tick = self._count_rows()  # a resumed run continues the tick count
        except UnicodeDecodeError:
            raise UserError(
                f"{self.paths['logs.csv']} is not text (damaged): restore it from a copy, or "
                "move it away and the run goes on from its checkpoint with new logs"
            ) from None
        self._logs_file = open(self.paths["logs.csv"], "a", newline="")  # noqa: SIM115
        # After the files it appends to were read: a start that fails on them leaves the
        # earlier start's record (a finished run stays successful).
        self._write_meta()
        self._tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            quiet_tensorboard_write_failures()
            # TensorBoard hides the events of steps after the checkpoint's likewise.
            purge_step = None if resumed_step is None else resumed_step + 1
            self._tensorboard = SummaryWriter(log_dir=self.directory, purge_step=purge_step)

    def _refuse_files_not_regular(self, *names: str) -> None:
        """The files a resumed run reads must be files: a link to a device (/dev/full,
        /dev/zero) was read until memory ran out."""
        for name in names:
            path = self.paths[name]
            if os.path.exists(path) and not os.path.isfile(path):
                raise UserError(
                    f"{path} is no regular file (a folder, or a link to a device): move it "
                    f"away, and the run goes on from its checkpoint with a new {name}"
                )

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
        """The earlier starts' record, as far as it is whole: a field of another type
        (a damaged or hand-edited file) is left out, and said, instead of failing the
        start that reads it; it is written anew as this start's."""
        try:
            with open(self.paths["meta.json"]) as f:
                previous = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            previous = None
        if not isinstance(previous, dict):
            log.warning(
                "%s is damaged (not a JSON object): it is written anew.", self.paths["meta.json"]
            )
            return {}
        damaged = [
            key
            for key, kind in META_FIELD_TYPES.items()
            if key in previous and not isinstance(previous[key], kind)
        ]
        if damaged:
            log.warning(
                "%s is damaged (its %s): written anew without them.",
                self.paths["meta.json"],
                ", ".join(damaged),
            )
        return {key: value for key, value in previous.items() if key not in damaged}

    def _drop_partial_row(self) -> None:
        """Cuts a last row that a failed write (a full disk) left unfinished, so that the
        resumed run's rows start on a line of their own."""
        try:
            with open(self.paths["logs.csv"], "rb+") as f:
                data = f.read()
                if data and not data.endswith(b"\n"):
                    f.truncate(data.rfind(b"\n") + 1)
                    log.warning("logs.csv ended in an unfinished row (a failed write): cut it.")
        except FileNotFoundError:
            pass

    def _drop_rows_after(self, step: int) -> None:
        """Cuts the rows of updates after ``step``, the checkpoint's: a run killed
        between checkpoints logged them, and the resumed run learns those steps again."""
        path = self.paths["logs.csv"]
        try:
            with open(path, newline="") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return
        kept, column = [], None
        for line in lines:
            if line.startswith("# "):
                fields = line[2:].rstrip("\n").split(",")
                column = fields.index("step") if "step" in fields else None
            elif column is not None and line.strip():
                cells = next(csv.reader([line]))
                if len(cells) > column and cells[column].isdigit() and int(cells[column]) > step:
                    continue
            kept.append(line)
        if len(kept) == len(lines):
            return
        tmp_path = path + ".tmp"
        with open(tmp_path, "w", newline="") as f:
            f.writelines(kept)
        os.replace(tmp_path, path)
        log.warning(
            "logs.csv held %d rows of updates after step %d, which the checkpoint does not "
            "hold (the run stopped before it could save them): cut them; this run learns "
            "those steps again.",
            len(lines) - len(kept),
            step,
        )

    def _count_rows(self) -> int:
        try:
            with open(self.paths["logs.csv"]) as f:
                return sum(1 for line in f if line.strip() and not line.startswith("#"))
        except OSError:
            return 0

    def _link_latest(self, savedir: str, xpid: str) -> None:
        link = os.path.join(savedir, LATEST)
        try:
            if os.path.islink(link):
                os.remove(link)
            if not os.path.exists(link):
                os.symlink(xpid, link)
            else:  # a file or folder of a user's: left as it is
                log.warning(
                    "%s is no link but a file or folder of its own: left as it is, so "
                    "--xpid latest does not name this run.",
                    link,
                )
        except OSError as error:
            log.warning("could not point %s at %s: %s", link, xpid, error)

    def _write_meta(self) -> None:
        tmp_path = self.paths["meta.json"] + ".tmp"
        try:
            with open(tmp_path, "w") as f:
                json.dump(self.meta, f, indent=2, sort_keys=True, default=str)
            os.replace(tmp_path, self.paths["meta.json"])
        except BaseException:
            if os.path.exists(tmp_path):
                os.unlink(tmp_path)
            raise

    def log(self, stats: dict) -> None:
        """Appends one row to logs.csv and the same scalars to TensorBoard. A row that
        cannot be written raises RunFolderError (the run stops and keeps its checkpoint);
        TensorBoard, a copy of the same figures, is given up with one warning."""
        row = {"_tick": self._tick, "_time": time.time(), **stats}
        self._tick += 1
        new_fields = [key for key in row if key not in self.fieldnames]
        if new_fields:
            self.fieldnames += new_fields
            try:
                with open(self.paths["fields.csv"], "w") as f:
                    f.write(",".join(self.fieldnames) + "\n")
            except OSError as error:
                raise RunFolderError(
                    f"cannot write {self.paths['fields.csv']} ({write_failure(error)})"
                ) from None
        try:
            if new_fields:
                self._logs_file.write("# " + ",".join(self.fieldnames) + "\n")
            writer = csv.DictWriter(self._logs_file, fieldnames=self.fieldnames, restval="")
            writer.writerow({key: _cell(value) for key, value in row.items()})
            self._logs_file.flush()
        except OSError as error:
            raise RunFolderError(
                f"cannot write {self.paths['logs.csv']} ({write_failure(error)})"
            ) from None
        if self._tensorboard is not None and "step" in stats:
            try:
                for key, value in stats.items():
                    if key != "step" and isinstance(value, (int, float)) and value == value:
                        self._tensorboard.add_scalar(key, value, stats["step"])
            except Exception as error:  # its writer thread's failure surfaces here
                log.warning(
                    "TensorBoard's events in %s could not be written (%s): no more are; "
                    "logs.csv holds the same figures.",
                    self.directory,
                    write_failure(error),
                )
                self._close_tensorboard()

    def _close_tensorboard(self) -> None:
        tensorboard, self._tensorboard = self._tensorboard, None
        try:
            tensorboard.close()
        except Exception:  # already said why it failed
            pass

    def close(self, successful: bool = True) -> None:
        """Records the end in meta.json and closes every file; where the folder cannot
        be written any more (a full disk), says so once and closes the rest."""
        self.meta["date_end"] = datetime.datetime.now().isoformat()
        self.meta["successful"] = successful
        for name, close in (
            ("meta.json", self._write_meta),
            ("logs.csv", self._logs_file.close),
        ):
            try:
                close()
            except OSError as error:
                log.warning("Could not finish %s (%s).", name, write_failure(error))
        if self._tensorboard is not None:
            self._close_tensorboard()
        log.removeHandler(self._file_handler)
        self._file_handler.close()


_tensorboard_quieted = False  # the hook below is installed once per process


def quiet_tensorboard_write_failures() -> None:
    """TensorBoard writes its events in a thread of its own, which ends with a traceback on
    stderr where a write fails (a full disk); FileWriter.log says it in one line instead,
    when the failure surfaces in the next add_scalar."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    global _tensorboard_quieted
    if _tensorboard_quieted:
        return
    _tensorboard_quieted = True
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.thread, _AsyncWriterThread) and issubclass(args.exc_type, OSError)):
            previous(args)

    threading.excepthook = hook


class RunLogHandler(logging.FileHandler):
    """out.log. A record it cannot write is said once on stderr (the console keeps every
    line), not with a traceback per record as logging's handler does."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):  # a bad format string: logging's own report
            super().handleError(record)
            return
        if not self.failed:
            self.failed = True
            reason = write_failure(error)
            print(
                f"torchbeast: cannot write {self.baseFilename} ({reason}): the console "
                "keeps the log.",
                file=sys.stderr,
            )

    def close(self) -> None:
        """Closes out.log; a last flush it cannot write was said (or is said now) once,
        and ends nothing: the run's other files are whole."""
        try:
            super().close()
        except OSError as error:
            if not self.failed:
                self.failed = True
                print(
                    f"torchbeast: cannot write {self.baseFilename} ({write_failure(error)}): "
                    "the console keeps the log.",
                    file=sys.stderr,
                )


def _cell(value: object) -> object:
    if isinstance(value, float) and value != value:
        return ""  # NaN: no episode ended in this update
    return value

"""Light copies of run logs, for a repository or a paper's supplement: one row per
``--every_steps`` agent steps instead of one per update (a 5M-step run: ~500 rows, tens of
KB gzipped, against ~60,000 rows and ~10 MB).

    python -m torchbeast.lightlog ~/logs/torchbeast/RUN docs/runs/RUN.logs.csv.gz

Each row of the light log sums the rows of its span of steps: ``episodes`` is their sum,
each ``mean_episode_*`` figure the mean over every episode that ended in the span (weighted
by the episodes of each row), every other column (losses, diagnostics, learning rate) the
mean of the span's rows; ``_tick``, ``_time``, ``step`` are those of the span's last row,
and so are two running figures: ``mean_return_last_100`` (the console's mean of the last
100 episodes; for logs older than that column, computed from whole rows as
``curves.last_episodes_mean`` does) and ``best_mean_return_last_100`` (the best of those
so far, over rows where 100 episodes had ended). So the mean return of the last 100
episodes at any multiple of ``--every_steps``, and the best of the run, read from the light
log exactly as from the full one; a step where a curve first crosses a level, to within a
span. ``torchbeast.plot`` and ``curves.read_logs`` read both kinds of log.

The rule for the logs committed to this repository: light logs only, made with this
command at its default span (10,000 agent steps), named ``docs/runs/<run>.logs.csv.gz``.
"""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from pathlib import Path

import numpy as np

from torchbeast.config.argparser import FlagParser
from torchbeast.config.values import positive_int
from torchbeast.core.files import replaced_whole
from torchbeast.curves import (
    BEST_COLUMN,
    LAST_100_COLUMN,
    LOGS_NAME,
    LogsError,
    best_last_100_curve,
    last_100_column,
    read_logs_checked,
)
from torchbeast.entry import work_begins

# Columns taken from a span's last row: its place, and the running figures (the mean of
# the last 100 episodes is the console's figure at that row already, the best so far too).
LAST_OF_SPAN = ("_tick", "_time", "step", LAST_100_COLUMN, BEST_COLUMN)


def with_running_figures(logs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``logs`` with the console's mean of the last 100 episodes in every row (computed
    from whole rows, ``curves.last_episodes_mean``, where the run did not log it), and the
    best such mean so far (``BEST_COLUMN``, ``curves.best_last_100_curve``), so that a
    light log keeps them exact at each span's end."""
    return logs | {LAST_100_COLUMN: last_100_column(logs), BEST_COLUMN: best_last_100_curve(logs)}


def thin(logs: dict[str, np.ndarray], every_steps: int) -> dict[str, np.ndarray]:
    """``logs`` (``read_logs``' columns) with one row per span of ``every_steps`` steps."""
    steps = logs["step"]
    keep = np.isfinite(steps)
    if not keep.any():
        raise ValueError("the log has no rows with a step")
    logs = with_running_figures({name: values[keep] for name, values in logs.items()})
    span = np.ceil(logs["step"] / every_steps)
    # Consecutive rows of one span form a group (a resumed run's rows follow its own).
    starts = np.flatnonzero(np.r_[True, span[1:] != span[:-1]])
    ends = np.r_[starts[1:], span.size]
    # Logs without an episode count (the original's) weigh each row alike.
    episodes = np.nan_to_num(logs["episodes"]) if "episodes" in logs else np.ones(span.size)
    light: dict[str, list[float]] = {name: [] for name in logs}
    for start, end in zip(starts, ends, strict=True):
        count = episodes[start:end]
        for name, values in logs.items():
            part = values[start:end]
            if name in LAST_OF_SPAN:
                value = part[-1]
            elif name == "episodes":
                value = count.sum()
            elif name.startswith("mean_episode_"):
                weights = np.where(np.isfinite(part), count, 0.0)
                total = weights.sum()
                value = float(np.nansum(part * weights) / total) if total > 0 else math.nan
            else:
                finite = part[np.isfinite(part)]
                value = float(finite.mean()) if finite.size else math.nan
            light[name].append(value)
    return {name: np.asarray(values, dtype=np.float64) for name, values in light.items()}


def write_logs(logs: dict[str, np.ndarray], path: str | Path) -> None:
    """``logs`` as a ``logs.csv`` (gzipped where ``path`` ends in .gz): one ``# `` header.
    Written whole or not at all: a Ctrl-C or a full disk midway leaves the file that was
    there (a light log of docs/runs being refreshed), not half of the new one."""
    path = Path(path)
    names = list(logs)
    opener = gzip.open if path.suffix == ".gz" else open
    with replaced_whole(path) as temporary, opener(temporary, "wt", newline="") as f:
        f.write("# " + ",".join(names) + "\n")
        for row in zip(*(logs[name] for name in names), strict=True):
            f.write(",".join("" if math.isnan(value) else f"{value:.10g}" for value in row))
            f.write("\n")


def make_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="python -m torchbeast.lightlog", description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", help="a run's folder or its logs.csv (or a .gz copy)")
    parser.add_argument("out", help="the light log to write (.gz: gzipped)")
    parser.add_argument(
        "--every_steps",
        type=positive_int,
        default=10_000,
        help="agent steps per row (default: 10000)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        full = read_logs_checked(args.logs)
        source = Path(args.logs).expanduser()
        source = source / LOGS_NAME if source.is_dir() else source
        out = Path(args.out).expanduser()
        if out.exists() and out.resolve() == source.resolve():
            raise LogsError(f"{args.out} is the log being read: give the light log another path")
        try:
            light = thin(full, args.every_steps)
        except ValueError as error:
            raise LogsError(f"{args.logs}: {error}") from None
        try:
            write_logs(light, out)
        except OSError as error:
            raise LogsError(
                f"cannot write {args.out}: {error.strerror or error}; give a writable path"
            ) from None
    except LogsError as error:
        print(f"lightlog: error: {error}", file=sys.stderr)
        return 2
    size = out.stat().st_size
    print(f"{args.out}: {light['step'].size} rows from {full['step'].size}, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Learning curves from the ``logs.csv`` files that training runs write: reading a run's
logs into columns, and turning them into (steps, value) curves, smoothed or as SPS."""

from __future__ import annotations

import csv
import gzip
import math
import os
from pathlib import Path

import numpy as np

LOGS_NAME = "logs.csv"
SPS_WINDOW_S = 10.0  # seconds of log rows each SPS point averages over
RETURN_WINDOW = 100  # episodes: the console's "mean return (last 100 episodes)"
# The console's running figures, as runs since 2026-11-27 log them in every row.
LAST_100_COLUMN = "mean_return_last_100"
# The best of them so far, once 100 episodes had ended (a light log's own column).
BEST_COLUMN = "best_mean_return_last_100"


def _to_float(cell: str) -> float:
    cell = cell.strip()
    return float(cell) if cell else math.nan


def read_logs(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read a torchbeast ``logs.csv`` (or the run folder holding it, or a gzipped copy
    such as the ``docs/runs/*.logs.csv.gz`` the manual's curves come from).

    Returns one float array per column, all of the same length (one entry per
    data row). Empty cells are NaN. Every ``# `` line is a header whose field
    names apply to the rows after it, as a resumed run appends a new header;
    columns a row's header lacks are NaN for that row. A last line without its
    newline is a row cut off as it was written (a crash, a full disk, a live run
    read mid-row): it is left out, as the run leaves it out when it resumes,
    since its last cell may be part of a number (3 of 3000).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / LOGS_NAME
    rows: list[dict[str, float]] = []
    columns: dict[str, None] = {}  # ordered set of every field name seen
    fields: list[str] | None = None
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip() or not line.endswith("\n"):  # blank, or cut off
                continue
            if line.startswith("#"):
                fields = [name.strip() for name in line[1:].strip().split(",")]
                columns.update(dict.fromkeys(fields))
                continue
            if fields is None:
                raise ValueError(f"{path}:{lineno}: data row before any '# ' header line")
            cells = next(csv.reader([line]))
            if len(cells) > len(fields):
                raise ValueError(
                    f"{path}:{lineno}: {len(cells)} cells but the header names {len(fields)}"
                )
            # A short row (e.g. cut off by a crash) leaves its last columns NaN.
            pairs = zip(fields, cells, strict=False)
            try:
                rows.append({name: _to_float(cell) for name, cell in pairs})
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
    return {
        name: np.array([row.get(name, math.nan) for row in rows], dtype=np.float64)
        for name in columns
    }


class LogsError(Exception):
    """A logs file that cannot be read as one, said in one line with what to do."""


def read_logs_checked(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """``read_logs`` of a logs file or a run folder, with each way it can fail said in one
    line (``LogsError``): no such file, not text, not gzip, cut short, a bad row, no step
    column, no rows."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / LOGS_NAME
    if not path.is_file():
        raise LogsError(
            f"{path} does not exist: pass a run's folder or its {LOGS_NAME} (a run writes "
            "it at its first update)"
        )
    try:
        logs = read_logs(path)
    except UnicodeDecodeError:
        raise LogsError(f"{path} is not a text file: pass a torchbeast {LOGS_NAME}") from None
    except EOFError:
        raise LogsError(f"{path} is cut short (an incomplete gzip file): copy it again") from None
    except ValueError as e:
        raise LogsError(f"cannot read {e}: fix or remove that line") from None
    except OSError as e:
        raise LogsError(f"cannot read {path}: {e.strerror or e}") from None
    if not logs:  # a run writes its logs.csv empty as it starts, its header with a row
        raise LogsError(
            f"{path} is empty: its run has made no learner update yet (wait for it), or "
            f"it is no torchbeast {LOGS_NAME}"
        )
    if "step" not in logs:
        raise LogsError(f"{path} has no 'step' column: pass a torchbeast {LOGS_NAME}")
    if logs["step"].size == 0:
        raise LogsError(
            f"{path} has no rows yet: wait for the first learner update, "
            "or check that training is running"
        )
    return logs


def load_logs(path: str | os.PathLike[str]):
    """A run's ``logs.csv`` (its folder, or a gzipped copy) as a pandas DataFrame: one
    row per update, numbers as floats, the ``# `` headers of a resumed run read as
    headers. (``pandas.read_csv`` alone would name the first column ``# _tick`` and read a
    repeated header as a row.)"""
    try:
        import pandas
    except ImportError:
        raise ImportError("load_logs needs pandas: pip install pandas") from None
    return pandas.DataFrame(read_logs(path))


def last_episodes_mean(logs: dict[str, np.ndarray], count: int = RETURN_WINDOW) -> np.ndarray:
    """At each row, the mean return of the last ``count`` episodes, from the rows' episode
    counts and mean returns: whole rows back until ``count`` episodes ended (all of them
    while fewer have); NaN until one has. The figure of logs without the console's own
    column (``LAST_100_COLUMN``), and of the learning checks."""
    rows = logs["step"].size if "step" in logs else len(next(iter(logs.values()), []))
    returns = logs.get("mean_episode_return", np.full(rows, math.nan))
    # Logs without an episode count (the original's) weigh each row's mean alike.
    episodes = np.nan_to_num(logs["episodes"]) if "episodes" in logs else np.ones(rows)
    ended = np.where(np.isfinite(returns), episodes, 0.0)
    total_episodes = np.cumsum(ended)  # [rows]
    total_returns = np.cumsum(np.nan_to_num(returns) * ended)
    # The row before the window: the last whose total leaves ``count`` episodes after it.
    before = np.searchsorted(total_episodes, total_episodes - count, side="right") - 1
    start_episodes = np.where(before >= 0, total_episodes[before.clip(min=0)], 0.0)
    start_returns = np.where(before >= 0, total_returns[before.clip(min=0)], 0.0)
    seen = total_episodes - start_episodes
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seen > 0, (total_returns - start_returns) / seen, math.nan)


def last_100_column(logs: dict[str, np.ndarray]) -> np.ndarray:
    """At each row, the mean return of the last 100 episodes, the console's figure: its
    ``LAST_100_COLUMN`` where the run logged it, else ``last_episodes_mean``."""
    computed = last_episodes_mean(logs)
    logged = logs.get(LAST_100_COLUMN)
    return computed if logged is None else np.where(np.isfinite(logged), logged, computed)


def return_last_100_curve(logs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Steps and the mean return of the last 100 episodes (``last_100_column``), at the
    rows that have both."""
    values = last_100_column(logs)
    steps = logs["step"]
    keep = np.isfinite(steps) & np.isfinite(values)
    return steps[keep], values[keep]


def best_last_100_curve(logs: dict[str, np.ndarray]) -> np.ndarray:
    """At each row, the best mean return of the last 100 episodes so far (the figure of
    ``return_last_100_curve``), over the rows where 100 episodes had ended: NaN before
    (a mean of the first few episodes is no mean of 100). A light log's ``BEST_COLUMN``
    counts too: its spans' bests are the exact ones."""
    last_100 = last_100_column(logs)
    # Logs without an episode count (the original's) count a row as one episode, as
    # ``last_episodes_mean`` does.
    episodes = np.nan_to_num(logs["episodes"]) if "episodes" in logs else np.ones(last_100.size)
    reached = (episodes > 0) & (np.cumsum(episodes) >= RETURN_WINDOW) & np.isfinite(last_100)
    best = np.fmax.accumulate(np.where(reached, last_100, math.nan))
    return np.fmax(best, logs[BEST_COLUMN]) if BEST_COLUMN in logs else best


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling mean over ``window`` points (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    values = np.asarray(values, dtype=np.float64)
    if window == 1 or values.size == 0:
        return values.copy()
    sums = np.cumsum(values)
    sums[window:] = sums[window:] - sums[:-window]
    counts = np.minimum(np.arange(1, values.size + 1), window)
    return sums / counts


def sps_curve(
    logs: dict[str, np.ndarray], window_s: float = SPS_WINDOW_S
) -> tuple[np.ndarray, np.ndarray]:
    """Steps and steps per second.

    Uses the ``sps`` column where it has a value; otherwise SPS is the step increase over
    the rows logged in the last ``window_s`` seconds (single updates are too bursty to
    read). Points without a value, or across a restart, are dropped.
    """
    steps = logs["step"]
    computed = np.full_like(steps, math.nan)
    if "_time" in logs and steps.size > 1:
        times = logs["_time"]
        start = np.searchsorted(times, times - window_s, side="left")
        start = np.minimum(start, np.arange(steps.size) - 1).clip(min=0)
        d_step = steps - steps[start]
        d_time = times - times[start]
        # A window reaching back much further than the rows come spans a restart: its
        # steps over the downtime would draw a dip to ~0 that the run never had.
        spaced = np.diff(times)
        typical = np.nanmedian(spaced) if np.isfinite(spaced).any() else 0.0
        restart = d_time > max(window_s, 10 * typical)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = d_step / d_time
            computed = np.where((d_time > 0) & (d_step > 0) & ~restart, rate, math.nan)
    sps = logs["sps"] if "sps" in logs else computed
    sps = np.where(np.isfinite(sps), sps, computed)
    keep = np.isfinite(steps) & np.isfinite(sps)
    return steps[keep], sps[keep]


def column_curve(
    logs: dict[str, np.ndarray], column: str, window: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Steps and one column, NaN rows dropped, then smoothed over ``window``."""
    steps = logs["step"]
    values = logs.get(column, np.full_like(steps, math.nan))
    keep = np.isfinite(steps) & np.isfinite(values)
    return steps[keep], smooth(values[keep], window)

"""Light copies of run logs, for a repository or a paper's supplement: one row per
``--every_steps`` agent steps instead of one per update (a 5M-step run: ~500 rows, tens of
KB gzipped, against ~60,000 rows and ~10 MB).

    python -m torchbeast.lightlog ~/logs/torchbeast/RUN docs/runs/RUN.logs.csv.gz

Each row of the light log sums the rows of its span of steps: ``episodes`` is their sum,
each ``mean_episode_*`` figure the mean over every episode that ended in the span (weighted
by the episodes of each row), ``_tick``, ``_time`` and ``step`` those of the span's last
row, and every other column (losses, diagnostics, learning rate) the mean of the span's
rows. So a curve of the mean return, and the mean of the last N episodes at a span's end,
read from the light log as from the full one; ``torchbeast.plot`` and ``curves.read_logs``
read both. The README's committed logs follow this rule.
"""

from __future__ import annotations

import argparse
import gzip
import math
from pathlib import Path

import numpy as np

from torchbeast.config.values import positive_int
from torchbeast.curves import read_logs

LAST_OF_SPAN = ("_tick", "_time", "step")


def thin(logs: dict[str, np.ndarray], every_steps: int) -> dict[str, np.ndarray]:
    """``logs`` (``read_logs``' columns) with one row per span of ``every_steps`` steps."""
    steps = logs["step"]
    keep = np.isfinite(steps)
    if not keep.any():
        raise ValueError("the log has no rows with a step")
    logs = {name: values[keep] for name, values in logs.items()}
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
    """``logs`` as a ``logs.csv`` (gzipped where ``path`` ends in .gz): one ``# `` header."""
    path = Path(path)
    names = list(logs)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="") as f:
        f.write("# " + ",".join(names) + "\n")
        for row in zip(*(logs[name] for name in names), strict=True):
            f.write(",".join("" if math.isnan(value) else f"{value:.10g}" for value in row))
            f.write("\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", help="a run's folder or its logs.csv (or a .gz copy)")
    parser.add_argument("out", help="the light log to write (.gz: gzipped)")
    parser.add_argument(
        "--every_steps",
        type=positive_int,
        default=10_000,
        help="agent steps per row (default: 10000)",
    )
    args = parser.parse_args(argv)
    full = read_logs(args.logs)
    try:
        light = thin(full, args.every_steps)
    except ValueError as error:
        parser.exit(2, f"lightlog: error: {args.logs}: {error}\n")
    write_logs(light, args.out)
    size = Path(args.out).stat().st_size
    print(f"{args.out}: {light['step'].size} rows from {full['step'].size}, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()

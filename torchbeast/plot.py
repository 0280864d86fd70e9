"""Plot learning curves from the ``logs.csv`` files that training runs write.

Usage::

    python -m torchbeast.plot --xpid pong_1 [--xpid pong_2 ...] [--savedir DIR]
    python -m torchbeast.plot path/to/run_dir_or_logs.csv ... [--out curves.png]
    python -m torchbeast.plot docs/runs/breakout_5m.logs.csv.gz  # a committed log

The figure has two panels sharing the x axis (agent steps): the mean return of the
last 100 episodes on top, steps per second (SPS) below: the figures of the console's
progress line, which logs.csv records in every row (``curves.return_last_100_curve``
computes the first from the rows' episode counts for logs older than that). Each run
is one line, labelled by its folder name (the xpid) or by ``--label``.
``--diagnostics`` adds the learner's health: policy entropy, KL between learner and
behaviour policies, clipped importance weights, policy lag, the value function's
explained variance and the gradient norm. The logs are read, and the curves made, by
``torchbeast.curves``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from torchbeast.config.argparser import FlagParser
from torchbeast.core.files import replaced_whole
from torchbeast.curves import (
    LOGS_NAME,
    LogsError,
    column_curve,
    read_logs_checked,
    return_last_100_curve,
    smooth,
    sps_curve,
)
from torchbeast.entry import work_begins

DEFAULT_SAVEDIR = "~/logs/torchbeast"
DEFAULT_SMOOTH = 1  # the 100-episode mean needs none
FIGSIZE = (8.0, 6.0)  # inches
DPI = 100


class PlotError(Exception):
    """A problem the user can fix; its message is printed as one line."""


@dataclass
class Run:
    """One run to plot: its label (the xpid), its folder and its logs file."""

    label: str
    folder: Path
    logs_path: Path


# logs.csv column -> axis label of the --diagnostics panels.
DIAGNOSTICS = {
    "policy_entropy": "policy entropy (nats)",
    "policy_kl": "KL(learner || behaviour)",
    "clipped_rho_fraction": "clipped importance weights",
    "policy_lag": "policy lag (updates)",
    "explained_variance": "explained variance",
    "grad_norm": "gradient norm (before clip)",
}

# Axis labels of other columns that --column may name (any other is labelled by its name).
COLUMN_LABELS = {
    "mean_episode_length": "episode length (agent steps)",
    "mean_episode_true_return": "true return (game score)",
    "mean_episode_true_move": "true move",
}


def plot_runs(
    runs: dict[str, dict[str, np.ndarray]],
    out: Path,
    window: int,
    diagnostics: bool = False,
    extra_columns: tuple[str, ...] = (),
) -> None:
    """Draw the figure for ``runs`` (label -> logs) into the PNG ``out``: return and SPS,
    with ``diagnostics`` one panel per :data:`DIAGNOSTICS` column, then one panel per
    column of ``extra_columns``."""
    labels = dict(DIAGNOSTICS) if diagnostics else {}
    labels.update({column: COLUMN_LABELS.get(column, column) for column in extra_columns})
    panels = 2 + len(labels)
    columns = 2 if panels > 3 else 1
    rows = math.ceil(panels / columns)
    fig = Figure(figsize=(FIGSIZE[0] * columns, FIGSIZE[1] * rows / 2), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, sharex=True, squeeze=False).flatten()
    ax_return, ax_sps = axes[0], axes[1]
    for i, (label, logs) in enumerate(runs.items()):
        color = f"C{i % 10}"
        steps, returns = return_last_100_curve(logs)
        ax_return.plot(steps, smooth(returns, window), color=color, label=label)
        ax_sps.plot(*sps_curve(logs), color=color, label=label)
        for ax, column in zip(axes[2:], labels, strict=False):
            ax.plot(*column_curve(logs, column, window), color=color, label=label)
    smoothing = f",\nthen mean of {window} log rows" if window > 1 else ""
    ax_return.set_ylabel(f"mean return (last 100 episodes{smoothing})")
    ax_sps.set_ylabel("steps per second")
    for ax, (column, name) in zip(axes[2:], labels.items(), strict=False):
        ax.set_ylabel(name)
        if column == "explained_variance":
            # Below -1 is just "worse than a constant"; an early spike there would
            # flatten the range that matters, 0 to 1.
            ax.set_ylim(bottom=max(ax.get_ylim()[0], -1.0))
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax in axes[:panels]:
        ax.grid(alpha=0.3)
    for ax in axes[panels - columns : panels]:
        ax.set_xlabel("steps")
    ax_return.legend(loc="best", fontsize="small")
    fig.tight_layout()
    with replaced_whole(out) as temporary:  # an interrupted drawing leaves the last one
        fig.savefig(temporary, format="png")


def _resolve_runs(paths: list[str], xpids: list[str], savedir: str) -> list[Run]:
    """Turn positional paths and ``--xpid`` names into run folders."""
    runs = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise PlotError(f"{path} does not exist: pass a run's folder or its {LOGS_NAME}")
        if path.is_file():
            runs.append(Run(_file_label(path), path.parent, path))
        else:
            runs.append(Run(path.resolve().name, path, path / LOGS_NAME))
    for xpid in xpids:
        if not xpid or xpid in (".", "..") or "/" in xpid:  # a run's name, as --xpid takes
            raise PlotError(
                f"--xpid {xpid!r} is no run's name: give the name a run was trained with "
                "(--xpid NAME), or pass the run's folder"
            )
        folder = Path(savedir).expanduser() / xpid
        if not folder.is_dir():
            raise PlotError(
                f"no run folder {folder}: check --xpid and --savedir "
                f"(default {DEFAULT_SAVEDIR}), or pass the run's folder as a path"
            )
        runs.append(Run(xpid, folder, folder / LOGS_NAME))
    return runs


def once_each(runs: list[Run]) -> list[Run]:
    """One run given twice (the ``latest`` link beside the run it names, in a glob of a
    savedir's folders) drawn once; runs given labels are drawn as given."""
    seen: set[Path] = set()
    unique = []
    for run in runs:
        if run.logs_path.resolve() not in seen:
            seen.add(run.logs_path.resolve())
            unique.append(run)
    return unique


def _file_label(path: Path) -> str:
    """A run's name from its logs file: the folder of a ``logs.csv``, else the file's
    name without ``.logs.csv.gz`` (``docs/runs/breakout_5m.logs.csv.gz``: breakout_5m)."""
    if path.name == LOGS_NAME:
        return path.parent.resolve().name
    name = path.name
    for suffix in (".gz", ".csv", ".logs"):
        name = name.removesuffix(suffix)
    return name


def _load(run: Run) -> dict[str, np.ndarray]:
    """Read a run's logs, turning user-fixable problems into PlotError."""
    from torchbeast.study import SPEC_NAME  # noqa: PLC0415 - a study's, here only

    if not run.logs_path.is_file() and (run.folder / SPEC_NAME).is_file():
        raise PlotError(
            f"{run.folder} holds a study, not a run: draw it with python -m "
            f"torchbeast.study_plot {run.folder}, or pass its cells' folders ({run.folder}/*/)"
        )
    if not run.logs_path.is_file():
        raise PlotError(
            f"no {LOGS_NAME} in {run.folder}: train first with "
            f"python -m torchbeast.monobeast --xpid {run.label}, or pass the run's folder"
        )
    try:
        return read_logs_checked(run.logs_path)
    except LogsError as e:
        raise PlotError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="python -m torchbeast.plot",
        description="Plot mean episode return and SPS (and with --diagnostics the "
        "learner's health) against steps for one or more runs.",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help=f"a run's folder or its {LOGS_NAME}"
    )
    parser.add_argument(
        "--xpid",
        action="append",
        default=[],
        help="experiment id of a run under --savedir; repeat for several runs",
    )
    parser.add_argument(
        "--savedir",
        default=DEFAULT_SAVEDIR,
        help="root folder of the runs named by --xpid (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        help="PNG to write (default: curve.png in the run's folder for one run, "
        "./learning_curves.png for several)",
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=DEFAULT_SMOOTH,
        metavar="N",
        help="also smooth every curve but SPS as a rolling mean over the last N log rows "
        "(default: %(default)s, none)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="the legend's name of each run, in the order given (paths, then --xpid); "
        "default: its folder's name, or a committed log's file name",
    )
    parser.add_argument(
        "--diagnostics",
        action="store_true",
        help="also plot policy entropy, KL, clipped importance weights, policy lag, "
        "explained variance and gradient norm",
    )
    parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME",
        help="also plot this logs.csv column, e.g. mean_episode_length or "
        "mean_episode_true_return; repeat for several",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse already reported
        return e.code if isinstance(e.code, int) else 0
    try:
        if not args.paths and not args.xpid:
            raise PlotError("no run given: pass --xpid XPID or a run's folder")
        if args.smooth < 1:
            raise PlotError(f"--smooth must be at least 1, got {args.smooth}")
        runs = _resolve_runs(args.paths, args.xpid, args.savedir)
        if not args.label:
            runs = once_each(runs)
        else:
            if len(args.label) != len(runs):
                raise PlotError(
                    f"{len(args.label)} --label for {len(runs)} runs: give one per run, "
                    "in the order of the paths, then the --xpid"
                )
            runs = [
                dataclasses.replace(run, label=label)
                for run, label in zip(runs, args.label, strict=True)
            ]
        labels = [run.label for run in runs]
        if twice := next((label for label in labels if labels.count(label) > 1), None):
            raise PlotError(
                f"two runs have the label {twice}: name them apart with --label (one per run)"
            )
        logs = {run.label: _load(run) for run in runs}
        if args.out is not None:
            out = Path(args.out).expanduser()
        elif len(runs) == 1:
            out = runs[0].folder / "curve.png"
        else:
            out = Path("learning_curves.png")
        if out.suffix.lower() != ".png":
            raise PlotError(f"--out {out} must end in .png: the figure is written as a PNG")
        for column in args.column:
            if not any(column in run_logs for run_logs in logs.values()):
                known = sorted(set().union(*logs.values()) - {"_tick", "_time"})
                raise PlotError(f"no run logged --column {column}: use one of {', '.join(known)}")
        for label, run_logs in logs.items():
            if not np.isfinite(run_logs.get("mean_episode_return", np.array([]))).any():
                print(f"note: {label} has no finished episodes yet", file=sys.stderr)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            plot_runs(logs, out, args.smooth, args.diagnostics, tuple(args.column))
        except OSError as e:
            raise PlotError(
                f"cannot write {out}: {e.strerror or e}; pass --out with a writable path"
            ) from None
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

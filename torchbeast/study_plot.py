"""A study's figures, from its table (``study.json``) and its cells' logs.

    python -m torchbeast.study_plot STUDY                    # capacity figure + curves
    python -m torchbeast.study_plot STUDY --table hidden_size fuel_multiplier
    python -m torchbeast.study_plot STUDY --table hidden_size seed --heatmap heat.png

STUDY is the study file or its folder. The capacity figure has one panel per setting of
the axes that are neither capacity (``hidden_size``, ``num_layers``, ``torso``, or
``--capacity``'s) nor ``seed``, e.g. one per reward proxy; in each, every return the
evaluation measured (the proxy return the cells trained on, the true return) against the
model's parameter count on a log scale: one point per seed, a line through the mean
across seeds, and the random policy's level (each cell's random-policy evaluation,
averaged) as a dashed line of the same colour. The curves figure has one panel per cell:
the training return (mean of the last 100 episodes) against steps. ``--table A B`` prints
the mean of one figure (``--figure``, default the true return where there is one) over
the other axes, as a Markdown table of A's values by B's; ``--heatmap FILE`` draws it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from torchbeast.config.argparser import FlagParser
from torchbeast.core.errors import unwritable
from torchbeast.curves import read_logs, return_last_100_curve
from torchbeast.entry import work_begins
from torchbeast.study import SPEC_NAME, StudyError, label, read_study

CAPACITY_AXES = ("hidden_size", "num_layers", "torso", "use_resnet", "use_lstm")
SEED_AXIS = "seed"
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def load_study(path: str) -> tuple[Path, dict, list[dict]]:
    """The study's folder, its description and its table's rows, from the study file or
    the folder."""
    given = Path(path).expanduser()
    if not given.exists():
        raise StudyError(f"no study file or folder {path}: give the study's file or its folder")
    folder = read_study(str(given)).folder if given.is_file() else given
    damaged = StudyError(  # which the study refuses too: restored, or nothing
        f"{folder / SPEC_NAME} is damaged: restore it from a copy (python -m "
        f"torchbeast.study refuses {folder} until it is whole)"
    )
    try:
        spec = json.loads((folder / SPEC_NAME).read_text())
    except OSError:
        raise StudyError(
            f"no study table in {folder} ({SPEC_NAME}): run the study first "
            "(python -m torchbeast.study FILE.toml)"
        ) from None
    except ValueError:  # not JSON (nor text)
        raise damaged from None
    try:
        study, cells = spec["study"], list(spec["cells"])
        if not all(isinstance(cell, dict) and "cell" in cell for cell in cells):
            raise KeyError("cell")  # a row without its cell's name
        # Named sets of flags as the table shows them: by their names.
        study["axes"] = {axis: [label(v) for v in vs] for axis, vs in study["axes"].items()}
        rows = with_true_returns(cells)
    except (KeyError, TypeError, AttributeError):
        raise damaged from None
    return folder, study, rows


def with_true_returns(rows: list[dict]) -> list[dict]:
    """Where some cells trained on a proxy (their evaluation measured a ``true_return``),
    the others' ``return``, the env's own reward, is their true return: named so, the
    cells of every reward setting share one figure (the game score beside its proxies)."""
    if not any("eval_true_return" in row for row in rows):
        return rows
    renamed = []
    for row in rows:
        prefixes = tuple(
            prefix
            for prefix in ("eval_", "random_")
            if f"{prefix}return" in row and f"{prefix}true_return" not in row
        )
        renamed.append(
            {
                true_return_column(column) if column.startswith(prefixes) else column: value
                for column, value in row.items()
            }
        )
    return renamed


def true_return_column(column: str) -> str:
    """The name ``with_true_returns`` gives a column of the env's own return
    (eval_return_per_step: eval_true_return_per_step); any other column's own."""
    for prefix in ("eval_", "random_"):
        measured = column.removeprefix(prefix)
        if measured != column and (measured == "return" or measured.startswith("return_")):
            return f"{prefix}true_{measured}"
    return column


def returns_measured(rows: list[dict]) -> list[str]:
    """The evaluation's returns in the table (``return``, or ``proxy_return`` and
    ``true_return``), without their per-step values."""
    names = []
    for row in rows:
        for column in row:
            if column.startswith("eval_") and column.endswith("return"):
                names.append(column.removeprefix("eval_"))
    return list(dict.fromkeys(names))


def number(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def panels(axes: dict[str, list], capacity: list[str]) -> list[dict]:
    """Each combination of the axes that are neither capacity nor seed: a panel."""
    names = [name for name in axes if name not in capacity and name != SEED_AXIS]
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[name] for name in names))
    ]


def in_panel(row: dict, panel: dict) -> bool:
    return all(row.get(name) == value for name, value in panel.items())


def panel_title(panel: dict) -> str:
    return ", ".join(f"{name} {value}" for name, value in panel.items()) or "all cells"


def capacity_figure(study: dict, rows: list[dict], capacity: list[str], out: Path) -> Path:
    """``capacity_plot``, written to ``out``."""
    capacity_plot(study, rows, capacity).savefig(out, format="png", dpi=100)
    return out


def capacity_plot(study: dict, rows: list[dict], capacity: list[str]) -> Figure:
    """For each panel, each return against the parameter count (log x): seeds as points,
    their mean as a line, the random policy's level dashed."""
    finished = [row for row in rows if row.get("status") == "finished"]
    if not finished:
        raise StudyError("no cell of the study has finished yet: nothing to draw")
    figures = returns_measured(finished)
    groups = panels(study["axes"], capacity)
    counts = (number(row.get("parameters")) for row in finished)
    sizes_drawn = sorted({count for count in counts if math.isfinite(count)})
    fig = Figure(figsize=(5.0 * len(groups), 4.0))
    FigureCanvasAgg(fig)
    for index, panel in enumerate(groups):
        ax = fig.add_subplot(1, len(groups), index + 1)
        cells = [row for row in finished if in_panel(row, panel)]
        for figure, colour in zip(figures, itertools.cycle(COLOURS)):
            x = np.array([number(row.get("parameters")) for row in cells])
            y = np.array([number(row.get(f"eval_{figure}")) for row in cells])
            keep = np.isfinite(x) & np.isfinite(y)
            if not keep.any():
                continue
            ax.scatter(x[keep], y[keep], color=colour, alpha=0.5, s=18)
            sizes = np.unique(x[keep])
            means = [y[keep][x[keep] == size].mean() for size in sizes]
            ax.plot(sizes, means, color=colour, marker="o", label=figure.replace("_", " "))
            random = [number(row.get(f"random_{figure}")) for row in cells]
            random = [value for value in random if math.isfinite(value)]
            if random:
                ax.axhline(np.mean(random), color=colour, linestyle="--", linewidth=1)
        ax.set_xscale("log")
        # Each model's size labelled (powers of ten alone may label none of them).
        ax.set_xticks(sizes_drawn, [short_count(size) for size in sizes_drawn])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("parameters")
        ax.set_ylabel("evaluation return (dashed: random policy)")
        ax.set_title(panel_title(panel), fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel none of whose cells finished: none
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def short_count(count: float) -> str:
    """A parameter count as a tick label: 279,876 as 280K, 3,312,000 as 3.31M."""
    for scale, suffix in ((1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.0f}"


def curves_figure(folder: Path, rows: list[dict], out: Path) -> Path:
    """One panel per cell: the training return (last 100 episodes) against steps."""
    columns = min(4, max(1, len(rows)))
    lines = math.ceil(len(rows) / columns)
    fig = Figure(figsize=(3.2 * columns, 2.4 * lines))
    FigureCanvasAgg(fig)
    for index, row in enumerate(rows):
        ax = fig.add_subplot(lines, columns, index + 1)
        ax.set_title(row["cell"], fontsize=7)
        ax.tick_params(labelsize=6)
        try:
            steps, returns = return_last_100_curve(read_logs(folder / row["cell"]))
        except (OSError, ValueError, KeyError):
            continue
        ax.plot(steps, returns, linewidth=1)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    return out


def pivot(study: dict, rows: list[dict], down: str, across: str, figure: str) -> np.ndarray:
    """The mean of ``figure`` over the other axes, [down's values, across's values]."""
    axes = study["axes"]
    table = np.full((len(axes[down]), len(axes[across])), math.nan)
    for i, a in enumerate(axes[down]):
        for j, b in enumerate(axes[across]):
            values = [
                number(row.get(figure))
                for row in rows
                if row.get(down) == a and row.get(across) == b and row.get("status") == "finished"
            ]
            values = [value for value in values if math.isfinite(value)]
            if values:
                table[i, j] = np.mean(values)
    return table


def markdown_table(study: dict, table: np.ndarray, down: str, across: str, figure: str) -> str:
    axes = study["axes"]
    head = f"| {figure}: {down} \\ {across} | " + " | ".join(map(str, axes[across])) + " |"
    lines = [head, "|---" * (len(axes[across]) + 1) + "|"]
    for value, cells in zip(axes[down], table, strict=True):
        shown = ["" if math.isnan(cell) else f"{cell:.4g}" for cell in cells]
        lines.append(f"| {value} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def heatmap(study: dict, table: np.ndarray, down: str, across: str, figure: str, out: Path) -> Path:
    axes = study["axes"]
    fig = Figure(figsize=(1.2 * len(axes[across]) + 2.5, 0.7 * len(axes[down]) + 1.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(table, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(axes[across])), [str(v) for v in axes[across]])
    ax.set_yticks(range(len(axes[down])), [str(v) for v in axes[down]])
    ax.set_xlabel(across)
    ax.set_ylabel(down)
    for (i, j), value in np.ndenumerate(table):
        if math.isfinite(value):
            ax.text(j, i, f"{value:.3g}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(image, ax=ax, label=figure)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    return out


def table_figure(study: dict, rows: list[dict], figure: str | None) -> str:
    """The column ``--figure`` names (``default_figure`` without one), as the rows name it
    (``with_true_returns``'s names too); StudyError where no finished cell has a number in
    it, listing the columns that have."""
    finished = [row for row in rows if row.get("status") == "finished"]
    if not finished:
        raise StudyError("no cell of the study has finished yet: nothing to tabulate")
    figure = figure or default_figure(finished)
    numbers = dict.fromkeys(
        column
        for row in finished
        for column, value in row.items()
        if column not in study["axes"] and math.isfinite(number(value))
    )
    for column in (figure, true_return_column(figure)):
        if column in numbers:
            return column
    raise StudyError(
        f"--figure {figure}: no finished cell has a number in it: use one of {', '.join(numbers)}"
    )


def default_figure(rows: list[dict]) -> str:
    """The true return where the evaluation measured one, else the return."""
    measured = returns_measured(rows)
    for name in ("true_return", "return"):
        if name in measured:
            return f"eval_{name}"
    return f"eval_{measured[0]}" if measured else "eval_return"


def make_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="python -m torchbeast.study_plot",
        description="Draw a study's capacity figure and learning curves, or tabulate "
        "two of its axes.",
    )
    parser.add_argument("study", help="the study file (TOML) or the study's folder")
    parser.add_argument(
        "--capacity",
        nargs="+",
        default=None,
        metavar="AXIS",
        help=f"the axes that set the model's size (default: those of {', '.join(CAPACITY_AXES)} "
        "the study has)",
    )
    parser.add_argument("--out", default=None, help="capacity figure (default: STUDY/capacity.png)")
    parser.add_argument("--curves", default=None, help="curves (default: STUDY/curves.png)")
    parser.add_argument(
        "--table",
        nargs=2,
        default=None,
        metavar=("DOWN", "ACROSS"),
        help="print the mean of --figure over the other axes, DOWN's values by ACROSS's",
    )
    parser.add_argument(
        "--figure",
        default=None,
        help="the table's column (a number in study.csv), e.g. eval_true_return, "
        "eval_proxy_return, train_return_last_100 (default: the true return where "
        "measured, else the return)",
    )
    parser.add_argument("--heatmap", default=None, metavar="FILE.png", help="draw the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    work_begins()  # its imports are done: a Ctrl-C now raises KeyboardInterrupt
    args = make_parser().parse_args(argv)
    try:
        for flag_name in ("out", "curves", "heatmap"):
            path = getattr(args, flag_name)
            if path is not None and Path(path).suffix.lower() != ".png":
                raise StudyError(f"--{flag_name} {path} must end in .png: figures are PNGs")
        if args.heatmap and not args.table:
            raise StudyError("--heatmap draws the --table: give --table DOWN ACROSS too")
        if args.figure is not None and not args.table:  # it was taken and used nowhere
            raise StudyError("--figure is the --table's column: give --table DOWN ACROSS too")
        if args.heatmap and (problem := unwritable(args.heatmap, "--heatmap")):
            raise StudyError(problem)
        folder, study, rows = load_study(args.study)
        if args.table:
            down, across = args.table
            if down == across:  # a diagonal table, every other cell empty
                raise StudyError(f"--table {down} {across}: give two different axes")
            for axis in (down, across):
                if axis not in study["axes"]:
                    raise StudyError(
                        f"{axis} is not an axis of the study: its axes are "
                        f"{', '.join(study['axes'])}"
                    )
            figure = table_figure(study, rows, args.figure)
            table = pivot(study, rows, down, across, figure)
            print(markdown_table(study, table, down, across, figure))
            if args.heatmap:
                print(
                    f"Heat map: {heatmap(study, table, down, across, figure, Path(args.heatmap))}"
                )
            return 0
        capacity = args.capacity or [axis for axis in CAPACITY_AXES if axis in study["axes"]]
        for axis in capacity:
            if axis not in study["axes"]:
                raise StudyError(
                    f"--capacity {axis} is not an axis of the study: its axes are "
                    f"{', '.join(study['axes'])}"
                )
        out = Path(args.out) if args.out else folder / "capacity.png"
        curves = Path(args.curves) if args.curves else folder / "curves.png"
        for flag_name, path in (("--out", out), ("--curves", curves)):
            if problem := unwritable(str(path), flag_name):
                raise StudyError(problem)
        # The curves first: they need only the cells' logs, and a study under way has them.
        print(f"Learning curves: {curves_figure(folder, rows, curves)}")
        if any(row.get("status") == "finished" for row in rows):
            print(f"Capacity figure: {capacity_figure(study, rows, capacity, out)}")
        else:
            print("Capacity figure: none yet, as no cell has finished (trained and evaluated)")
    except StudyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A study's figures and tables, from a study folder as the study command writes it."""

from __future__ import annotations

import json
import math

import pytest

from torchbeast import study_plot
from torchbeast.study import StudyError

AXES = {"hidden_size": [64, 256], "fuel_multiplier": [1.0, 0.0], "seed": [1, 2]}


def write_study_folder(folder, rows) -> None:
    spec = {"study": {"runtime": "mono", "flags": {}, "axes": AXES, "eval": {}}, "cells": rows}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps(spec))


def row(hidden_size, fuel, seed, true_return, status="finished") -> dict:
    return {
        "cell": f"hidden_size-{hidden_size}_fuel_multiplier-{fuel}_seed-{seed}",
        "hidden_size": hidden_size,
        "fuel_multiplier": fuel,
        "seed": seed,
        "status": status,
        "parameters": 1000 * hidden_size,
        "eval_proxy_return": true_return / 2,
        "eval_true_return": true_return,
        "random_true_return": 100.0,
    }


def test_a_table_of_two_axes_averages_over_the_others(tmp_path):
    rows = [row(64, 1.0, 1, 10.0), row(64, 1.0, 2, 30.0), row(256, 0.0, 1, 5.0)]
    rows.append(row(256, 0.0, 2, 999.0, status="failed"))  # left out: not finished
    write_study_folder(tmp_path, rows)
    folder, study, cells = study_plot.load_study(str(tmp_path))
    table = study_plot.pivot(study, cells, "hidden_size", "fuel_multiplier", "eval_true_return")
    assert table[0, 0] == 20.0 and table[1, 1] == 5.0
    assert math.isnan(table[0, 1]) and math.isnan(table[1, 0])
    text = study_plot.markdown_table(
        study, table, "hidden_size", "fuel_multiplier", "eval_true_return"
    )
    assert text.splitlines()[2] == "| 64 | 20 |  |"
    assert study_plot.default_figure(cells) == "eval_true_return"


def test_the_capacity_figure_has_a_panel_per_proxy(tmp_path):
    rows = [row(h, f, s, 10.0 * h / 64 + s) for h in (64, 256) for f in (1.0, 0.0) for s in (1, 2)]
    write_study_folder(tmp_path, rows)
    folder, study, cells = study_plot.load_study(str(tmp_path))
    assert study_plot.panels(study["axes"], ["hidden_size"]) == [
        {"fuel_multiplier": 1.0},
        {"fuel_multiplier": 0.0},
    ]
    assert study_plot.returns_measured(cells) == ["proxy_return", "true_return"]
    out = study_plot.capacity_figure(study, cells, ["hidden_size"], tmp_path / "capacity.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_the_capacity_figure_labels_each_models_parameter_count(tmp_path):
    rows = [row(h, 1.0, 1, 10.0) for h in (179, 280, 3312)]  # 179K, 280K, 3.31M parameters
    write_study_folder(tmp_path, rows)
    _, study, cells = study_plot.load_study(str(tmp_path))
    figure = study_plot.capacity_plot(study, cells, ["hidden_size"])
    # Labelled at powers of ten only, two of the three panels' points had no label at all.
    for ax in figure.axes:
        labels = [tick.get_text() for tick in ax.get_xticklabels()]
        assert labels == ["179K", "280K", "3.31M"]


def test_a_path_that_cannot_be_written_or_read_is_one_line(tmp_path, capsys):
    write_study_folder(tmp_path, [row(64, 1.0, 1, 10.0)])
    missing = tmp_path / "no" / "x.png"
    for argv, said in [
        ([str(tmp_path), "--out", str(missing)], f"--out {missing}: no folder"),
        ([str(tmp_path), "--table", "seed", "hidden_size", "--heatmap", str(missing)],
         f"--heatmap {missing}: no folder"),
        ([str(tmp_path / "s1.tml")], f"no study file or folder {tmp_path / 's1.tml'}"),
        ([str(tmp_path), "--capacity", "hidden_sise"], "--capacity hidden_sise is not an axis"),
    ]:  # fmt: skip
        assert study_plot.main(argv) == 1  # a traceback after the figure, or a wrong fix
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err


def test_asking_for_an_axis_the_study_lacks_is_one_line(tmp_path, capsys):
    write_study_folder(tmp_path, [row(64, 1.0, 1, 10.0)])
    assert study_plot.main([str(tmp_path), "--table", "hidden_size", "width"]) == 1
    error = capsys.readouterr().err.strip()
    axes = "hidden_size, fuel_multiplier, seed"
    assert error == f"error: width is not an axis of the study: its axes are {axes}"
    assert study_plot.main([str(tmp_path), "--table", "seed", "seed"]) == 1  # a diagonal
    assert capsys.readouterr().err.strip() == "error: --table seed seed: give two different axes"


def test_figure_paths_must_be_pngs_and_a_heatmap_needs_its_table(tmp_path, capsys):
    write_study_folder(tmp_path, [row(64, 1.0, 1, 10.0)])
    for argv, said in [
        (["--out", str(tmp_path / "x.txt")], "--out " + str(tmp_path / "x.txt") + " must end"),
        (["--curves", "c.jpg"], "--curves c.jpg must end in .png"),
        (["--heatmap", "h.png"], "--heatmap draws the --table: give --table DOWN ACROSS"),
        # Taken, and used nowhere: the figures drew what they always draw.
        (["--figure", "eval_return"], "--figure is the --table's column: give --table"),
    ]:
        assert study_plot.main([str(tmp_path), *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
    assert not (tmp_path / "x.txt").exists()


def test_a_folder_without_a_study_is_one_line(tmp_path):
    with pytest.raises(StudyError, match="run the study first"):
        study_plot.load_study(str(tmp_path))


def test_the_game_score_of_cells_without_a_proxy_is_their_true_return(tmp_path):
    score = {"cell": "reward-score", "status": "finished", "eval_return": 2000.0}
    score |= {"eval_return_std": 5.0, "random_return": 1600.0}
    proxy = row(64, 5.0, 1, 1750.0)
    write_study_folder(tmp_path, [score, proxy])
    _, _, cells = study_plot.load_study(str(tmp_path))
    assert cells[0]["eval_true_return"] == 2000.0 and "eval_return" not in cells[0]
    assert cells[0]["random_true_return"] == 1600.0
    assert study_plot.returns_measured(cells) == ["true_return", "proxy_return"]


def test_a_figure_no_finished_cell_has_is_refused_in_one_line_naming_the_valid_ones(
    tmp_path, capsys
):
    write_study_folder(tmp_path, [row(64, 1.0, 1, 10.0), row(256, 0.0, 1, 5.0)])
    table = ["--table", "hidden_size", "fuel_multiplier", "--figure", "eval_tru_return"]
    assert study_plot.main([str(tmp_path), *table]) == 1
    valid = "parameters, eval_proxy_return, eval_true_return, random_true_return"
    assert capsys.readouterr().err == (
        "error: --figure eval_tru_return: no finished cell has a number in it: "
        f"use one of {valid}\n"
    )


@pytest.mark.parametrize(
    "figure, column, values",
    [
        ("eval_return", "eval_true_return", "2000 | 1750"),  # the score cells' is renamed
        ("eval_true_return_per_step", "eval_true_return_per_step", "2 | 1.5"),
    ],
)
def test_a_table_of_a_study_with_proxies_shows_the_score_cells_under_each_return_name(
    tmp_path, capsys, figure, column, values
):
    score = {"cell": "reward-score", "reward": "score", "seed": 1, "status": "finished"}
    score |= {"eval_return": 2000.0, "eval_return_per_step": 2.0}
    proxy = {"cell": "reward-fuel5", "reward": "fuel5", "seed": 1, "status": "finished"}
    proxy |= {"eval_true_return": 1750.0, "eval_true_return_per_step": 1.5}
    study = {"runtime": "mono", "flags": {}, "eval": {}}
    study["axes"] = {"reward": ["score", "fuel5"], "seed": [1]}
    (tmp_path / "study.json").write_text(json.dumps({"study": study, "cells": [score, proxy]}))
    assert study_plot.main([str(tmp_path), "--table", "seed", "reward", "--figure", figure]) == 0
    head, _, line = capsys.readouterr().out.splitlines()
    assert head.startswith(f"| {column}: seed \\ reward |")
    assert line == f"| 1 | {values} |"


def test_a_damaged_study_json_is_one_line(tmp_path, capsys):
    # It said to run the study again, which refuses a damaged study.json; one not JSON
    # was "no study table: run the study first".
    for damaged in (
        '{"foo": 1}', "[]", '{"study": {"axes": [1]}, "cells": []}',
        '{"study": {"axes": {}}, "cells": [{}]}', '{"study": ', "\udcff",
    ):  # fmt: skip
        (tmp_path / "study.json").write_text(damaged, errors="surrogateescape")
        assert study_plot.main([str(tmp_path)]) == 1
        said = f"error: {tmp_path / 'study.json'} is damaged: restore it from a copy "
        said += f"(python -m torchbeast.study refuses {tmp_path} until it is whole)"
        assert capsys.readouterr().err.strip().splitlines() == [said]


def test_a_study_under_way_has_its_curves_drawn(tmp_path, capsys):
    # "no cell of the study has finished yet: nothing to draw", where the curves need only
    # the cells' logs.
    cell = row(64, 1.0, 1, 0.0, status="running")
    write_study_folder(tmp_path, [cell])
    logs = tmp_path / cell["cell"]
    logs.mkdir()
    (logs / "logs.csv").write_text(
        "# _tick,_time,step,mean_episode_return,episodes\n"
        + "".join(f"{t},{t}.0,{1000 * t},{t}.0,{t}\n" for t in range(1, 6))
    )
    assert study_plot.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"Learning curves: {tmp_path / 'curves.png'}" in out
    assert "Capacity figure: none yet, as no cell has finished" in out
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")

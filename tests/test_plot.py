"""Tests for torchbeast.plot and torchbeast.curves: reading logs.csv, writing curve PNGs."""

import gzip
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from torchbeast import curves, plot

HEADER = (
    "# _tick,_time,step,total_loss,mean_episode_return,pg_loss,baseline_loss,entropy_loss,sps\n"
)
ROWS = (
    "0,1700000000.0,3200,1.5,,0.1,1.2,-0.2,1600.0\n"
    "1,1700000002.0,6400,1.25,-21.0,0.05,1.1,-0.19,1600.0\n"
    "2,1700000004.0,9600,1.0,-20.5,0.02,0.9,-0.18,1650.0\n"
)
# A resumed run appends a header with one extra field, then more rows.
RESUMED = (
    "# _tick,_time,step,total_loss,mean_episode_return,pg_loss,baseline_loss,entropy_loss,sps,lr\n"
    "3,1700000100.0,12800,0.75,-19.0,0.01,0.7,-0.17,1700.0,0.0004\n"
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, xpid: str, text: str = HEADER + ROWS) -> Path:
    """Create ``root/xpid/logs.csv`` holding ``text``; return the run folder."""
    folder = root / xpid
    folder.mkdir(parents=True)
    (folder / "logs.csv").write_text(text)
    return folder


def assert_is_png_figure(path: Path) -> None:
    assert path.is_file()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    width, height = plot.FIGSIZE
    assert image.shape[:2] == (round(height * plot.DPI), round(width * plot.DPI))


def test_read_logs_parses_every_column_as_floats(tmp_path):
    folder = write_run(tmp_path, "run")

    logs = curves.read_logs(folder / "logs.csv")

    assert list(logs) == [
        "_tick",
        "_time",
        "step",
        "total_loss",
        "mean_episode_return",
        "pg_loss",
        "baseline_loss",
        "entropy_loss",
        "sps",
    ]
    assert logs["step"].tolist() == [3200.0, 6400.0, 9600.0]
    assert logs["_time"].tolist() == [1700000000.0, 1700000002.0, 1700000004.0]
    assert logs["sps"].tolist() == [1600.0, 1600.0, 1650.0]
    assert all(column.dtype == np.float64 for column in logs.values())


def test_read_logs_reads_empty_cell_as_nan(tmp_path):
    folder = write_run(tmp_path, "run")

    returns = curves.read_logs(folder / "logs.csv")["mean_episode_return"]

    assert math.isnan(returns[0])
    assert returns[1:].tolist() == [-21.0, -20.5]


def test_read_logs_rereads_field_names_after_resume_header(tmp_path):
    folder = write_run(tmp_path, "run", HEADER + ROWS + RESUMED)

    logs = curves.read_logs(folder / "logs.csv")

    assert logs["step"].tolist() == [3200.0, 6400.0, 9600.0, 12800.0]
    assert logs["mean_episode_return"][1:].tolist() == [-21.0, -20.5, -19.0]
    assert np.isnan(logs["lr"][:3]).all()
    assert logs["lr"][3] == 0.0004


def test_read_logs_accepts_run_folder(tmp_path):
    folder = write_run(tmp_path, "run")

    assert curves.read_logs(folder)["step"].tolist() == [3200.0, 6400.0, 9600.0]


def test_read_logs_reads_a_gzipped_copy_as_the_plain_file(tmp_path):
    folder = write_run(tmp_path, "pong", HEADER + ROWS + RESUMED)
    packed = tmp_path / "pong.logs.csv.gz"
    packed.write_bytes(gzip.compress((folder / "logs.csv").read_bytes()))

    plain, unpacked = curves.read_logs(folder), curves.read_logs(packed)

    assert list(unpacked) == list(plain)
    for name in plain:
        np.testing.assert_array_equal(unpacked[name], plain[name])


def test_read_logs_reads_a_committed_run_log():
    logs = curves.read_logs(Path(__file__).parents[1] / "docs/runs/breakout_5m.logs.csv.gz")

    assert logs["step"][-1] >= 5_000_000
    assert np.nanmax(logs["mean_episode_return"]) > 300


def test_main_plots_a_gzipped_log_labelled_by_its_name(tmp_path, monkeypatch):
    runs = tmp_path / "docs" / "runs"
    runs.mkdir(parents=True)
    packed = runs / "breakout_5m.logs.csv.gz"
    packed.write_bytes(gzip.compress((HEADER + ROWS).encode()))
    labels = []  # the legend's labels, as the figure would be drawn with them
    monkeypatch.setattr(plot, "plot_runs", lambda runs, *a, **k: labels.extend(runs))

    code = plot.main([str(packed), "--out", str(tmp_path / "out.png")])

    assert code == 0
    assert labels == ["breakout_5m"]


def test_smooth_is_trailing_mean_over_window():
    smoothed = curves.smooth(np.array([1.0, 3.0, 5.0, 7.0]), 2)

    assert smoothed.tolist() == [1.0, 2.0, 4.0, 6.0]


def test_the_return_curve_is_the_consoles_mean_of_the_last_100_episodes_where_logged():
    logs = {
        "step": np.array([80.0, 160.0, 240.0, 320.0]),
        "episodes": np.array([60.0, 0.0, 60.0, 40.0]),
        "mean_episode_return": np.array([1.0, np.nan, 2.0, 3.0]),
        # The console's own figure, logged from the third row on (a run resumed by a
        # newer version); before it, the curve computes it from whole rows.
        curves.LAST_100_COLUMN: np.array([np.nan, np.nan, 1.5, 2.5]),
    }
    steps, returns = curves.return_last_100_curve(logs)
    assert steps.tolist() == [80.0, 160.0, 240.0, 320.0]
    assert returns.tolist() == [1.0, 1.0, 1.5, 2.5]
    del logs[curves.LAST_100_COLUMN]
    _, computed = curves.return_last_100_curve(logs)
    # After the last row: 40 at 3 and 60 at 2 (whole rows back until 100 ended).
    assert computed.tolist() == pytest.approx([1.0, 1.0, 1.5, 2.4])


def test_the_best_mean_of_100_episodes_counts_only_rows_where_100_had_ended():
    logs = {
        "step": np.array([80.0, 160.0, 240.0, 320.0]),
        "episodes": np.array([10.0, 50.0, 60.0, 40.0]),
        "mean_episode_return": np.array([9.0, 1.0, 2.0, 3.0]),
    }
    # A study's table took 9.0, the mean of the first 10 episodes, as the best "of 100".
    best = curves.best_last_100_curve(logs)
    assert np.isnan(best[:2]).all()
    assert best[2:].tolist() == pytest.approx([(50 * 1 + 60 * 2) / 110, 2.4])  # whole rows
    logs[curves.BEST_COLUMN] = np.array([np.nan, np.nan, 3.5, 3.5])  # a light log's spans
    assert curves.best_last_100_curve(logs)[2:].tolist() == [3.5, 3.5]


def test_load_logs_reads_a_resumed_runs_logs_into_one_dataframe(tmp_path):
    text = "# _tick,_time,step,mean_episode_return\n0,1.0,80,-21\n"
    text += "# _tick,_time,step,mean_episode_return,episodes\n1,2.0,160,-20,3\n"
    frame = curves.load_logs(write_run(tmp_path, "run", text))
    assert list(frame.columns) == ["_tick", "_time", "step", "mean_episode_return", "episodes"]
    assert frame["step"].tolist() == [80.0, 160.0]  # numbers, and no header read as a row
    assert np.isnan(frame["episodes"][0]) and frame["episodes"][1] == 3.0


def test_load_logs_takes_a_path_under_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_run(tmp_path / "logs", "example", "# _tick,_time,step\n0,1.0,80\n")
    assert curves.load_logs("~/logs/example")["step"].tolist() == [80.0]


def test_sps_curve_draws_no_point_across_a_restart(tmp_path):
    # Rows every second at 100 steps/s; the run resumed an hour later, its first row's sps
    # not yet known: steps over the downtime are no speed the run had.
    rows = [f"{t},{1000.0 + t},{100 * t}," for t in range(1, 11)]
    rows += ["11,4610.0,1100,", "12,4611.0,1200,100"]
    text = "# _tick,_time,step,sps\n" + "\n".join(rows) + "\n"
    steps, sps = curves.sps_curve(curves.read_logs(write_run(tmp_path, "run", text)))
    assert 1100.0 not in steps.tolist()
    assert sps.min() == pytest.approx(100.0)


def test_sps_curve_averages_steps_over_the_time_window_without_sps_column(tmp_path):
    text = "# _tick,_time,step\n0,100.0,0\n1,102.0,3200\n2,106.0,6400\n3,120.0,8000\n"
    logs = curves.read_logs(write_run(tmp_path, "run", text))

    steps, sps = curves.sps_curve(logs, window_s=10.0)

    assert steps.tolist() == [3200.0, 6400.0, 8000.0]
    # Rows within the last 10 s: 6400 over 6 s; the last row has none, so its predecessor.
    assert sps.tolist() == [1600.0, 6400 / 6, 1600 / 14]


def test_sps_curve_drops_points_where_steps_go_back(tmp_path):
    text = "# _tick,_time,step\n0,100.0,3200\n1,102.0,0\n2,104.0,3200\n"
    logs = curves.read_logs(write_run(tmp_path, "run", text))

    steps, sps = curves.sps_curve(logs, window_s=1.0)

    assert steps.tolist() == [3200.0]
    assert sps.tolist() == [1600.0]


def test_main_writes_curve_png_in_run_folder_for_one_xpid(tmp_path, capsys):
    folder = write_run(tmp_path, "pong")

    code = plot.main(["--xpid", "pong", "--savedir", str(tmp_path)])

    assert code == 0
    assert_is_png_figure(folder / "curve.png")
    assert capsys.readouterr().out.strip() == str(folder / "curve.png")


def test_main_writes_one_png_for_two_run_paths(tmp_path):
    first = write_run(tmp_path, "pong_1")
    second = write_run(tmp_path, "pong_2", HEADER + ROWS + RESUMED)
    out = tmp_path / "both.png"

    code = plot.main([str(first), str(second / "logs.csv"), "--out", str(out)])

    assert code == 0
    assert_is_png_figure(out)


def test_main_writes_learning_curves_png_in_cwd_for_several_runs(tmp_path, monkeypatch):
    write_run(tmp_path, "a")
    write_run(tmp_path, "b")
    monkeypatch.chdir(tmp_path)

    code = plot.main(["--xpid", "a", "--xpid", "b", "--savedir", str(tmp_path)])

    assert code == 0
    assert_is_png_figure(tmp_path / "learning_curves.png")


@pytest.mark.parametrize("xpid", ["", "..", "a/b"])
def test_an_xpid_that_is_no_runs_name_is_one_line(tmp_path, capsys, xpid):
    # "" plotted the savedir itself, and said to train with "--xpid ,"; ".." its parent.
    assert plot.main(["--xpid", xpid, "--savedir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --xpid {xpid!r} is no run's name: give the name a run was trained "
                   "with (--xpid NAME), or pass the run's folder"]  # fmt: skip


def test_main_missing_run_folder_exits_2_with_one_line_error(tmp_path, capsys):
    code = plot.main(["--xpid", "nope", "--savedir", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert str(tmp_path / "nope") in err
    assert "--savedir" in err


def test_main_logs_without_rows_exits_2_with_one_line_error(tmp_path, capsys):
    folder = write_run(tmp_path, "fresh", HEADER)

    code = plot.main([str(folder)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "no rows" in err
    assert not (folder / "curve.png").exists()


def test_main_empty_logs_of_a_run_just_started_exits_2_saying_to_wait(tmp_path, capsys):
    # A run writes its logs.csv empty as it starts: it was "not a torchbeast logs.csv".
    folder = write_run(tmp_path, "starting", "")

    code = plot.main([str(folder)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "logs.csv is empty: its run has made no learner update yet (wait for it)" in err


def test_main_folder_without_logs_exits_2_naming_how_to_train(tmp_path, capsys):
    (tmp_path / "empty").mkdir()

    code = plot.main([str(tmp_path / "empty")])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "python -m torchbeast.monobeast --xpid empty" in err


def test_a_studys_folder_is_told_apart_from_a_run_and_its_latest_link_drawn_once(tmp_path, capsys):
    (tmp_path / "study.json").write_text("{}")  # "train first with ... --xpid study"
    assert plot.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path} holds a study, not a run: draw it with python -m "
        f"torchbeast.study_plot {tmp_path}, or pass its cells' folders ({tmp_path}/*/)"
    ]
    # The glob of a savedir's folders takes the latest link too: "two runs have the same
    # label", of one run given twice.
    write_run(tmp_path, "a")
    write_run(tmp_path, "b")
    (tmp_path / "latest").symlink_to("b")
    out = tmp_path / "cells.png"
    paths = [str(tmp_path / name) for name in ("a", "b", "latest")]
    assert plot.main([*paths, "--out", str(out)]) == 0
    assert_is_png_figure(out)
    # Given labels, each path is drawn as given: "2 --label for 1 runs" of two paths.
    labels = ["--label", "first", "--label", "second"]
    assert plot.main([paths[1], paths[2], *labels, "--out", str(out)]) == 0
    twice = ["--label", "x", "--label", "x"]
    assert plot.main([*paths[:2], *twice, "--out", str(out)]) == 2
    assert "two runs have the label x: name them apart" in capsys.readouterr().err


@pytest.mark.parametrize("smooth", ["0", "-3"])
def test_main_rejects_smooth_below_one(tmp_path, capsys, smooth):
    write_run(tmp_path, "run")

    code = plot.main([str(tmp_path / "run"), "--smooth", smooth])

    assert code == 2
    assert "--smooth" in capsys.readouterr().err


def test_diagnostics_adds_a_panel_per_learner_diagnostic(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    fields = ["_tick", "_time", "step", "mean_episode_return", *plot.DIAGNOSTICS]
    rows = [
        [i, 100.0 + i, 80 * (i + 1), -20 + i / 10, *([0.5] * len(plot.DIAGNOSTICS))]
        for i in range(30)
    ]
    lines = [",".join(map(str, row)) for row in rows]
    (run / "logs.csv").write_text("# " + ",".join(fields) + "\n" + "\n".join(lines) + "\n")
    plain, diagnostics = tmp_path / "plain.png", tmp_path / "diagnostics.png"
    assert plot.main([str(run), "--out", str(plain)]) == 0
    assert plot.main([str(run), "--out", str(diagnostics), "--diagnostics"]) == 0
    assert matplotlib.image.imread(plain).shape[:2] == (600, 800)
    # Return, SPS and six diagnostics: 4 rows of 2 panels.
    assert matplotlib.image.imread(diagnostics).shape[:2] == (1200, 1600)


def test_column_adds_a_panel_for_any_logged_column(tmp_path):
    run = write_run(tmp_path, "run")
    out = tmp_path / "columns.png"
    assert plot.main([str(run), "--out", str(out), "--column", "baseline_loss"]) == 0
    # Return, SPS and the baseline loss: 3 panels in one column.
    assert matplotlib.image.imread(out).shape[:2] == (900, 800)
    figure = tmp_path / "both.png"
    argv = [str(run), "--out", str(figure), "--column", "pg_loss", "--column", "baseline_loss"]
    assert plot.main(argv) == 0
    assert matplotlib.image.imread(figure).shape[:2] == (600, 1600)  # 2 rows of 2


def test_column_that_no_run_logged_is_one_line_naming_the_logged_ones(tmp_path, capsys):
    run = write_run(tmp_path, "run")
    assert plot.main([str(run), "--column", "mean_episode_true_return"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--column mean_episode_true_return" in err and "baseline_loss" in err


# --------------------------------------------------------------------------- light logs

COMMITTED = Path(__file__).parents[1] / "docs/runs/cartpole_check_defaults_run1.logs.csv.gz"


def test_a_light_log_keeps_every_episode_and_the_curve_in_one_row_per_span(tmp_path):
    from torchbeast import lightlog
    from torchbeast.learncheck import mean_of_last_episodes

    full = curves.read_logs(COMMITTED)
    out = tmp_path / "light.logs.csv.gz"
    lightlog.main([str(COMMITTED), str(out), "--every_steps", "10000"])
    light = curves.read_logs(out)
    assert light.keys() == full.keys()
    assert light["step"].size == math.ceil(full["step"][-1] / 10_000)
    assert np.all(np.diff(light["step"]) > 0) and light["step"][-1] == full["step"][-1]
    # Every episode is counted once, and the mean over all of them is kept.
    assert light["episodes"].sum() == np.nansum(full["episodes"])

    def overall_mean(logs):
        weights = np.where(np.isfinite(logs["mean_episode_return"]), logs["episodes"], 0)
        return np.nansum(logs["mean_episode_return"] * weights) / weights.sum()

    assert overall_mean(light) == pytest.approx(overall_mean(full))
    # The mean of the last episodes at a span's end reads as from the full log.
    assert mean_of_last_episodes(light, 100) == pytest.approx(
        mean_of_last_episodes(full, 100), abs=5
    )
    assert out.stat().st_size < 40_000


def test_a_light_log_of_a_log_without_episode_counts_weighs_rows_alike(tmp_path):
    from torchbeast import lightlog

    plain = tmp_path / "logs.csv"
    plain.write_text("# step,mean_episode_return\n5,1\n10,3\n15,\n20,8\n")
    light = lightlog.thin(curves.read_logs(plain), 10)
    np.testing.assert_array_equal(light["step"], [10, 20])
    np.testing.assert_array_equal(light["mean_episode_return"], [2, 8])
    with pytest.raises(SystemExit):
        lightlog.main([str(plain), str(tmp_path / "out.csv"), "--every_steps", "0"])


def test_the_best_of_a_log_without_episode_counts_counts_a_row_as_an_episode(tmp_path):
    # The last-100 mean counted rows so, and the best stayed NaN: the light log's best
    # column was empty.
    plain = tmp_path / "logs.csv"
    plain.write_text("# step,mean_episode_return\n" + "".join(f"{i},{i}\n" for i in range(200)))
    logs = curves.read_logs(plain)
    best = curves.best_last_100_curve(logs)
    assert np.isnan(best[98]) and best[99] == 49.5 and best[-1] == 149.5


def test_a_last_row_cut_off_as_it_was_written_is_left_out(tmp_path):
    # Read whole, its cut cell was a number: step 3 of 3000, a line back to the start.
    cut = tmp_path / "logs.csv"
    header = "# _tick,_time,step,mean_episode_return\n"
    cut.write_text(header + "0,1.0,1000,5.0\n1,2.0,2000,6.0\n2,3.0,3")
    logs = curves.read_logs(cut)
    np.testing.assert_array_equal(logs["step"], [1000, 2000])
    cut.write_text(cut.read_text() + "000,7.0\n")  # the row, once written whole
    np.testing.assert_array_equal(curves.read_logs(cut)["step"], [1000, 2000, 3000])


def test_label_names_each_run_in_the_order_given(tmp_path, capsys):
    first, second = tmp_path / "a" / "run", tmp_path / "b" / "run"
    write_run(tmp_path / "a", "run"), write_run(tmp_path / "b", "run")
    # Two folders of one name: the legend could not tell them apart.
    assert plot.main([str(first), str(second)]) == 2
    assert "two runs have the label run: name them apart" in capsys.readouterr().err
    assert plot.main([str(first), str(second), "--label", "seed 1"]) == 2
    assert "1 --label for 2 runs" in capsys.readouterr().err
    out = tmp_path / "both.png"
    labels = ["--label", "seed 1", "--label", "seed 2"]
    assert plot.main([str(first), str(second), *labels, "--out", str(out)]) == 0
    assert_is_png_figure(out)


def test_lightlog_refuses_to_write_over_the_log_it_reads_and_says_each_error_in_one_line(
    tmp_path, capsys
):
    from torchbeast import lightlog

    run = tmp_path / "run"
    run.mkdir()
    (run / "logs.csv").write_text("# step,mean_episode_return\n5,1\n10,3\n")
    before = (run / "logs.csv").read_bytes()
    cases = [
        ([str(run), str(run / "logs.csv")], "is the log being read: give the light log another"),
        (
            [str(tmp_path / "nothing"), str(tmp_path / "a.csv")],
            "does not exist: pass a run's folder",
        ),
        ([str(run), str(tmp_path / "no" / "such" / "a.csv")], "cannot write"),
        ([str(run), str(tmp_path)], "cannot write"),  # a folder
    ]
    for argv, fragment in cases:
        assert lightlog.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert (run / "logs.csv").read_bytes() == before
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(before)[:-12])
    assert lightlog.main([str(tmp_path / "cut.csv.gz"), str(tmp_path / "a.csv")]) == 2
    assert "is cut short" in capsys.readouterr().err
    assert lightlog.main([str(run), str(tmp_path / "a.csv")]) == 0  # and a good one works

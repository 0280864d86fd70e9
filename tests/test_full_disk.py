"""A run whose folder fills up: it stops with one line and a whole checkpoint, and the same
command resumes it once there is space. The folder is a real, small tmpfs that the test
mounts (it needs root, as CI has)."""

from __future__ import annotations

import contextlib
import re
import subprocess

import pytest
import torch

from tests.test_monobeast import SMALL_RUN, monobeast
from torchbeast.curves import read_logs

# 300 KiB fill up after ~20K CartPole steps (logs.csv and TensorBoard take ~13 bytes a
# step, a checkpoint ~53 KB); a checkpoint every 0.5 s: the first lands before, however
# fast the host (every 2 s, a fast host logged ~19K steps first, and none fitted).
RUN = [*SMALL_RUN, "--xpid", "r", "--total_steps", "60000", "--checkpoint_interval", "0.5"]


def mount(folder, size: str, remount: bool = False) -> None:
    options = f"remount,size={size}" if remount else f"size={size}"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mount(disk, "300k")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_stops_the_run_with_one_line_and_the_same_command_resumes(small_disk):
    full = monobeast(small_disk, *RUN)
    assert full.returncode == 1, full.stderr[-2000:]
    lines = full.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in full.stdout, full.stderr[-2000:]
    # Whichever write fails first (logs.csv or the checkpoint) is the one said.
    assert re.match(
        r"error: cannot write (the checkpoint )?\S+ \(No space left on device\): stopped", lines[0]
    )
    assert "Free space (or fix the folder) and run the same command to resume." in lines[0]
    saved = int(re.search(r"model\.tar holds step (\d+)", lines[0]).group(1))
    state = torch.load(small_disk / "r" / "model.tar", weights_only=True)  # whole
    assert state["step"] == saved > 0
    # TensorBoard and out.log failures are said once each, not once per update.
    assert full.stdout.count("TensorBoard's events") <= 1
    assert full.stderr.count("cannot write") + full.stdout.count("cannot write") == 1

    mount(small_disk, "16m", remount=True)
    resumed = monobeast(small_disk, *RUN)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"Resuming from {small_disk / 'r' / 'model.tar'} (step {saved}," in resumed.stdout
    logs = read_logs(small_disk / "r" / "logs.csv")  # a row cut by the full disk was dropped
    assert logs["step"][-1] >= 60000


def test_an_out_log_that_cannot_be_written_is_said_once_and_the_run_finishes(tmp_path):
    # Its last flush, as the file closed, failed again and turned the finished run into
    # "error: [Errno 28] No space left on device" (a file named nowhere, exit code 1).
    run = [*SMALL_RUN, "--xpid", "r"]
    assert monobeast(tmp_path, *run, "--total_steps", "200").returncode == 0
    out_log = tmp_path / "r" / "out.log"
    out_log.unlink()
    out_log.symlink_to("/dev/full")  # every write fails: ENOSPC
    resumed = monobeast(tmp_path, *run, "--total_steps", "400")
    assert resumed.returncode == 0, resumed.stderr
    said = [line for line in resumed.stderr.splitlines() if "cannot write" in line]
    assert said == [
        f"torchbeast: cannot write {out_log} (No space left on device): the console keeps the log."
    ]
    assert torch.load(tmp_path / "r" / "model.tar", weights_only=True)["step"] >= 400


def test_a_fields_csv_that_cannot_be_written_is_named_as_the_run_stops(tmp_path):
    # The line named logs.csv, which was whole.
    from torchbeast.core.errors import RunFolderError
    from torchbeast.core.filewriter import FileWriter

    writer = FileWriter(str(tmp_path), "r", {"env": "CartPole-v1"})
    (tmp_path / "r" / "fields.csv").mkdir()  # as unwritable as a file can be, even for root
    try:
        with pytest.raises(RunFolderError) as error:
            writer.log({"step": 40, "total_loss": 1.0})
        assert str(error.value).startswith(f"cannot write {tmp_path / 'r' / 'fields.csv'} (")
    finally:
        writer.close()


def test_a_cells_record_that_fills_the_disk_leaves_the_one_before_whole(small_disk):
    # Written in place, it was cut short: read back as no record, the finished cell
    # trained again.
    from torchbeast.study import read_state, write_state

    write_state(small_disk, {"status": "finished", "seconds": 12.5})
    fill(small_disk)
    with pytest.raises(OSError, match="No space left on device"):
        write_state(small_disk, {"status": "finished", "error": "x" * 100_000})
    assert read_state(small_disk) == {"status": "finished", "seconds": 12.5}
    assert sorted(path.name for path in small_disk.iterdir()) == ["filler", "study_cell.json"]


def fill(disk) -> None:
    """Fills ``disk`` to its last byte."""
    with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def test_a_light_log_that_fills_the_disk_leaves_the_one_before_whole(small_disk, capsys):
    # Written in place, it was emptied first and then cut short.
    from torchbeast import lightlog

    full = small_disk / "logs.csv"
    full.write_text("# step,mean_episode_return\n" + "".join(f"{i},{i}\n" for i in range(1, 3001)))
    light = small_disk / "light.csv.gz"
    assert lightlog.main([str(full), str(light), "--every_steps", "1000"]) == 0
    before = light.read_bytes()
    fill(small_disk)
    assert lightlog.main([str(full), str(light), "--every_steps", "1"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert light.read_bytes() == before
    assert sorted(path.name for path in small_disk.iterdir()) == [
        "filler",
        "light.csv.gz",
        "logs.csv",
    ]

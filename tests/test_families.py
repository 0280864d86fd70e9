"""Environment families, their presets, the config file and where each setting comes from:
parsed as the entry points parse, and real runs on real envs (a package's family among
them, installed in the test and found through its entry point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests import warm_start
from tests.test_monobeast import REPO, monobeast, read_rows
from torchbeast.config.flags import parse_flags, parse_flags_and_sources
from torchbeast.config.parsers import make_learner_parser, make_mono_parser
from torchbeast.config.settings import build_settings
from torchbeast.envs import create_env
from torchbeast.envs.family import family_of

SPACE_INVADERS = "MinAtar/SpaceInvaders-v1"
RIVERRAID = "RiverraidNoFrameskip-v4"


def parse(*argv: str):
    return parse_flags_and_sources(list(argv), make_mono_parser())


@pytest.mark.parametrize(
    "env_id, family",
    [
        ("PongNoFrameskip-v4", "Atari"),
        ("ALE/Breakout-v5", "Atari"),
        (RIVERRAID, "Atari"),
        ("MinAtar/Breakout-v1", "MinAtar"),
        ("torchbeast/PixelCue-v0", "PixelCue"),
        ("CartPole-v1", "Gymnasium"),
        ("tests.envs_for_tests:Coins-v0", "Gymnasium"),
    ],
)
def test_each_id_goes_to_its_family(env_id, family):
    assert family_of(env_id).name == family


# --------------------------------------------------------------------------- presets


def test_minatar_presets_apply_beneath_the_command_line_and_say_where_they_came_from():
    flags, sources = parse("--env", SPACE_INVADERS, "--entropy_cost", "0.02")
    assert (flags.torso, flags.learning_rate, flags.entropy_cost) == ("grid", 0.0028, 0.02)
    assert sources["torso"] == "preset MinAtar"
    assert sources["learning_rate"] == "preset MinAtar/SpaceInvaders-v1"
    assert sources["entropy_cost"] == sources["env"] == "command line"
    assert sources["batch_size"] == "default" and sources["num_actors"] == "derived"
    # Breakout takes the family's preset, not SpaceInvaders' learning rate.
    flags, sources = parse("--env", "MinAtar/Breakout-v1")
    assert (flags.torso, flags.entropy_cost, flags.learning_rate) == ("grid", 0.01, 0.0007)
    assert sources["learning_rate"] == "default"


def test_a_preset_run_is_the_run_its_flags_by_hand_measured():
    by_preset = build_settings(parse_flags(["--env", SPACE_INVADERS, "--xpid", "x"]))
    by_hand = build_settings(
        parse_flags(
            [
                "--env",
                SPACE_INVADERS,
                "--xpid",
                "x",
                "--no_presets",
                "--torso",
                "grid",
                "--entropy_cost",
                "0.01",
                "--learning_rate",
                "0.0028",
            ]
        )  # fmt: skip
    )
    assert by_preset.model == by_hand.model and by_preset.learner == by_hand.learner


def test_no_presets_runs_the_defaults_and_the_flags_given_only():
    flags, sources = parse("--env", SPACE_INVADERS, "--no_presets")
    assert (flags.torso, flags.entropy_cost, flags.learning_rate) == (None, 0.001, 0.0007)
    assert "preset" not in " ".join(sources.values())


def test_riverraids_survival_proxy_takes_its_measured_settings_and_other_proxies_none():
    flags, sources = parse("--env", RIVERRAID, "--fuel_multiplier", "1", "--move_penalty", "0")
    assert (flags.unroll_length, flags.batch_size) == (80, 4)
    assert flags.normalize_values and flags.normalize_advantages
    assert sources["unroll_length"] == "preset Riverraid survival proxy"
    for argv in (["--fuel_multiplier", "2"], ["--move_penalty", "1"], []):
        flags, sources = parse("--env", RIVERRAID, *argv)
        assert (flags.unroll_length, flags.normalize_values) == (5, False), argv
    flags, _ = parse("--env", "PongNoFrameskip-v4")
    assert (flags.unroll_length, flags.torso, flags.learning_rate) == (5, None, 0.0007)


def test_an_unknown_env_gets_no_presets_and_its_one_line_error_later(tmp_path):
    flags, sources = parse("--env", "NoSuchEnv-v0")
    assert "preset" not in " ".join(sources.values())
    result = monobeast(tmp_path, "--env", "NoSuchEnv-v0")
    assert result.returncode == 1 and "NoSuchEnv-v0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# --------------------------------------------------------------------------- config file


def test_a_config_file_sits_above_the_presets_and_beneath_the_command_line(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('torso = "mlp"\nlearning-rate = 0.001\nuse_lstm = true\nseed = 7\n')
    flags, sources = parse(
        "--env", SPACE_INVADERS, "--config", str(config), "--learning_rate", "0.002"
    )
    assert (flags.torso, flags.learning_rate, flags.use_lstm, flags.seed) == (
        "mlp", 0.002, True, 7,
    )  # fmt: skip
    assert sources["torso"] == sources["use_lstm"] == f"file {config}"
    assert sources["learning_rate"] == "command line"
    assert sources["entropy_cost"] == "preset MinAtar"
    # The file may name the env, and its presets follow it.
    config.write_text(f'env = "{SPACE_INVADERS}"\n')
    flags, sources = parse("--config", str(config))
    assert (flags.env, flags.learning_rate) == (SPACE_INVADERS, 0.0028)
    config.write_text(f'env = "{SPACE_INVADERS}"\nno_presets = true\n')
    assert parse("--config", str(config))[0].learning_rate == 0.0007


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("learning_rte = 0.1", "'learning_rte' is no flag of this command (did you mean "
         "--learning_rate?)"),
        ('torso = "big"', "torso = 'big': 'big' is not one of atari, resnet, grid, mlp"),
        ("use_lstm = 1", "use_lstm = 1: a switch takes true or false"),
        ("batch_size = -3", "batch_size = -3:"),
        ("batch_size = [1, 2]", "a flag takes one value"),
        ("batch_size = ", "not valid TOML"),
        # A file's strings are bounded and escaped where a line shows them.
        ('"a\\nb" = 1', "'a\\nb' is no flag of this command"),
        (f'torso = "{"x" * 100_000}"', "(100000 chars): 'xxxx"),
        # One flag twice: the later won, unsaid.
        ("batch-size = 8\nbatch_size = 9", "'batch-size' and 'batch_size' both set "
         "--batch_size: keep one"),
        ("print_settings = true", "'print_settings' belongs on the command line, not in a file"),
        ("help = true", "'help' belongs on the command line, not in a file"),
    ],
)  # fmt: skip
def test_a_wrong_config_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, fragment):
    config = tmp_path / "run.toml"
    config.write_text(text + "\n")
    result = monobeast(tmp_path, "--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--config {config}:" in lines[0] and fragment in lines[0], lines
    assert len(lines[0]) < 1000
    assert not (tmp_path / "latest").exists()  # nothing started


def test_an_empty_config_path_is_one_line(tmp_path):
    # As `--config "$FILE"` with $FILE unset: it was ignored.
    result = monobeast(tmp_path, "--config", "")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--config names no file" in result.stderr


def test_a_missing_config_file_is_one_line(tmp_path):
    result = monobeast(tmp_path, "--config", str(tmp_path / "none.toml"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot read it" in result.stderr


def test_a_config_that_is_a_device_or_huge_is_one_line_and_a_pipe_is_read(tmp_path, capsys):
    # /dev/zero was read until memory ran out; a pipe, as `--config <(...)` gives, is a file.
    with pytest.raises(SystemExit):
        parse_flags(["--config", "/dev/zero", "--xpid", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config /dev/zero: over 1 MiB, so no flags file" in err[0], err
    read_end, write_end = os.pipe()
    os.write(write_end, b"learning_rate = 0.001\n")
    os.close(write_end)
    try:
        flags = parse_flags(["--config", f"/dev/fd/{read_end}", "--xpid", "x"])
    finally:
        os.close(read_end)
    assert flags.learning_rate == 0.001


def test_a_config_file_with_a_byte_order_mark_is_read_and_one_in_utf16_is_one_line(
    tmp_path, capsys
):
    text = "learning_rate = 0.001\n"
    bom = tmp_path / "bom.toml"
    bom.write_bytes(text.encode("utf-8-sig"))  # as some Windows editors save UTF-8
    assert parse_flags(["--config", str(bom), "--xpid", "x"]).learning_rate == 0.001
    utf16 = tmp_path / "utf16.toml"
    utf16.write_bytes(text.encode("utf-16"))
    with pytest.raises(SystemExit):
        parse_flags(["--config", str(utf16), "--xpid", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--config {utf16}: not UTF-8 text" in err[0], err


# --------------------------------------------------------------------------- command line


def test_a_mistyped_flag_is_one_line_with_the_nearest_flag(tmp_path):
    result = monobeast(tmp_path, "--learning_rte", "0.1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--learning_rte" in lines[0] and "did you mean --learning_rate?" in lines[0]


def test_flags_take_the_dashed_spelling_too():
    flags = parse_flags(["--entropy-cost", "0.02", "--use-lstm", "--num-actors=3"])
    assert (flags.entropy_cost, flags.use_lstm, flags.num_actors) == (0.02, True, 3)
    # A value that looks like a flag is left alone.
    flags = parse_flags(["--env", RIVERRAID, "--move-penalty=-1e-05"], make_learner_parser(""))
    assert flags.move_penalty == -1e-05


def test_help_groups_the_flags_and_says_each_default_once():
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.monobeast", "--help"],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    for group in ("Run:", "Model:", "Loss:", "Optimizer:", "Atari environments:"):
        assert f"\n{group}\n" in result.stdout
    assert "(default: None)" not in result.stdout and "(default: False)" not in result.stdout
    xpid = result.stdout[result.stdout.index("  --xpid XPID") :].split("\n  --")[0]
    assert xpid.count("default") == 1


def test_print_settings_lists_every_value_with_its_source_and_starts_nothing(tmp_path):
    result = monobeast(tmp_path, "--env", SPACE_INVADERS, "--batch_size", "8", "--print_settings")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["--learning_rate"][1:] == ["0.0028", "preset", "MinAtar/SpaceInvaders-v1"]
    assert rows["--batch_size"][1:] == ["8", "command", "line"]
    assert rows["--discounting"][1:] == ["0.99", "default"]
    assert not (tmp_path / "latest").exists()


def test_a_run_records_the_source_of_every_flag_in_meta_json_and_logs_its_presets(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("hidden_size = 32\n")
    result = monobeast(
        tmp_path, "--env", "MinAtar/Breakout-v1", "--config", str(config), "--total_steps",
        "400", "--num_actors", "1", "--envs_per_actor", "2", "--batch_size", "2",
        "--disable_cuda", "--xpid", "r",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["flags"]["torso"] == "grid" and meta["flags"]["hidden_size"] == 32
    assert meta["sources"]["torso"] == "preset MinAtar"
    assert meta["sources"]["hidden_size"] == f"file {config}"
    assert meta["sources"]["total_steps"] == "command line"
    assert meta["flags"].keys() == meta["sources"].keys()
    assert (
        "Settings from the preset MinAtar: --torso grid --entropy_cost 0.01 "
        "(--no_presets leaves them out)." in result.stdout
    )


# --------------------------------------------------------------------------- plug-ins

PLUGIN = '''
import dataclasses

import gymnasium as gym
import numpy as np

from torchbeast.core.settings import flag
from torchbeast.envs.batched import BatchedEnv
from torchbeast.envs.family import EnvFamily, Preset


class Corridor(gym.Env):
    """Walk right (action 1) to the end of a corridor of ``length`` cells: reward 1 there."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=4):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.position = 0

    def _observe(self):
        observation = np.zeros(self.length, np.float32)
        observation[self.position] = 1.0
        return observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self._observe(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        ended = self.position == self.length - 1
        return self._observe(), float(ended), ended, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)


@dataclasses.dataclass(frozen=True)
class CorridorOptions:
    corridor_length: int = flag(4, "Cells.", check="positive")


class CorridorFamily(EnvFamily):
    name = "Corridor"
    summary = "a test package's corridors"
    options = CorridorOptions

    def takes(self, env_id, spec):
        return spec.id == "Corridor-v0"

    def presets(self, env_id, given):
        return [Preset("Corridor", {"hidden_size": 16}, "the test's own")]

    def make(self, settings, num_envs, num_threads, render):
        length = settings.option("corridor_length")
        vector_env = gym.vector.SyncVectorEnv(
            [lambda: gym.wrappers.TimeLimit(Corridor(length), 50)] * num_envs,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        return BatchedEnv(vector_env, settings.env, track_lives=False)


@dataclasses.dataclass(frozen=True)
class RateOptions:
    learning_rate: float = flag(0.1, "A name the learner's flag has.")


class ClashingFamily(EnvFamily):
    name = "Clashing"
    options = RateOptions

    def takes(self, env_id, spec):
        return False


@dataclasses.dataclass(frozen=True)
class PresetsOptions:
    presets: bool = flag(False, "A switch, whose --no_presets is the command line's own.")


class SwitchClashingFamily(ClashingFamily):
    name = "SwitchClashing"
    options = PresetsOptions


@dataclasses.dataclass(frozen=True)
class MazeOptions:
    corridor_length: int = flag(4, "The corridor family's flag's name.")


class MazeFamily(EnvFamily):
    name = "Maze"
    options = MazeOptions

    def takes(self, env_id, spec):
        return False


class BadPresetFamily(EnvFamily):
    name = "BadPreset"

    def takes(self, env_id, spec):
        return env_id == "CartPole-v1"

    def presets(self, env_id, given):
        return [Preset("BadPreset", {"learning_rate": "fast"}, "none")]


class RaisingFamily(EnvFamily):
    name = "Raising"

    def takes(self, env_id, spec):
        raise RuntimeError("the family's index is missing")
'''


@pytest.fixture
def plugin_path(tmp_path):
    """A package ``corridors`` installed in ``tmp_path/site`` as pip would, with its entry
    point; on PYTHONPATH, every process of a run finds it."""
    site = tmp_path / "site"
    (site / "corridors").mkdir(parents=True)
    (site / "corridors" / "__init__.py").write_text(PLUGIN)
    info = site / "corridors-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corridors\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[torchbeast.env_families]\ncorridor = corridors:CorridorFamily\n"
    )
    return str(site)


def run_with(plugin_path: str, module: str, *args: str, timeout: float = 180):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([plugin_path, REPO])}
    return warm_start.run(
        [sys.executable, "-m", module, *args],
        timeout=timeout, env=environment,
    )  # fmt: skip


def test_a_packages_family_registers_through_its_entry_point_and_trains(tmp_path, plugin_path):
    result = run_with(
        plugin_path, "torchbeast.monobeast", "--env", "Corridor-v0", "--corridor_length", "3",
        "--savedir", str(tmp_path), "--xpid", "r", "--total_steps", "3000", "--num_actors",
        "2", "--envs_per_actor", "2", "--batch_size", "4", "--unroll_length", "10",
        "--disable_cuda", "--seed", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["flags"]["corridor_length"] == 3 and meta["flags"]["hidden_size"] == 16
    assert meta["sources"]["hidden_size"] == "preset Corridor"
    rows = [row for row in read_rows(tmp_path / "r" / "logs.csv") if row["episodes"] != "0"]
    # Three cells: the shortest walk is two steps right; no episode is shorter.
    lengths = [float(row["mean_episode_length"]) for row in rows]
    assert rows and min(lengths) >= 2.0
    assert "Settings from the preset Corridor: --hidden_size 16" in result.stdout


def test_a_packages_family_flags_have_their_own_help_group(plugin_path):
    result = run_with(plugin_path, "torchbeast.monobeast", "--help")
    assert result.returncode == 0
    assert "\nCorridor environments:\n  --corridor_length" in result.stdout
    result = run_with(plugin_path, "torchbeast.polybeast_env", "--help")
    assert "--corridor_length" in result.stdout


def test_a_broken_plugin_is_one_warning_and_the_rest_runs(tmp_path, plugin_path):
    broken = os.path.join(plugin_path, "corridors-0.1.dist-info", "entry_points.txt")
    with open(broken, "a") as f:
        f.write("broken = corridors:NoSuchFamily\n")
    result = run_with(
        plugin_path, "torchbeast.monobeast", "--env", "CartPole-v1", "--print_settings"
    )
    assert result.returncode == 0, result.stderr
    assert "Env family 'broken'" in result.stderr + result.stdout
    assert "--corridor_length" in result.stdout  # the good family of the package still loads


def add_entry_point(plugin_path: str, line: str) -> None:
    with open(os.path.join(plugin_path, "corridors-0.1.dist-info", "entry_points.txt"), "a") as f:
        f.write(line + "\n")


def test_a_plugin_that_declares_a_flag_of_ours_is_one_line_naming_it(plugin_path):
    # Every command, --help too, was a ValueError's traceback: "declared by two settings".
    add_entry_point(plugin_path, "clashing = corridors:ClashingFamily")
    for command in (["--help"], ["--env", "CartPole-v1", "--print_settings"]):
        result = run_with(plugin_path, "torchbeast.monobeast", *command)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            "error: env family 'Clashing' (entry point corridors:ClashingFamily) declares "
            "--learning_rate, which torchbeast's own settings declare: rename its flag, or "
            "uninstall its package"
        ]


def test_a_plugin_whose_takes_raises_for_its_own_env_says_so(tmp_path, plugin_path):
    # Left out, its Corridor-v0 trained on the generic family: the default length, without
    # its preset, and --corridor_length unread.
    entry_points = os.path.join(plugin_path, "corridors-0.1.dist-info", "entry_points.txt")
    with open(entry_points, "w") as f:  # asked before the family that takes Corridor-v0
        f.write("[torchbeast.env_families]\nraising = corridors:RaisingFamily\n")
        f.write("corridor = corridors:CorridorFamily\n")
    result = run_with(
        plugin_path, "torchbeast.monobeast", "--env", "Corridor-v0", "--savedir", str(tmp_path)
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: env family 'Raising' (entry point corridors:RaisingFamily) failed to tell "
        "whether it takes 'Corridor-v0': RuntimeError: the family's index is missing; fix or "
        "reinstall its package"
    )


def test_a_plugin_switch_whose_off_flag_is_one_of_ours_is_one_line_naming_both(plugin_path):
    # A switch takes --no_<name> too: argparse's conflict was a traceback.
    add_entry_point(plugin_path, "switch = corridors:SwitchClashingFamily")
    result = run_with(plugin_path, "torchbeast.monobeast", "--help")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: env family 'SwitchClashing' (entry point corridors:SwitchClashingFamily) "
        "declares --presets, a switch, so --no_presets too, which torchbeast's own settings "
        "declare: rename its flag, or uninstall its package"
    )


def test_two_plugins_that_declare_one_flag_are_both_named(plugin_path):
    # "... which torchbeast's own settings declare": it was the other plug-in's.
    add_entry_point(plugin_path, "maze = corridors:MazeFamily")
    result = run_with(plugin_path, "torchbeast.monobeast", "--help")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: env family 'Maze' (entry point corridors:MazeFamily) declares "
        "--corridor_length, which env family 'Corridor' (entry point "
        "corridors:CorridorFamily) declares too: rename its flag, or uninstall its package"
    )


def test_a_plugin_preset_of_a_value_its_flag_does_not_take_names_the_preset(plugin_path):
    # "argument --learning_rate: invalid positive_float value: 'fast'", of a flag not given.
    add_entry_point(plugin_path, "badpreset = corridors:BadPresetFamily")
    result = run_with(plugin_path, "torchbeast.monobeast", "--env", "CartPole-v1")
    assert result.returncode == 2
    assert (
        "error: the preset BadPreset sets --learning_rate 'fast', which it does not take "
        "(could not convert string to float: 'fast'): the env family's preset is wrong; "
        "--no_presets leaves presets out"
    ) in result.stderr


def test_a_plugin_whose_takes_raises_is_left_out_and_the_run_goes_on(tmp_path, plugin_path):
    # It stopped every run, of any env, with the plug-in's traceback.
    add_entry_point(plugin_path, "raising = corridors:RaisingFamily")
    result = run_with(
        plugin_path, "torchbeast.monobeast", "--mode", "test", "--random_policy", "--env",
        "CartPole-v1", "--xpid", "a", "--savedir", str(tmp_path), "--num_episodes", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        "env family 'Raising' (entry point corridors:RaisingFamily) is left out: its "
        "takes('CartPole-v1') raised RuntimeError: the family's index is missing"
    ) in result.stdout + result.stderr
    assert "Average returns over 1 episodes" in result.stdout


def test_create_env_passes_a_familys_options_to_its_envs(plugin_path):
    code = textwrap.dedent(
        """
        from torchbeast.config.flags import parse_flags
        from torchbeast.config.env import env_settings
        from torchbeast.envs import create_env
        flags = parse_flags(["--env", "Corridor-v0", "--corridor_length", "6"])
        env = create_env(env_settings(flags), 2)
        print(env.spec.observation_shape)
        """
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([plugin_path, REPO])}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(6,)"


def test_builtin_families_make_their_envs_with_their_options():
    env = create_env("MinAtar/Breakout-v1", num_envs=2)
    try:
        assert env.spec.observation_shape == (10, 10, 4)
        env.reset(seed=0)
        step = env.step(np.zeros(2, dtype=np.int64))
        assert step["frame"].shape == (2, 10, 10, 4)
    finally:
        env.close()


def test_the_env_list_shows_what_each_family_can_train_and_why_not(plugin_path):
    def listing(*args: str) -> str:
        result = run_with(plugin_path, "torchbeast.envs", *args, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    text = listing()
    for header in ("Atari: ", "MinAtar: ", "PixelCue: ", "Gymnasium: ", "Corridor: "):
        assert f"\n{header}" in "\n" + text
    assert "\n  CartPole-v1\n" in text and "\n  Corridor-v0\n" in text
    assert "Pendulum-v1" not in text and "Humanoid" not in text
    text = listing("Pendulum-v1", "--all")
    assert "Pendulum-v1  (cannot train: a Box action space" in text
    assert "Lists the environment ids" in listing("--help")


@pytest.mark.parametrize(
    "env_id, name, value, flag, default",
    [
        ("CartPole-v1", "fuel_multiplier", 2.0, "--fuel_multiplier 2.0", None),
        ("MinAtar/Breakout-v1", "no_fire_on_life_loss", True, "--no_fire_on_life_loss", False),
    ],
)
def test_a_flag_of_another_family_is_one_line_not_silently_ignored(
    env_id, name, value, flag, default
):
    # A Riverraid proxy on CartPole would have trained on CartPole's own reward.
    from torchbeast.envs import EnvError, EnvSettings

    with pytest.raises(EnvError) as refused:
        create_env(EnvSettings(env_id, options={name: value}))
    assert str(refused.value) == (
        f"{flag} is a flag of the Atari family (ale-py's Atari games, DeepMind "
        f"preprocessing); {env_id} is not one of its envs: leave it out"
    )
    create_env(EnvSettings(env_id, options={name: default})).close()  # its default: fine


def test_test_and_eval_take_the_env_and_model_from_the_checkpoint_not_the_presets(tmp_path):
    trained = monobeast(
        tmp_path, "--env", "MinAtar/Breakout-v1", "--no_presets", "--total_steps", "400",
        "--num_actors", "1", "--envs_per_actor", "2", "--batch_size", "2", "--disable_cuda",
        "--xpid", "r",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    # No --env: the checkpoint's. With --env: no preset (grid torso) against the MLP saved.
    for env_flag in ([], ["--env", "MinAtar/Breakout-v1"]):
        result = monobeast(
            tmp_path, *env_flag, "--mode", "eval", "--xpid", "r", "--num_episodes", "2"
        )
        assert result.returncode == 0, result.stderr
        report = json.loads((tmp_path / "r" / "eval.json").read_text())
        assert report["env"] == "MinAtar/Breakout-v1" and report["num_episodes"] == 2
        # The env's own reward: "return", not "proxy_return".
        assert "return" in report and "proxy_return" not in report
        assert report["episodes"][0]["return_per_step"] >= 0
    result = monobeast(tmp_path, "--mode", "test", "--xpid", "r", "--num_episodes", "1")
    assert result.returncode == 0, result.stderr
    assert "Average returns over 1 episodes" in result.stdout

"""Specification of the typed settings: built once from the parsed flags, frozen, what
every part of a run receives (core/ never an argparse namespace), and what PolyBeast's env
processes receive instead of a command line."""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_env_parser, make_learner_parser
from torchbeast.config.poly import poly_env_settings
from torchbeast.config.settings import build_settings, env_side_of
from torchbeast.core import checkpoint
from torchbeast.envs.settings import EnvSettings
from torchbeast.runtime.poly.trainer import learner_spec

CORE = Path(__file__).resolve().parent.parent / "torchbeast" / "core"


def poly_settings(*argv: str):
    return build_settings(parse_flags(["--xpid", "x", *argv], make_learner_parser("")), "poly")


def test_learner_settings_are_the_flags_of_the_same_names_and_frozen():
    settings = build_settings(parse_flags(["--entropy_cost", "0.02", "--optimizer", "adam"]))
    learner = settings.learner
    assert (learner.entropy_cost, learner.optimizer, learner.unroll_length) == (0.02, "adam", 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        learner.entropy_cost = 0.5  # nothing edits settings once they are built


def test_each_runtime_gets_its_own_settings_with_defaults_resolved_at_parse_time():
    argv = ["--xpid", "x", "--num_actors", "2", "--envs_per_actor", "4", "--batch_size", "8"]
    mono = build_settings(parse_flags(argv), "mono")
    assert mono.actors.num_buffers == 16  # 2 * actors * envs
    assert mono.runtime.central_inference is False
    poly = poly_settings(*argv[2:])
    assert poly.actors.num_buffers is None  # taken (the original's command lines), unused
    assert poly.runtime.max_learner_queue_size == 8  # --batch_size
    assert poly.runtime.stream_memory_mb > 0
    assert (poly.actors.num_actors, poly.actors.envs_per_actor) == (2, 4)


def test_the_run_records_every_flag_with_the_env_id_it_resolved():
    settings = poly_settings("--use_lstm")  # polybeast_learner: no --env
    recorded = settings.run.recorded_flags("CartPole-v1")
    assert recorded["env"] == "CartPole-v1" and recorded["use_lstm"] is True
    parsed = vars(parse_flags(["--xpid", "x"], make_learner_parser("")))
    assert recorded.keys() == parsed.keys() - {"auth_token"}  # a secret: in no record
    assert settings.env.env is None


def test_settings_pickle_as_they_go_to_actor_processes():
    settings = build_settings(parse_flags(["--xpid", "x", "--seed", "3"]), "mono")
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_polybeast_env_processes_get_what_polybeast_env_parses_from_the_same_command():
    learner = poly_settings(
        "--env", "CartPole-v1", "--seed", "4", "--envs_per_actor", "3", "--num_actors", "4"
    )
    env_side = env_side_of(learner)
    parsed = poly_env_settings(
        make_env_parser().parse_args(
            ["--env", "CartPole-v1", "--seed", "4", "--envs_per_stream", "3"]
        )
    )
    assert env_side == parsed
    assert pickle.loads(pickle.dumps(env_side)) == env_side


@pytest.mark.parametrize(
    "argv, servers",
    [(["--num_actors", "2"], 2), (["--num_actors", "9"], 4), (["--num_servers", "1"], 1)],
)
def test_classic_polybeast_starts_no_more_env_servers_than_it_dials(argv, servers):
    # 2 streams on the 2-core layout kept 4 server processes, two of them idle.
    assert env_side_of(poly_settings(*argv)).network.num_servers == servers
    given = poly_settings("--num_actors", "2", "--env_servers", "127.0.0.1:1,127.0.0.1:2,[::1]:3")
    assert len(env_side_of(given).network.server_addresses()) == 3  # as given


@pytest.mark.parametrize(
    "actors, processes, clients", [("2", 2, 1), ("6", 3, 2), ("16", 4, 4), ("7", 1, 7)]
)
def test_inverted_polybeast_starts_as_many_streams_as_num_actors(actors, processes, clients):
    # At most --num_servers (4) processes, each with as many clients: 4 x 1 streams of 8
    # envs for the 2 x 8 layout had trained 32 envs with a batch sized for 16.
    settings = poly_settings("--serve", "unix:/tmp/l", "--num_actors", actors)
    env_side = env_side_of(settings)
    assert env_side.connect == "unix:/tmp/l"
    assert (env_side.network.num_servers, env_side.clients_per_process) == (processes, clients)
    assert env_side.envs_per_stream == settings.actors.envs_per_actor


def test_a_resumed_learners_env_comes_from_its_checkpoint_and_leaves_settings_as_built(tmp_path):
    settings = poly_settings("--savedir", str(tmp_path))
    (tmp_path / "x").mkdir()
    checkpoint.save(str(tmp_path / "x" / "model.tar"), {"env": "CartPole-v1"})
    assert learner_spec(settings)[0].env_id == "CartPole-v1"
    assert settings.env.env is None


def test_core_never_sees_argparse():
    for path in CORE.glob("*.py"):
        tree = ast.parse(path.read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
        modules = {alias.name for node in imports for alias in node.names}
        modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "argparse" not in modules, path.name


# ------------------------------------------------- each setting declared once, as its flag


def declaring_classes() -> list[type]:
    """Every class of settings whose fields declare flags: the run's, each runtime's (its
    registry entry's), PolyBeast's and each env family's options."""
    from torchbeast.config import settings as run_settings
    from torchbeast.config.poly import NetworkSettings, PolyEnvSettings
    from torchbeast.core.settings import LearnerSettings, ModelSettings
    from torchbeast.envs.family import families
    from torchbeast.envs.settings import EnvSettings
    from torchbeast.runtime.registry import RUNTIMES, function

    classes = [
        EnvSettings,
        run_settings.RunSettings,
        run_settings.ActorSettings,
        run_settings.ReplaySettings,
        ModelSettings,
        LearnerSettings,
        NetworkSettings,
        PolyEnvSettings,
    ]
    classes += [function(entry.settings) for entry in RUNTIMES.values() if entry.settings]
    classes += [family.options for family in families() if family.options is not None]
    return classes


def declarations() -> list[tuple[str, str]]:
    """(flag name, class) for every field that declares a flag."""
    return [
        (field.name, settings_type.__name__)
        for settings_type in declaring_classes()
        for field in dataclasses.fields(settings_type)
        if "flag" in field.metadata
    ]


# Flags that steer the parse itself or the benchmark, not a setting of the run.
NOT_SETTINGS = {"help", "config", "no_presets", "print_settings"}
BENCH_ONLY = {"runtime", "warmup_steps", "bench_steps", "json", "sampling_only"}


def test_no_flag_is_declared_by_two_fields():
    names = [name for name, _ in declarations()]
    twice = {name: [c for n, c in declarations() if n == name] for name in names}
    assert {name: owners for name, owners in twice.items() if len(owners) > 1} == {}


def test_every_flag_of_every_command_is_a_declared_setting():
    from torchbeast.config.parsers import make_bench_parser, make_runtime_parser
    from torchbeast.runtime.registry import RUNTIMES

    declared = {name for name, _ in declarations()}
    parsers = [make_runtime_parser(name) for name in RUNTIMES]
    parsers += [make_env_parser(), make_bench_parser(list(RUNTIMES))]
    for parser in parsers:
        dests = {action.dest for action in parser._actions}
        assert dests - declared - NOT_SETTINGS - BENCH_ONLY == set(), parser.description
    assert declared <= set().union(*({a.dest for a in p._actions} for p in parsers))


def test_the_parsers_defaults_are_the_settings_defaults():
    """Settings built from a command line of defaults equal the classes' own defaults:
    the flag's default is the field's, declared in one place."""
    from torchbeast.core.settings import LearnerSettings, ModelSettings

    settings = build_settings(parse_flags(["--xpid", "x", "--seed", "1"]), "mono")
    assert settings.learner == LearnerSettings()
    assert settings.model == ModelSettings()
    assert settings.runtime == type(settings.runtime)()
    assert (settings.env.env, settings.env.seed) == ("PongNoFrameskip-v4", 1)


def test_a_declared_check_refuses_what_the_flag_refuses(capsys):
    from torchbeast.core.settings import flag

    for argv, rule in [
        (["--batch_size", "0"], "must be a positive integer"),
        (["--discounting", "1.5"], "must be in [0, 1]"),
        (["--entropy_cost", "-1"], "must be a finite number >= 0"),
        (["--fuel_multiplier", "nan"], "must be a finite number"),
        (["--optimizer", "sgd"], "invalid choice"),
    ]:
        with pytest.raises(SystemExit):
            parse_flags(["--xpid", "x", *argv])
        assert rule in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown check 'even'"):
        flag(2, "A setting.", check="even")


def test_a_flag_declared_by_two_settings_is_refused():
    from torchbeast.config.argparser import FlagParser
    from torchbeast.config.declared import add_declared_flags
    from torchbeast.core.settings import RUN, flag

    @dataclasses.dataclass(frozen=True)
    class Mine:
        flags_group = RUN
        env: str = flag("Mine-v0", "Another --env.")

    parser = FlagParser()
    add_declared_flags(parser, EnvSettings)
    add_declared_flags(parser, EnvSettings)  # the same declaration again: one flag
    with pytest.raises(ValueError, match="--env is declared by two settings"):
        add_declared_flags(parser, Mine)


def test_ray_address_auto_of_a_cluster_on_127_0_0_1_joins_it_as_a_single_machine_one(
    tmp_path, monkeypatch
):
    import os
    import socket

    from torchbeast.runtime.ray import prepare
    from torchbeast.runtime.training import TrainingError

    # `ray start --head` as the manual shows: Ray swapped the 127.0.0.1 it read for this
    # machine's network address and retried it forever.
    with socket.create_server(("127.0.0.1", 0)) as head:
        address = f"127.0.0.1:{head.getsockname()[1]}"
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(address + "\n")
        for name in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE"):
            monkeypatch.delenv(name, raising=False)  # restored after: prepare sets them
        for name in ("RAY_USAGE_STATS_ENABLED", "RAY_IGNORE_UNHANDLED_ERRORS"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
        monkeypatch.setattr(prepare, "ANSWER_TIMEOUT_S", 0.5)  # this head never answers
        found = str(tmp_path / "ray" / "ray_current_cluster")
        assert prepare.auto_address() == (address, found)
        with pytest.raises(TrainingError, match="takes connections but did not answer"):
            prepare.prepare_ray_environment("auto")  # Ray's settings made before that
        assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")  # Ray's own order: this one first
    assert prepare.auto_address() == ("10.0.0.7:6379", "$RAY_ADDRESS")

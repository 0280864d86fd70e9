"""Specification of the flag parser: monobeast's flags and defaults, the new flags,
refusal of impossible values, and the manual's flag tables generated from the parsers."""

import os
import re
from pathlib import Path

import pytest

from torchbeast import docs
from torchbeast.config import flags
from torchbeast.config.parsers import make_learner_parser, make_ray_parser
from torchbeast.config.reference import markdown_reference, markers

REPO = Path(__file__).resolve().parent.parent
DIFFERENCES = REPO / "docs" / "differences.md"  # the manual's page of what changed


def parse(*argv: str):
    return flags.parse_flags(list(argv))


def refusal(capsys, *argv: str) -> str:
    """Parses argv expecting argparse's refusal; returns what it wrote on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# The original monobeast flags keep their defaults, but for the learning recipe's.


@pytest.mark.parametrize(
    "name, default",
    [
        ("env", "PongNoFrameskip-v4"),
        ("mode", "train"),
        ("num_learner_threads", 2),
        ("disable_cuda", False),
        ("disable_checkpoint", False),
        ("use_lstm", False),
        ("baseline_cost", 0.5),
        ("discounting", 0.99),
        ("reward_clipping", "abs_one"),
        ("alpha", 0.99),
        ("momentum", 0),
        ("grad_norm_clipping", 40),
    ],
)
def test_original_flag_has_the_original_default(name, default):
    assert getattr(parse(), name) == default


# The recipe that learns Pong on 2 cores (the manual: "Does it learn?") replaced these.


@pytest.mark.parametrize(
    "name, default",
    [
        ("total_steps", 5_000_000),
        ("batch_size", 16),
        ("unroll_length", 5),
        ("entropy_cost", 0.001),
        ("learning_rate", 0.0007),
        ("epsilon", 1e-5),
        ("rmsprop_init", 1.0),
        ("epochs", 2),
        ("ppo_clip", 0.2),
        ("weight_init", "orthogonal"),
    ],
)
def test_recipe_flag_has_the_recipe_default(name, default):
    assert getattr(parse(), name) == default


def test_every_changed_default_is_listed_with_the_originals_value():
    # Only the listed flags (and num_buffers, derived from them) differ from the original.
    recipe, original = vars(parse("--xpid", "x")), vars(parse("--xpid", "x", *original_argv()))
    changed = {name for name in recipe if recipe[name] != original[name]}
    # From the flags above (layout_source says which); the seed is drawn for each parse.
    derived = {"num_buffers", "layout_source", "seed"}
    assert changed == set(flags.ORIGINAL_DEFAULTS) | derived


def test_the_manual_lists_every_changed_default_in_its_deliberate_differences():
    section = DIFFERENCES.read_text().split("Deliberate differences")[1].split("\n- ")[1]
    first_cells = [row.split("|")[1] for row in section.splitlines() if row.startswith("  |")]
    listed = {name for cell in first_cells for name in re.findall(r"`--(\w+)`", cell)}
    assert set(flags.ORIGINAL_DEFAULTS) <= listed


def original_argv() -> list[str]:
    return [f"--{name}={value}" for name, value in flags.ORIGINAL_DEFAULTS.items()]


def test_the_original_values_restore_the_original_defaults():
    restored = parse(*original_argv())
    assert {
        name: getattr(restored, name) for name in flags.ORIGINAL_DEFAULTS
    } == flags.ORIGINAL_DEFAULTS
    assert restored.num_buffers == 8  # the original's max(2 * 4 actors, batch size 8)


def test_default_layout_is_8_envs_per_actor_over_half_the_cores(monkeypatch):
    for cores, layout in [(1, (1, 8)), (2, (2, 8)), (3, (2, 8)), (4, (2, 8)), (16, (8, 8))]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        parsed = parse()
        assert (parsed.num_actors, parsed.envs_per_actor) == layout
        assert parsed.layout_source == f"chosen for {cores} cores"


def test_num_actors_alone_keeps_one_env_per_actor_as_the_original():
    parsed = parse("--num_actors", "45")
    assert (parsed.num_actors, parsed.envs_per_actor) == (45, 1)


def test_envs_per_actor_alone_takes_the_layouts_actor_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    parsed = parse("--envs_per_actor", "3")
    assert (parsed.num_actors, parsed.envs_per_actor) == (2, 3)


def test_mode_accepts_train_test_test_render_and_eval():
    modes = ("train", "test", "test_render", "eval")
    assert [parse("--mode", mode, "--xpid", "x").mode for mode in modes] == list(modes)


def test_mode_refuses_another_value(capsys):
    assert "--mode" in refusal(capsys, "--mode", "evaluate")


def test_reward_clipping_accepts_none(capsys):
    assert parse("--reward_clipping", "none").reward_clipping == "none"
    assert "--reward_clipping" in refusal(capsys, "--reward_clipping", "abs_two")


def test_default_xpid_is_torchbeast_and_a_timestamp():
    assert re.fullmatch(r"torchbeast-\d{8}-\d{6}", parse().xpid)


def test_default_savedir_is_logs_torchbeast_in_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse().savedir == os.path.join(str(tmp_path), "logs", "torchbeast")


def test_savedir_expands_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse("--savedir", "~/runs").savedir == os.path.join(str(tmp_path), "runs")


def test_savedir_expands_home_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse("--savedir", "$HOME/runs").savedir == os.path.join(str(tmp_path), "runs")


def test_num_buffers_defaults_to_twice_the_actors():
    assert parse("--num_actors", "6", "--batch_size", "8").num_buffers == 12


def test_num_buffers_defaults_to_batch_size_when_that_is_larger():
    assert parse("--num_actors", "3", "--batch_size", "8").num_buffers == 8


def test_num_buffers_default_with_the_default_flags_is_twice_the_envs(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert parse().num_buffers == 2 * 16


def test_num_buffers_given_is_kept():
    assert parse("--num_buffers", "60").num_buffers == 60


def test_num_threads_is_an_alias_of_num_learner_threads():
    assert parse("--num_threads", "4").num_learner_threads == 4
    assert parse("--num_learner_threads", "3").num_learner_threads == 3


@pytest.mark.parametrize("name", ["disable_cuda", "use_lstm", "use_resnet", "disable_checkpoint"])
def test_switch_flag_sets_true(name):
    assert getattr(parse(f"--{name}"), name) is True


# The flags added since monobeast.


@pytest.mark.parametrize(
    "name, default",
    [
        ("num_episodes", 10),
        ("use_resnet", False),
        ("hidden_size", None),
        ("num_layers", None),
    ],
)
def test_new_flag_default(name, default):
    assert getattr(parse(), name) == default


def test_a_training_run_without_seed_draws_one_and_test_modes_keep_none():
    seeds = {parse("--xpid", "x").seed for _ in range(5)}
    assert len(seeds) > 1 and all(0 <= seed < 1_000_000 for seed in seeds)
    assert parse("--seed", "3").seed == 3
    test, eval_ = (parse("--mode", mode, "--xpid", "x") for mode in ("test", "eval"))
    assert test.seed is None and eval_.seed is None


def test_new_flags_parse_their_values():
    parsed = parse(
        "--seed",
        "7",
        "--num_episodes",
        "3",
        "--hidden_size",
        "128",
        "--num_layers",
        "2",
        "--envs_per_actor",
        "2",
    )
    assert (
        parsed.seed,
        parsed.num_episodes,
        parsed.hidden_size,
        parsed.num_layers,
        parsed.envs_per_actor,
    ) == (7, 3, 128, 2, 2)


def test_num_buffers_default_counts_every_env_of_every_actor():
    parsed = parse("--num_actors", "4", "--envs_per_actor", "3", "--batch_size", "8")
    assert parsed.num_buffers == 2 * 4 * 3


# The original README's command lines work as written.


def test_original_readme_monobeast_command_line_parses():
    parsed = parse(
        *"--env PongNoFrameskip-v4 --num_actors 45 --total_steps 30000000 "
        "--learning_rate 0.0004 --epsilon 0.01 --entropy_cost 0.01 --batch_size 4 "
        "--unroll_length 80 --num_buffers 60 --num_threads 4 --xpid example".split()
    )
    assert vars(parsed) == vars(parse()) | {
        "seed": parsed.seed,  # drawn
        "num_actors": 45,
        "envs_per_actor": 1,  # naming --num_actors alone keeps the original's layout
        "layout_source": "--num_actors",
        "total_steps": 30000000,
        "epsilon": 0.01,
        "unroll_length": 80,
        "learning_rate": 0.0004,
        "entropy_cost": 0.01,
        "batch_size": 4,
        "num_buffers": 60,
        "num_learner_threads": 4,
        "xpid": "example",
    }


def test_original_readme_test_mode_command_line_parses():
    parsed = parse("--env", "PongNoFrameskip-v4", "--mode", "test", "--xpid", "example")
    assert (parsed.mode, parsed.xpid) == ("test", "example")


# Impossible values are refused with exit code 2 and a message naming the flag.


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--batch_size", "0"], "--batch_size"),
        (["--num_actors", "-1"], "--num_actors"),
        (["--unroll_length", "0"], "--unroll_length"),
        (["--total_steps", "0"], "--total_steps"),
        (["--num_threads", "0"], "--num_learner_threads"),
        (["--envs_per_actor", "0"], "--envs_per_actor"),
        (["--num_episodes", "0"], "--num_episodes"),
        (["--hidden_size", "0"], "--hidden_size"),
        (["--num_layers", "0"], "--num_layers"),
        (["--fuel_multiplier", "nan"], "--fuel_multiplier"),
        (["--move_penalty", "inf"], "--move_penalty"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**64)], "--seed"),  # torch's seed overflowed in a traceback
        (["--discounting", "1.5"], "--discounting"),
        (["--discounting", "-0.1"], "--discounting"),
        (["--learning_rate", "0"], "--learning_rate"),
        (["--learning_rate", "inf"], "--learning_rate"),
        (["--learning_rate", "1e39"], "--learning_rate"),  # beyond float32
        (["--entropy_cost", "inf"], "--entropy_cost"),
        (["--checkpoint_interval", "inf"], "--checkpoint_interval"),
        (["--epsilon", "0"], "--epsilon"),
        (["--alpha", "2"], "--alpha"),
        (["--entropy_cost", "-1"], "--entropy_cost"),
        (["--entropy_cost", "nan"], "--entropy_cost"),
        (["--grad_norm_clipping", "0"], "--grad_norm_clipping"),
        (["--batch_size", "eight"], "--batch_size"),
        # It trained into a folder named "$TORCHBEAST_UNSET_VARIABLE" in the working one.
        (["--savedir", "$TORCHBEAST_UNSET_VARIABLE/x"], "names $TORCHBEAST_UNSET_VARIABLE, "),
    ],
)
def test_impossible_value_is_refused_naming_the_flag(capsys, argv, named):
    assert named in refusal(capsys, *argv)


def test_too_few_buffers_for_the_batch_are_refused_with_the_fix(capsys):
    message = refusal(capsys, "--num_actors", "4", "--num_buffers", "3", "--batch_size", "8")
    assert "--num_buffers 3" in message
    assert "use --num_buffers 8 or more" in message


def test_buffers_equal_to_the_batch_size_are_enough():
    parsed = parse("--num_actors", "4", "--num_buffers", "8", "--batch_size", "8")
    assert parsed.num_buffers == 8


def test_too_few_buffers_for_several_envs_per_actor_are_refused(capsys):
    # Each actor holds envs_per_actor - 1 buffers while it fills the last one.
    message = refusal(
        capsys, "--num_actors", "2", "--envs_per_actor", "3", "--batch_size", "8",
        "--num_buffers", "11",
    )  # fmt: skip
    assert "use --num_buffers 12 or more" in message


def learner_parser(runtime: str):
    return make_learner_parser("") if runtime == "poly" else make_ray_parser()


@pytest.mark.parametrize("runtime", ["poly", "ray"])
def test_runtimes_without_shared_memory_buffers_take_any_num_buffers_and_drop_it(runtime):
    # Only MonoBeast keeps rollouts in --num_buffers buffers; the others take the flag (the
    # original's command lines give it) and drop it, so that nothing sizes the run by it.
    argv = ["--xpid", "test", "--batch_size", "8", "--num_buffers", "4"]
    parsed, sources = flags.parse_flags_and_sources(argv, learner_parser(runtime))
    assert (parsed.batch_size, parsed.num_buffers) == (8, None)
    assert sources["num_buffers"] == flags.DERIVED


@pytest.mark.parametrize("xpid", ["runs/example", "../example", "..", "a b"])
def test_xpid_that_is_not_a_plain_folder_name_is_refused(capsys, xpid):
    assert "--xpid" in refusal(capsys, "--xpid", xpid)


@pytest.mark.parametrize("mode", ["train", "test"])
def test_an_empty_xpid_is_refused_not_taken_for_a_new_name(capsys, mode):
    # --xpid "$NAME" with NAME unset: a training run named from the time would be a
    # run nobody asked for, and no later command could find it by the name meant.
    message = refusal(capsys, "--mode", mode, "--xpid", "")
    assert "--xpid is empty: give the run a name, or leave --xpid out" in message


def test_xpid_with_dots_dashes_and_equals_is_accepted():
    assert parse("--xpid", "pong-lr=4e-4.v2_b").xpid == "pong-lr=4e-4.v2_b"


# The manual's flag tables are generated from the parsers.


def test_markdown_reference_has_a_row_per_flag():
    table = markdown_reference()
    assert "| `--num_learner_threads` `--num_threads` | `2` | Number learner threads. |" in table
    assert "| `--mode` {train,test,test_render,eval} | `train` | Training or test mode;" in table
    assert "| `--seed` |  | (new) Seed for the environments and the model (default: drawn" in table


def test_update_pages_writes_each_table_into_the_page_that_holds_its_markers(tmp_path):
    tables = docs.generated_tables()
    (tmp_path / "docs").mkdir()
    flags_page, other = tmp_path / "docs" / "flags.md", tmp_path / "docs" / "environments.md"
    old = "".join(
        f"{begin}\nold table\n{end}\n\n"
        for table, (begin, end) in zip(tables, map(markers, tables), strict=True)
        if table != "presets"
    )
    flags_page.write_text(f"# Title\n\n{old}End.\n")
    begin, end = markers("presets")
    other.write_text(f"# Environments\n\n{begin}\nold\n{end}\n")
    (tmp_path / "README.md").write_text("# Front page, no table\n")
    docs.update_pages(tmp_path)
    new = "".join(
        f"{begin}\n{tables[table]}\n{end}\n\n"
        for table, (begin, end) in zip(tables, map(markers, tables), strict=True)
        if table != "presets"
    )
    assert flags_page.read_text() == f"# Title\n\n{new}End.\n"
    assert other.read_text() == f"# Environments\n\n{begin}\n{tables['presets']}\n{end}\n"
    assert (tmp_path / "README.md").read_text() == "# Front page, no table\n"


def test_the_manual_has_a_flag_table_for_every_runtime_with_flags_of_its_own():
    assert set(docs.generated_tables()) == {
        "flags",
        "monoflags",
        "polyflags",
        "rayflags",
        "presets",
    }


def test_the_manuals_tables_are_in_sync_with_the_parsers():
    for table, body in docs.generated_tables().items():
        page = docs.page_of(table, REPO)  # exactly one page holds its markers
        text = page.read_text()
        begin, end = markers(table)
        block = text[text.index(begin) + len(begin) + len("\n") : text.index(end)]
        assert block == body + "\n", f"{page}'s {table} table is stale: run `make docs`"


def test_the_polybeast_flag_tables_leave_the_shared_flags_to_the_first():
    block = docs.generated_tables()["polyflags"]
    assert "| `--serve` |" in block and "| `--connect` |" in block
    shared, rest = block.split("`polybeast_learner` (its environments are someone else's)")
    assert "| `--env` |" not in shared  # shared flags: table above


def test_the_polybeast_flag_tables_give_polybeast_learners_own_defaults():
    # Its streams are polybeast_env's: a shared flag with another default gets a row of its
    # own; the others stay in the first table.
    learner_rows = docs.generated_tables()["polyflags"].split("`polybeast_env`")[0]
    learner_rows = learner_rows.split("where it differs from the first table")[1]
    rows = {
        found.group(1): line
        for line in learner_rows.splitlines()
        if (found := re.match(r"\| `(--\w+)`", line))
    }
    learner, first = make_learner_parser(""), flags.make_parser()
    differing = {
        f"--{action.dest}"
        for action in learner._actions
        if action.option_strings
        and action.dest in vars(first.parse_args([]))
        and learner.get_default(action.dest) != first.get_default(action.dest)
    }
    assert differing == {"--env", "--envs_per_actor"}
    assert differing <= set(rows), rows
    assert rows["--envs_per_actor"].startswith("| `--envs_per_actor` | `1` |")


def test_replay_ratio_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        flags.parse_flags(["--replay_size", "1000", "--replay_ratio", "0"])
    assert "--replay_ratio: must be a positive integer, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("servers", [",", " , "])
def test_env_servers_that_name_no_address_are_refused_in_one_line(capsys, servers):
    # A learner given none dialled no server and failed with a ZeroDivisionError.
    with pytest.raises(SystemExit):
        flags.parse_flags(["--env_servers", servers], make_learner_parser(""))
    assert "--env_servers names no address: give host:port" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--serve", "127.0.0.1:99999"], "--serve '127.0.0.1:99999' has no port in 1-65535"),
        (["--serve", "127.0.0.1:abc"], "has no port in 1-65535 ('abc')"),
        (["--serve", "unix:"], "unix: names no socket path"),
        (["--serve", "notanaddress"], "is not host:port or unix:PATH"),
        (["--env_servers", "127.0.0.1:4431,:4432"], "':4432' is not host:port"),
        (  # the servers' addresses are it plus .0, .1, ...: said '127.0.0.1:4431.0' before
            ["--pipes_basename", "127.0.0.1:4431"],
            "--pipes_basename '127.0.0.1:4431' is no unix:PATH: each env server adds .N to "
            "it; give host:port addresses with --env_servers",
        ),
        (  # --env_servers went unused
            ["--serve", "unix:/tmp/learner", "--env_servers", "127.0.0.1:4431"],
            "--serve (inverted mode: env clients dial the learner) and --env_servers (classic "
            "mode: the learner dials env servers) exclude each other: keep one",
        ),
    ],
)
def test_an_address_grpc_would_misread_is_refused_in_one_line(capsys, argv, said):
    # gRPC served port 99999 as 34463 where the clients dialled 99999, and dialled a
    # malformed address forever.
    with pytest.raises(SystemExit):
        flags.parse_flags(argv, make_learner_parser(""))
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_polybeast_env_refuses_an_address_grpc_would_misread(capsys):
    from torchbeast import polybeast_env

    for argv, said in [
        (["--connect", "127.0.0.1:0"], "--connect '127.0.0.1:0' has no port"),
        (["--env_servers", ",,"], "--env_servers names no address"),
    ]:
        with pytest.raises(SystemExit):
            polybeast_env.main(["--env", "CartPole-v1", *argv])
        assert said in capsys.readouterr().err


def test_values_from_a_config_file_keep_their_source_where_a_resolver_hands_them_back(tmp_path):
    # The layout and run-folder resolvers return these whatever they were; meta.json and
    # --print_settings had called the file's values "derived".
    config = tmp_path / "run.toml"
    config.write_text('num_actors = 3\nxpid = "foo"\n')
    _, sources = flags.parse_flags_and_sources(["--config", str(config)])
    assert sources["num_actors"] == sources["xpid"] == f"file {config}"
    assert sources["envs_per_actor"] == "derived"  # one env per actor, as the original's


def test_num_episodes_in_training_is_refused_saying_what_stops_training(capsys):
    from torchbeast.cli import run

    with pytest.raises(SystemExit) as exit_info:  # before anything starts
        run(flags.make_parser(), ["--env", "CartPole-v1", "--num_episodes", "5"], "mono")
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        "error: --num_episodes counts the games of --mode test and eval; training stops at "
        "--total_steps" in error
    )


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["--auth_token", "k", "--alpha", "1"], ["--auth_token", "(hidden)", "--alpha", "1"]),
        (["--auth_token=k"], ["--auth_token=(hidden)"]),
        (["--auth_t", "k"], ["--auth_t", "(hidden)"]),  # a prefix argparse takes
    ],
)
def test_the_recorded_command_line_hides_the_auth_token(argv, shown):
    from torchbeast.config.poly import without_secrets

    assert without_secrets(argv) == shown


@pytest.mark.parametrize("where", ["command line", "file"])
def test_print_settings_hides_the_auth_token_but_says_one_was_given(capsys, tmp_path, where):
    # The table is pasted into issues and CI logs: it printed the token in clear.
    config = tmp_path / "token.toml"
    config.write_text('auth_token = "s3cret-7f1"\n')
    given = ["--auth_token", "s3cret-7f1"] if where == "command line" else ["--config", config]
    with pytest.raises(SystemExit) as exit_info:
        flags.parse_flags_and_sources([*map(str, given), "--print_settings"], make_learner_parser())
    assert exit_info.value.code == 0
    table = capsys.readouterr().out
    assert "s3cret" not in table
    (row,) = [line for line in table.splitlines() if line.startswith("--auth_token ")]
    assert row.split()[1] == "(hidden)" and where in row


@pytest.mark.parametrize("env", ["PongNoFrameskip-v4", "ALE/Pong-v5"])
def test_a_proxy_flag_on_another_game_takes_no_riverraid_preset(env):
    # The survival preset was listed for Pong (batch 4, unroll 80), which then refused it.
    parsed, sources = flags.parse_flags_and_sources(
        ["--env", env, "--true_move_penalty", "1"], make_learner_parser()
    )
    assert not any(source.startswith("preset") for source in sources.values()), sources
    riverraid, sources = flags.parse_flags_and_sources(
        ["--env", "ALE/Riverraid-v5", "--true_move_penalty", "1"], make_learner_parser()
    )
    assert sources["batch_size"] == "preset Riverraid survival proxy"
    assert riverraid.batch_size == 4 != parsed.batch_size


def test_the_command_line_turns_off_a_switch_a_preset_or_a_file_turned_on(tmp_path, capsys):
    # Riverraid's survival preset turns on the normalisations, and nothing but a file or
    # --no_presets could turn them off: the command line did not always win.
    survival = ["--env", "RiverraidNoFrameskip-v4", "--move_penalty", "0"]
    parsed, sources = flags.parse_flags_and_sources(survival, make_learner_parser())
    assert parsed.normalize_values is parsed.normalize_advantages is True
    parsed, sources = flags.parse_flags_and_sources(
        [*survival, "--no_normalize_values", "--no-normalize-advantages"], make_learner_parser()
    )
    assert parsed.normalize_values is parsed.normalize_advantages is False
    assert sources["normalize_values"] == sources["normalize_advantages"] == "command line"
    assert parsed.batch_size == 4  # the preset's other values stay
    config = tmp_path / "run.toml"
    config.write_text("use_lstm = true\n")
    assert parse("--config", str(config)).use_lstm is True
    assert parse("--config", str(config), "--no_use_lstm").use_lstm is False
    assert parse("--no_use_lstm", "--use_lstm").use_lstm is True  # the last one said
    assert parse("--use_lstm", "--no_use_l").use_lstm is False  # a prefix argparse takes
    # A switch whose name says "no" already has no --no_ of its own.
    assert "--no_no_fire_on_life_loss" in refusal(capsys, "--no_no_fire_on_life_loss")

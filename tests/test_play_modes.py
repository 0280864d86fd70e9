"""Test and eval modes as a user meets them: which run they play, what eval.json says of
it, and each mistake or failure said in one line before (or without) losing the games."""

from __future__ import annotations

import json
import os
import sys

from tests import warm_start
from tests.test_monobeast import assert_one_error_line, monobeast, read_rows

TRAIN = ["--env", "CartPole-v1", "--num_actors", "1", "--envs_per_actor", "2"]
TRAIN += ["--batch_size", "2", "--unroll_length", "20", "--disable_cuda"]


def test_xpid_latest_is_the_last_run_in_every_mode_and_training_resumes_it(tmp_path):
    assert monobeast(tmp_path, *TRAIN, "--total_steps", "400", "--xpid", "a").returncode == 0
    # It broke the link (latest -> latest) and failed, blaming --savedir.
    again = monobeast(tmp_path, *TRAIN, "--total_steps", "800", "--xpid", "latest")
    assert again.returncode == 0, again.stderr
    assert os.readlink(tmp_path / "latest") == "a"
    assert int(read_rows(tmp_path / "a" / "logs.csv")[-1]["step"]) >= 800
    played = monobeast(tmp_path, "--mode", "eval", "--xpid", "latest", "--num_episodes", "1")
    assert played.returncode == 0, played.stderr
    report = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert report["xpid"] == "a"  # "latest" before
    assert report["step"] == int(read_rows(tmp_path / "a" / "logs.csv")[-1]["step"])
    fresh = monobeast(tmp_path / "new", *TRAIN, "--xpid", "latest")
    assert fresh.returncode == 2
    assert "--xpid latest names the last run in" in fresh.stderr
    assert "and there is none: give the run a name" in fresh.stderr


def test_a_video_that_cannot_be_written_is_refused_before_any_game(tmp_path):
    assert monobeast(tmp_path, *TRAIN, "--total_steps", "200", "--xpid", "a").returncode == 0
    missing = tmp_path / "no" / "play.gif"
    # It played every game, then lost them all to the video's error (eval.json unwritten).
    played = monobeast(tmp_path, "--mode", "eval", "--xpid", "a", "--video", str(missing))
    assert played.returncode == 2
    assert f"--video {missing}: no folder {missing.parent}: create it" in played.stderr
    assert "Episode 1 ended" not in played.stdout


def test_test_render_without_a_display_says_so_and_what_to_use(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    played = warm_start.run(  # it played every game in no window, and exited 0
        [sys.executable, "-m", "torchbeast.monobeast", "--mode", "test_render", "--random_policy",
         "--env", "CartPole-v1", "--savedir", str(tmp_path), "--xpid", "a"],
        timeout=60, env=environment,
    )  # fmt: skip
    assert played.returncode == 2
    assert "--mode test_render opens a window, and this machine has no display" in played.stderr
    assert "--mode test --video FILE.gif" in played.stderr


def test_an_environment_that_raises_in_play_is_one_line_with_its_traceback_above(tmp_path):
    played = monobeast(
        tmp_path, "--mode", "test", "--random_policy", "--xpid", "a", "--num_episodes", "100",
        "--env", "tests.envs_for_tests:Raising-v0",
    )  # fmt: skip
    assert_one_error_line(
        played, "the environment failed: RuntimeError: the emulator crashed (traceback above)"
    )
    assert "raise RuntimeError" in played.stdout


def test_a_run_without_a_checkpoint_yet_says_so_not_train_first(tmp_path):
    run = [*TRAIN, "--total_steps", "200", "--disable_checkpoint", "--xpid", "a"]
    assert monobeast(tmp_path, *run).returncode == 0
    played = monobeast(tmp_path, "--mode", "eval", "--xpid", "a")
    assert_one_error_line(played, f"the run in {tmp_path / 'a'} has no checkpoint yet")
    assert "--disable_checkpoint" in played.stderr
    random = monobeast(tmp_path, "--mode", "test", "--random_policy", "--xpid", "b")
    assert_one_error_line(random, "give the random policy its env with --env")


def test_a_checkpoint_whose_model_is_damaged_is_one_line_in_test_and_eval(tmp_path):
    # Training refused these in one line; test and eval ended in a traceback.
    import torch

    assert monobeast(tmp_path, *TRAIN, "--total_steps", "200", "--xpid", "a").returncode == 0
    path = tmp_path / "a" / "model.tar"
    good = torch.load(path, weights_only=True)
    no_weights = {k: v for k, v in good.items() if k != "model_state_dict"}
    weights = dict(good["model_state_dict"])
    name = next(iter(weights))
    reshaped = {**good, "model_state_dict": {**weights, name: torch.zeros(3, 3)}}
    unknown_kind = {**good, "model_config": {**good["model_config"], "kind": "zzz"}}
    for state, said, modes in [
        (no_weights, "is damaged: it has no model_state_dict", ("test", "eval")),
        (reshaped, "is damaged: the model it records cannot be built, or its weights do not",
         ("eval",)),
        (unknown_kind, "(KeyError: 'zzz')", ("eval",)),
    ]:  # fmt: skip
        torch.save(state, path)
        for mode in modes:  # (both load the model alike)
            played = monobeast(tmp_path, "--mode", mode, "--xpid", "a", "--num_episodes", "1")
            assert_one_error_line(played, said)
            assert "restore it from a copy, or move it away to start the run anew" in (
                played.stderr
            )


def test_a_game_that_goes_on_says_so_every_minute(monkeypatch, caplog):
    from torchbeast import evaluation

    clock = [1000.0]
    monkeypatch.setattr(evaluation.time, "monotonic", lambda: clock[0])
    progress = evaluation.EpisodeProgress(num_episodes=3)
    with caplog.at_level("INFO", logger="torchbeast"):
        for _ in range(5):  # 5 steps of the first game in 50 s: no line yet
            clock[0] += 10
            progress.step(episodes_ended=0)
        clock[0] += 10
        progress.step(episodes_ended=0)  # a minute in
        progress.step(episodes_ended=1)  # the next game starts counting anew
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("Playing episode 1 of 3: 6 steps so far")
    assert progress.steps == 1 and progress.episodes == 1


def test_an_env_whose_observations_changed_since_training_is_one_line(tmp_path, monkeypatch):
    env = ["--env", "tests.envs_for_tests:Resizable-v0"]
    assert (
        monobeast(tmp_path, *TRAIN[2:], *env, "--total_steps", "200", "--xpid", "a").returncode == 0
    )
    monkeypatch.setenv("TB_TEST_OBSERVATION_SIZE", "5")  # its code changed: a traceback before
    for mode in ("test", "eval"):
        played = monobeast(tmp_path, "--mode", mode, "--xpid", "a", "--num_episodes", "1")
        assert_one_error_line(
            played, "was trained on tests.envs_for_tests:Resizable-v0 (float32 [3], 2 actions)",
            "but the environment now is tests.envs_for_tests:Resizable-v0 (float32 [5], 2 actions)",
        )  # fmt: skip


def test_rewards_that_are_not_numbers_are_one_line_not_nan_in_eval_json(tmp_path):
    played = monobeast(
        tmp_path, "--mode", "eval", "--random_policy", "--env", "tests.envs_for_tests:NanReward-v0",
        "--xpid", "a", "--num_episodes", "2",
    )  # fmt: skip
    assert_one_error_line(played, "episode 1's return is nan: the environment's rewards hold NaN")
    assert not (tmp_path / "a" / "eval_random.json").exists()  # it held NaN, which is no JSON


def test_an_atari_game_plays_any_seed_the_flag_takes(tmp_path):
    # ale-py takes 32-bit seeds: --seed 3000000000 was a TypeError several lines long.
    played = monobeast(
        tmp_path, "--mode", "eval", "--random_policy", "--env", "PongNoFrameskip-v4",
        "--xpid", "a", "--num_episodes", "1", "--seed", "3000000000",
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    report = json.loads((tmp_path / "a" / "eval_random.json").read_text())
    assert report["num_episodes"] == 1 and report["policy"] == "random"
    assert "step" not in report  # no checkpoint was played


def test_playing_without_a_run_name_says_to_give_one(tmp_path):
    # It looked for a run named for the time, "torchbeast-20261129-210538", and said to train it.
    for mode in ("test", "eval"):
        played = monobeast(tmp_path, "--mode", mode)
        assert played.returncode == 2
        assert f"--mode {mode} plays a trained run: name it with --xpid" in played.stderr


def test_an_env_that_fails_as_it_is_made_is_one_line_with_its_traceback_above(tmp_path):
    env = ["--env", "tests.envs_for_tests:FailingToStart-v0"]
    for command in ([*TRAIN[2:], *env], ["--mode", "test", "--random_policy", *env, "--xpid", "a"]):
        result = monobeast(tmp_path, *command)
        assert_one_error_line(result, "RuntimeError: no simulator license found")
        assert "raise RuntimeError" in result.stdout


def test_an_eval_json_that_cannot_be_written_is_named_and_leaves_nothing_behind(tmp_path):
    assert monobeast(tmp_path, *TRAIN, "--total_steps", "200", "--xpid", "a").returncode == 0
    (tmp_path / "a" / "eval.json").mkdir()  # it named eval.json.tmp, and left it there
    played = monobeast(tmp_path, "--mode", "eval", "--xpid", "a", "--num_episodes", "3")
    assert_one_error_line(played, f"Is a directory: {tmp_path / 'a' / 'eval.json'}. Check")
    assert not list((tmp_path / "a").glob("*.tmp"))
    assert "Episode 1 ended" not in played.stdout  # said before the games, not after them all


def test_greedy_games_that_are_one_game_are_said_and_sample_actions_varies_them(tmp_path):
    # Riverraid's greedy games were one game: eval.json said "± 0.00" without a word.
    env = ["--env", "tests.envs_for_tests:Walk-v0"]
    assert (
        monobeast(tmp_path, *TRAIN[2:], *env, "--total_steps", "200", "--xpid", "a").returncode == 0
    )
    play = ["--mode", "eval", "--xpid", "a", "--num_episodes", "6", "--seed", "1"]
    greedy = monobeast(tmp_path, *play)
    assert greedy.returncode == 0, greedy.stderr
    assert "The 6 games were one game played 6 times" in greedy.stdout
    assert json.loads((tmp_path / "a" / "eval.json").read_text())["actions"] == "greedy"
    lengths = []
    for _ in range(2):  # --seed repeats the draws
        sampled = monobeast(tmp_path, *play, "--sample_actions")
        assert sampled.returncode == 0, sampled.stderr
        assert "one game played" not in sampled.stdout
        report = json.loads((tmp_path / "a" / "eval.json").read_text())
        assert report["actions"] == "sampled"
        lengths.append([episode["episode_length"] for episode in report["episodes"]])
    assert lengths[0] == lengths[1] and len(set(lengths[0])) > 1
    trained = monobeast(tmp_path, *TRAIN[2:], *env, "--xpid", "b", "--sample_actions")
    assert trained.returncode == 2 and "training always samples" in trained.stderr
    random = monobeast(tmp_path, *play, "--sample_actions", "--random_policy")
    assert random.returncode == 2 and "--random_policy plays none" in random.stderr


def test_games_alike_in_their_figures_are_one_game_only_if_their_actions_were_alike():
    from torchbeast.evaluation import Episode, one_game

    # A solved CartPole scores 500 in every game, from other starts: it was told that its
    # env and policy were deterministic.
    solved = [Episode(500.0, {}, 500, actions=digest) for digest in ("a1", "b2")]
    assert not one_game(solved)
    assert one_game([Episode(500.0, {}, 500, actions="a1")] * 3)
    assert not one_game([Episode(500.0, {}, 500, actions="a1")])  # one game is no repeat
    assert not one_game([Episode(1.0, {}, 9, actions="a1"), Episode(2.0, {}, 9, actions="a1")])


def test_test_and_eval_play_the_trained_model_and_precision_and_refuse_a_switch_said_off(
    tmp_path,
):
    import pytest
    import torch

    from torchbeast import evaluation
    from torchbeast.cli import parse_command
    from torchbeast.config.flags import make_parser
    from torchbeast.core.checkpoint import CheckpointError
    from torchbeast.envs import env_spec

    trained_with = ["--use_lstm", "--precision", "bf16", "--total_steps", "200", "--xpid", "a"]
    assert monobeast(tmp_path, *TRAIN, *trained_with).returncode == 0

    def played(*argv: str):
        argv = ["--mode", "eval", "--savedir", str(tmp_path), "--xpid", "a", *argv]
        settings = parse_command(make_parser(), argv, "mono")
        trained = evaluation.load_trained(settings)
        return evaluation.policy(settings, trained, env_spec(trained.env))

    model = played()  # it was played in fp32 (the default, auto, on CartPole)
    assert model.use_lstm and model.compute_dtype == torch.bfloat16
    assert played("--precision", "fp32").compute_dtype == torch.float32  # given: it wins
    # --no_use_lstm played the LSTM without a word, as if it were not said.
    with pytest.raises(CheckpointError, match="use_lstm"):
        played("--no_use_lstm")
    assert played("--no_use_resnet").use_lstm  # true of it: its own torso, an MLP


def test_where_training_runs_given_to_test_or_eval_is_said_to_be_unused(tmp_path):
    # `raybeast --mode eval --ray_address HEAD` played here without a word.
    assert monobeast(tmp_path, *TRAIN, "--total_steps", "200", "--xpid", "a").returncode == 0
    play = ["--savedir", str(tmp_path), "--xpid", "a", "--num_episodes", "1"]
    for module, given in (
        ("torchbeast.raybeast", ["--ray_address", "127.0.0.1:1"]),
        ("torchbeast.polybeast_learner", ["--env_servers", "unix:/nowhere"]),
    ):
        command = [sys.executable, "-m", module, "--mode", "eval", *play, *given]
        played = warm_start.run(command, timeout=120)
        assert played.returncode == 0, played.stderr
        names = " ".join(word for word in given if word.startswith("--"))
        assert f"{names}: --mode eval plays on this machine, with an env of its own" in (
            played.stdout
        )
    quiet = warm_start.run(
        [sys.executable, "-m", "torchbeast.monobeast", "--mode", "eval", *play], timeout=120
    )
    assert "plays on this machine" not in quiet.stdout + quiet.stderr

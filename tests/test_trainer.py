"""The Trainer that every runtime shares, driven in this process by a pool that unrolls
real CartPole environments with the actors' code (no actor processes, no sockets)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from tests.test_checkpoint import zero_bytes_inside_a_tensor
from tests.test_monobeast import read_rows
from torchbeast.config.flags import parse_flags, parse_flags_and_sources
from torchbeast.config.parsers import make_ray_parser
from torchbeast.config.settings import Settings, build_settings
from torchbeast.core import rollout
from torchbeast.envs import env_spec
from torchbeast.runtime.acting import Unroller
from torchbeast.runtime.checkpointing import INCARNATIONS_PER_START
from torchbeast.runtime.pool import Pool
from torchbeast.runtime.training import Trainer, TrainingError

SMALL = ["--env", "CartPole-v1", "--num_actors", "1", "--envs_per_actor", "4"]
SMALL += ["--batch_size", "4", "--unroll_length", "10", "--seed", "1", "--num_learner_threads", "1"]


class InProcessPool(Pool):
    """One actor's Unroller, stepped by the learner thread that asks for a batch."""

    def __init__(self, trainer: Trainer, fail_after: int | None = None):
        super().__init__()
        settings = trainer.settings
        seed = settings.env.seed
        self.unroller = Unroller(settings, trainer.env_spec, trainer.config, seed=seed)
        batch_size = settings.learner.batch_size
        self.buffers = rollout.allocate(
            trainer.env_spec, settings.learner.unroll_length, batch_size
        )
        self.core_states = tuple(
            torch.zeros(batch_size, *state.shape[::2])
            for state in self.unroller.model.initial_state(1)
        )
        self.lock = threading.Lock()
        self.batches = 0
        self.fail_after = fail_after
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True
        self.unroller.close()

    def get_batch(self):
        with self.lock:
            if self.stopping.is_set():
                return None
            if self.fail_after is not None and self.batches == self.fail_after:
                self.error = "actor 0 failed: the environment broke"
                self.stopping.set()
                return None
            self.batches += 1
            self.unroller.unroll(self.buffers, torch.arange(4), self.core_states)
            batch = {key: value.transpose(0, 1).clone() for key, value in self.buffers.items()}
            core_state = tuple(s.transpose(0, 1).clone() for s in self.core_states)
            return batch, core_state, [(0, env) for env in range(4)]


class InProcessTrainer(Trainer):
    def __init__(self, settings: Settings, fail_after: int | None = None):
        super().__init__(settings, env_spec(settings.env))
        self.fail_after = fail_after
        self.published: list[int] = []

    def create_pool(self) -> InProcessPool:
        self.pool_made = InProcessPool(self, self.fail_after)
        self.publish(self.learner.model)
        return self.pool_made

    def publish(self, model: nn.Module) -> None:
        self.published.append(int(model.policy_version))
        if hasattr(self, "pool_made"):
            self.pool_made.unroller.model.load_state_dict(model.state_dict())


def make_flags(tmp_path, *argv: str) -> Settings:
    flags = parse_flags([*SMALL, "--savedir", str(tmp_path), "--xpid", "run", *argv])
    return build_settings(flags, "mono")


def logged_steps(tmp_path) -> list[int]:
    """The step column of logs.csv (its third), across the headers of resumed runs."""
    with open(tmp_path / "run" / "logs.csv") as f:
        return [int(line.split(",")[2]) for line in f if not line.startswith("#")]


def test_trains_to_total_steps_logging_every_update_and_saving_a_checkpoint(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "800"))
    stats = trainer.train()
    assert trainer.learner.step == 800  # 20 updates of 4 x 10 steps
    assert stats["step"] == 800
    assert logged_steps(tmp_path) == list(range(40, 801, 40))
    # Every update's weights reached the pool, with their version.
    assert trainer.published == list(range(0, 21))
    assert trainer.pool_made.started and trainer.pool_made.stopped
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["step"] == 800 and state["updates"] == 20


def test_a_second_run_resumes_from_the_checkpoint(tmp_path):
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "400")).train()
    resumed = InProcessTrainer(make_flags(tmp_path, "--total_steps", "800"))
    resumed.train()
    assert resumed.learner.step == 800
    assert resumed.pool_made.batches == 10  # only the steps that were left
    assert logged_steps(tmp_path) == list(range(40, 801, 40))


def test_a_resumed_run_learns_with_the_flags_it_is_given_and_says_which_changed(tmp_path):
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "400")).train()
    given = ("--total_steps", "800", "--learning_rate", "0.01", "--rmsprop_init", "0")
    InProcessTrainer(make_flags(tmp_path, *given)).train()
    rows = read_rows(tmp_path / "run" / "logs.csv")
    resumed = [row for row in rows if float(row["step"]) > 400]
    # The schedule goes on from step 400 of 800 at the new rate: 0.01 x (1 - 440/800)
    # after the first update, where the checkpoint's rate would give 0.0007 x that.
    assert float(resumed[0]["learning_rate"]) == pytest.approx(0.01 * (1 - 440 / 800))
    lines = (tmp_path / "run" / "out.log").read_text().splitlines()
    (line,) = [line for line in lines if "settings other than the checkpoint's" in line]
    assert "--total_steps 800 (was 400), --learning_rate 0.01 (was 0.0007): this run uses" in line
    assert "--rmsprop_init 0.0 (was 1.0): only a new run starts from them, no effect" in line


def test_a_start_only_flag_given_on_a_resume_is_not_recorded_as_the_runs(tmp_path):
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "400")).train()
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "800", "--rmsprop_init", "0")).train()
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["flags"]["rmsprop_init"] == 1.0  # what the run's optimizer started from
    third = InProcessTrainer(make_flags(tmp_path, "--total_steps", "1200"))
    assert third.checkpoint.resume_if_possible()
    assert third.checkpoint.changes == (
        "Resumed with settings other than the checkpoint's: --total_steps 1200 (was 800): "
        "this run uses them."
    )


@pytest.mark.parametrize("runtime", ["mono", "ray"])
def test_num_buffers_given_where_the_runtime_keeps_none_is_said_to_do_nothing(tmp_path, runtime):
    argv = [*SMALL, "--savedir", str(tmp_path), "--xpid", "run", "--total_steps", "40"]
    parser = make_ray_parser() if runtime == "ray" else None
    flags, sources = parse_flags_and_sources([*argv, "--num_buffers", "8"], parser)
    InProcessTrainer(build_settings(flags, runtime, sources)).train()
    said = "--num_buffers does nothing here: only MonoBeast keeps rollouts in shared-memory"
    assert (said in (tmp_path / "run" / "out.log").read_text()) == (runtime == "ray")


def test_what_a_run_whose_weights_broke_says_of_its_checkpoint_is_true(tmp_path):
    # "The checkpoint keeps the last good weights" was said where none had been written,
    # and the warning read "(no checkpoint could be written stays)".
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "400"))
    assert trainer.checkpoint.good_one() == "no checkpoint was written before the weights broke"
    trainer.train()
    assert trainer.checkpoint.good_one() == (
        f"the checkpoint {tmp_path / 'run' / 'model.tar'} holds step 400, its last good weights"
    )


def test_a_resumed_run_with_another_batch_size_goes_on_with_the_rate_of_its_steps(tmp_path):
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "400")).train()  # 4 x 10 steps
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "800", "--batch_size", "8")).train()
    rows = read_rows(tmp_path / "run" / "logs.csv")
    first = next(row for row in rows if float(row["step"]) > 400)
    assert float(first["step"]) == 480  # one update of 8 x 10 steps after step 400
    assert float(first["learning_rate"]) == pytest.approx(0.0007 * (1 - 480 / 800))


def test_a_fresh_run_sets_an_earlier_runs_files_aside_instead_of_appending(tmp_path, caplog):
    first = make_flags(tmp_path, "--total_steps", "400", "--disable_checkpoint")
    InProcessTrainer(first).train()
    (tmp_path / "run" / "eval.json").write_text("{}")
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "200", "--disable_checkpoint")).train()
    # This run's logs hold only its own rows, under one header.
    assert logged_steps(tmp_path) == list(range(40, 201, 40))
    assert (tmp_path / "run" / "logs.csv").read_text().count("#") == 1
    assert not (tmp_path / "run" / "eval.json").exists()
    # The earlier run's files are whole, in one folder the log names.
    (earlier,) = (tmp_path / "run" / "earlier").iterdir()
    with open(earlier / "logs.csv") as f:
        assert [int(line.split(",")[2]) for line in f if line[0] != "#"] == [
            40,
            80,
            120,
            160,
            200,
            240,
            280,
            320,
            360,
            400,
        ]
    assert {"meta.json", "out.log", "fields.csv", "eval.json"} <= {
        p.name for p in earlier.iterdir()
    }
    assert any(p.name.startswith("events.out.tfevents.") for p in earlier.iterdir())
    assert f"moved them to {earlier}" in (tmp_path / "run" / "out.log").read_text()


def test_a_pool_error_stops_the_run_with_its_message_and_keeps_a_checkpoint(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "4000"), fail_after=5)
    with pytest.raises(TrainingError, match="actor 0 failed: the environment broke"):
        trainer.train()
    assert trainer.learner.step == 200
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["step"] == 200


def test_recent_returns_are_those_of_the_episodes_that_ended(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "2000"))
    trainer.train()
    # CartPole under a near-uniform policy: episodes of about 10-40 steps, return = length.
    assert len(trainer.progress.recent_returns) > 20
    assert all(8 <= ret <= 200 for ret in trainer.progress.recent_returns)


def test_a_resumed_run_goes_on_with_the_checkpoints_episode_window(tmp_path):
    first = InProcessTrainer(make_flags(tmp_path, "--total_steps", "2000"))
    first.train()
    window = list(first.progress.recent_returns)
    assert len(window) > 20
    resumed = InProcessTrainer(make_flags(tmp_path, "--total_steps", "4000"))
    assert resumed.checkpoint.resume_if_possible()
    assert list(resumed.progress.recent_returns) == window  # not "last 0 episodes" again
    resumed.train()
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "Not restored from the checkpoint: the episodes in progress" in out_log


def test_an_envs_episode_extras_are_logged_and_printed_by_name(tmp_path):
    flags = make_flags(tmp_path, "--env", "tests.envs_for_tests:Coins-v0", "--total_steps", "400")
    trainer = InProcessTrainer(flags)
    trainer.train()
    with open(tmp_path / "run" / "logs.csv") as f:
        header, *rows = [line.strip().split(",") for line in f]
    column = header.index("mean_episode_coins")  # header[0] is "# _tick"
    ended = [row for row in rows if row[header.index("episodes")] != "0"]
    assert ended and all(float(row[column]) == 20.0 for row in ended)  # 10 steps of 2 coins
    assert trainer.progress.episode_extras_text() == " Coins 20.0."


def test_an_env_without_episode_extras_prints_none(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "400"))
    trainer.train()
    assert trainer.progress.episode_extras_text() == ""


def test_a_resumed_run_draws_what_the_saved_run_would_have_drawn_next(tmp_path):
    # The learner process's generator decides which rollouts LASER replays.
    InProcessTrainer(make_flags(tmp_path, "--total_steps", "400")).train()  # the last save
    expected = torch.rand(5)
    torch.manual_seed(12345)  # whatever the process did since
    resumed = InProcessTrainer(make_flags(tmp_path, "--total_steps", "800"))
    assert resumed.checkpoint.resume_if_possible()
    assert torch.equal(torch.rand(5), expected)


def test_each_start_of_a_run_numbers_its_actors_after_every_earlier_one(tmp_path):
    # Actor seeds follow from the incarnation: a resumed run's envs do not replay the
    # first start's episodes.
    first = InProcessTrainer(make_flags(tmp_path, "--total_steps", "400"))
    assert first.checkpoint.first_incarnation() == 0
    first.train()
    second = InProcessTrainer(make_flags(tmp_path, "--total_steps", "800"))
    second.train()
    third = InProcessTrainer(make_flags(tmp_path, "--total_steps", "1200"))
    assert third.checkpoint.resume_if_possible()
    assert third.checkpoint.first_incarnation() == 2 * INCARNATIONS_PER_START


LASER = ["--replay_size", "300", "--learn_start", "100", "--replay_ratio", "1"]


def test_a_resumed_laser_run_goes_on_with_the_saved_replay(tmp_path):
    first = InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "800"))
    first.train()
    saved, saved_core_state = first.replay.contents()
    assert (tmp_path / "run" / "replay.tar").exists()
    resumed = InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "1200"))
    assert resumed.checkpoint.resume_if_possible()
    restored, restored_core_state = resumed.replay.contents()
    assert resumed.replay.transitions == first.replay.transitions > 0
    for key, tensor in saved.items():
        assert torch.equal(restored[key], tensor), key
    resumed.train()  # learns on from it, adding the new run's rollouts
    lines = (tmp_path / "run" / "out.log").read_text().splitlines()
    saved_line = [line for line in lines if "Saved LASER's replay beside it" in line][0]
    restored_line = [line for line in lines if "Restored LASER's replay" in line][0]
    count = first.replay.transitions
    assert f": {count} of its {count} transitions" in saved_line
    assert restored_line.endswith(f"replay.tar: {count} transitions.")


def test_a_laser_run_that_saves_no_replay_says_the_resumed_one_starts_empty(tmp_path):
    InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "400")).train()
    off = ["--replay_checkpoint_gib", "0"]
    InProcessTrainer(make_flags(tmp_path, *LASER, *off, "--total_steps", "800")).train()
    assert not (tmp_path / "run" / "replay.tar").exists()  # the first start's would be stale
    resumed = InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "1200"))
    assert resumed.checkpoint.resume_if_possible()
    assert resumed.replay.transitions == 0
    assert resumed.checkpoint.replay_line == (
        "LASER's replay starts empty (on-policy batches until it holds --learn_start): "
        "no replay.tar beside the checkpoint."
    )


def test_a_laser_run_resumed_with_no_replay_to_save_starts_empty(tmp_path):
    InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "400")).train()
    assert (tmp_path / "run" / "replay.tar").exists()  # the first start's, now stale
    off = ["--replay_checkpoint_gib", "0"]
    resumed = InProcessTrainer(make_flags(tmp_path, *LASER, *off, "--total_steps", "800"))
    assert resumed.checkpoint.resume_if_possible()
    assert resumed.replay.transitions == 0
    assert resumed.checkpoint.replay_line == (
        "LASER's replay starts empty (on-policy batches until it holds --learn_start): "
        "--replay_checkpoint_gib 0."
    )


def test_a_damaged_replay_file_is_said_and_the_run_goes_on_with_an_empty_replay(tmp_path):
    InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "400")).train()
    (tmp_path / "run" / "replay.tar").write_bytes(b"\x1b[2Jnot a replay\n" * 1000)
    resumed = InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "800"))
    resumed.train()
    assert resumed.learner.step == 800
    (line,) = [
        line
        for line in (tmp_path / "run" / "out.log").read_text().splitlines()
        if "LASER's replay starts empty" in line
    ]
    assert "does not fit this run" in line and "\x1b" not in line and len(line) < 600


def test_a_replay_file_with_bytes_zeroed_inside_is_not_restored(tmp_path):
    InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "400")).train()
    zero_bytes_inside_a_tensor(tmp_path / "run" / "replay.tar")
    resumed = InProcessTrainer(make_flags(tmp_path, *LASER, "--total_steps", "800"))
    assert resumed.checkpoint.resume_if_possible()
    assert resumed.replay.transitions == 0
    line = resumed.checkpoint.replay_line
    assert line.startswith("LASER's replay starts empty")
    assert "does not match its checksum" in line


def test_every_logged_row_carries_the_consoles_mean_of_the_last_100_episodes(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "2000"))
    trainer.train()
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert float(rows[-1]["mean_return_last_100"]) == pytest.approx(
        sum(trainer.progress.recent_returns) / len(trainer.progress.recent_returns)
    )


def test_a_run_says_where_its_files_are_at_start_and_sums_itself_up_at_the_end(tmp_path):
    trainer = InProcessTrainer(make_flags(tmp_path, "--total_steps", "4000"))  # 100 episodes
    trainer.train()
    lines = (tmp_path / "run" / "out.log").read_text().splitlines()
    run_dir = tmp_path / "run"
    (start,) = [line for line in lines if "Run folder:" in line]
    assert f"Curves: tensorboard --logdir {run_dir}, or python -m torchbeast.plot {run_dir}" in (
        start
    )
    summary = lines[-1]
    assert "Summary: step 4000 of 4000, 4000 of them in " in summary
    assert f"{trainer.progress.window_text('.1f')}, best " in summary
    assert f"the checkpoint {run_dir / 'model.tar'} holds step 4000" in summary
    assert summary.endswith(f"curve: python -m torchbeast.plot {run_dir}")


def test_a_resume_says_a_reward_proxy_changed_only_where_it_did(tmp_path):
    from torchbeast.config.parsers import make_learner_parser
    from torchbeast.runtime.checkpointing import changes_line

    riverraid = "RiverraidNoFrameskip-v4"

    def settings(*argv: str, runtime: str = "mono") -> Settings:
        parser = make_learner_parser() if runtime == "poly" else None
        flags, sources = parse_flags_and_sources([*argv, "--savedir", str(tmp_path)], parser)
        return build_settings(flags, runtime, sources)

    def flags_of(run: Settings) -> dict:
        return dict(run.run.flags)

    survival = settings("--env", riverraid, "--move_penalty", "0")
    saved = flags_of(survival)
    # The same proxy spelled otherwise: "--fuel_multiplier 1.0 (was None)" before.
    spelled = settings("--env", riverraid, "--fuel_multiplier", "1", "--move_penalty", "0")
    assert changes_line(saved, spelled, riverraid, flags_of(spelled)) is None
    fuel = settings("--env", riverraid, "--fuel_multiplier", "5", "--move_penalty", "0")
    line = changes_line(saved, fuel, riverraid, flags_of(fuel))
    assert "--fuel_multiplier 5.0 (was 1.0): this run uses them" in line
    assert "move_penalty" not in line
    # A PolyBeast learner told no --env: its checkpoint recorded its env servers' proxy,
    # which the streams must have again; it said "--fuel_multiplier None (was 1.0)".
    learner = settings(runtime="poly")
    told = {"fuel_multiplier": 1.0, "move_penalty": 0.0, "no_fire_on_life_loss": False}
    recorded = flags_of(learner) | told
    assert changes_line(recorded, learner, riverraid, recorded) is None

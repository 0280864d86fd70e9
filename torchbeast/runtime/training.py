"""The training loop every runtime shares: learner threads, progress, checkpoints, stop.

A runtime provides a *pool*: it starts actors, hands the learner batches of rollouts
(``get_batch``), and reports a failure that ends the run (``error``): ``runtime.pool``.
With LASER (``--replay_size`` > 0) every online batch also goes into one replay shared by
all actors, and each update learns from B online + B * ``--replay_ratio`` replayed
rollouts (``core.replay``). The Trainer holds its parts, each with its own state: the
learner (``core.learner``), the progress line and its episodes (``runtime.progress``) and
the checkpoint (``runtime.checkpointing``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Hashable, Mapping

import torch
from torch import nn

from torchbeast import envs
from torchbeast.config.flags import DERIVED
from torchbeast.config.layers import DEFAULT
from torchbeast.config.poly import without_secrets
from torchbeast.config.settings import ReplaySettings, Settings
from torchbeast.core import checkpoint, rollout
from torchbeast.core.errors import RunFolderError, UserError
from torchbeast.core.filewriter import FileWriter
from torchbeast.core.learner import Learner, NonFiniteLossError
from torchbeast.core.models import (
    count_parameters,
    create_model,
    model_config,
    parameters_over,
    torso_splits_rows,
)
from torchbeast.core.precision import bf16_on_cpu, compute_dtype, describe
from torchbeast.core.replay import Replay
from torchbeast.core.rollout import rollout_spec
from torchbeast.core.spec import EnvSpec
from torchbeast.core.update_graph import UpdateGraph
from torchbeast.core.weights import model_is_sound
from torchbeast.envs.family import flag_text
from torchbeast.runtime import layout
from torchbeast.runtime.checkpointing import NOT_RESTORED_LINE, RunCheckpoint, read_resumable
from torchbeast.runtime.console import RateLimitedLog, setup_console_logging
from torchbeast.runtime.pool import Pool
from torchbeast.runtime.progress import PROGRESS_INTERVAL_S, Progress, format_duration
from torchbeast.runtime.supervision import FirstSignal, Sigterm, Stopped, sigterm_handled

log = logging.getLogger("torchbeast")


class TrainingError(UserError, RuntimeError):
    """Training cannot go on; the message names the cause."""


# PolyBeast drops a batch whose loss is non-finite (a peer's data must not stop the run);
# where this many in a row fail before any update of the run's start was applied, the
# learner's own settings are the likelier cause (an absurd rate): the run stops, having
# learnt nothing it could lose. Once an update was applied, drops never stop it.
DROPS_BEFORE_LEARNING_LIMIT = 100


class Trainer:
    """Wires learner, actors, logging and checkpoints together for one training run.

    A runtime subclasses it with ``create_pool`` (how rollouts arrive) and ``publish``
    (how new weights reach whoever picks actions).
    """

    def __init__(
        self,
        settings: Settings,
        env_spec: EnvSpec,
        env_options: Mapping[str, object] | None = None,
    ):
        """``env_spec``: the environment the run trains on, as its env id is resolved
        (PolyBeast: the learner's checkpoint or the first env stream may name it);
        ``env_options``: the env family flags its environments said they were made with
        (the env streams of a PolyBeast learner told no --env), recorded with the run."""
        self.settings = settings
        self.run = run = settings.run
        flags = run.recorded_flags(env_spec.env_id)
        family_flags = {name for name, _ in settings.env.options}  # a peer's others: not ours
        told = {k: v for k, v in (env_options or {}).items() if k in family_flags}
        # What meta.json and each checkpoint record: e.g. the reward proxy the learner's
        # env servers computed, which eval compares with its own.
        self.recorded_flags = flags | told
        self.recorded_sources = dict(run.sources) | dict.fromkeys(told, "its environments")
        self.total_steps = settings.learner.total_steps
        self.env_spec = env_spec
        self.config = model_config(settings.model, self.env_spec.observation_shape)
        use_cuda = torch.cuda.is_available() and not run.disable_cuda
        self.device = torch.device("cuda" if use_cuda else "cpu")
        precision, torso = settings.model.precision, self.config["kind"]
        dtype = compute_dtype(precision, self.device, torso)
        # Measured where the update is the only thread running ops (not beside PolyBeast's
        # inference threads).
        split_torso = (
            self.device.type == "cpu"
            and torso_splits_rows(self.config)
            and self.concurrent_ops() == 1
        )
        torso_threads = layout.torso_threads(layout.learner_cores()[0], split_torso)
        # Before any thread of this process runs an op.
        self.threads_line = layout.limit_learner_threads(
            self.concurrent_ops(), bf16_on_cpu(dtype, self.device), torso_threads
        )
        if settings.env.seed is not None:
            torch.manual_seed(settings.env.seed)
        self.precision_lines = [describe(precision, dtype, self.device, torso)]
        if self.device.type != "cpu":  # the actors' copies run on the CPU
            actor_dtype = compute_dtype(precision, "cpu", torso)
            self.precision_lines.append(describe(precision, actor_dtype, "cpu", torso))
        # What this run cannot do is refused before it builds its learner (whose optimizer
        # imports torch's compiler: a second of CPU) or starts a process.
        check_model_fits(self.config, env_spec, settings.actors.num_actors)
        check_rollouts_fit(settings, env_spec)
        if settings.replay.replay_size > 0:
            check_replay_fits(settings.replay, env_spec, settings.learner.unroll_length)
        checkpoint_path = checkpoint.path_in(run.run_dir)
        saved_state = read_resumable(checkpoint_path, settings, env_spec, self.config, self.device)
        self.prepare_children()
        model = create_model(
            self.config,
            self.env_spec.observation_shape,
            self.env_spec.num_actions,
            weight_init=settings.model.weight_init,
            compute_dtype=dtype,
            torso_threads=torso_threads,
        )
        self.learner = Learner(
            settings.learner,
            model.to(self.device),
            on_update=self.publish,
            episode_extras=env_spec.episode_extras,
        )
        self.graph_line = None
        if self.device.type == "cuda":
            if settings.learner.cuda_graphs == "auto":
                self.learner.update_graph = UpdateGraph(self.learner)
            else:
                self.graph_line = "Updates run eagerly, not as CUDA graphs (--cuda_graphs off)."
        self.progress = Progress(run, self.total_steps, env_spec)
        self.replay: Replay | None = None
        if settings.replay.replay_size > 0:
            self.replay = Replay(settings.replay.replay_size, settings.replay.learn_start)
        self.checkpoint = RunCheckpoint(
            settings,
            env_spec,
            self.config,
            self.learner,
            self.progress,
            checkpoint_path,
            self.recorded_flags,
            self.replay,
            saved_state,
        )
        self.stop_requested = threading.Event()
        self.failure: BaseException | None = None  # the first, which the run says
        self.failure_lock = threading.Lock()
        # When the last progress line was printed, and at which step (None before).
        self.last_printed: tuple[float, int] | None = None
        self.monitor_started: tuple[float, int] = (0.0, 0)  # when and where monitoring began
        # Batches dropped (drops_bad_batches) before this start's first applied update.
        self.drops_before_learning: int | None = 0  # None once an update was applied
        self.peer_warnings = RateLimitedLog("batches dropped or learnt from in part")
        # Updates (and logging them, so that logs.csv keeps step order) one at a time.
        self.update_lock = threading.Lock()
        # Wall-clock seconds spent in updates (and logging them), and when the update under
        # way began (None between updates): how busy the learner is. One tuple, replaced
        # whole, so that a reader in another thread never sees half of a change.
        self.updating: tuple[float, float | None] = (0.0, None)
        self.pool: Pool | None = None
        self.batch_order_lock = threading.Lock()

    def prepare_children(self) -> None:
        """Starts, once the run's checks passed, what its children will need, while the
        learner is built (MonoBeast: the server its actors fork from)."""

    def create_pool(self) -> Pool:
        """Starts the actors with the learner's current weights."""
        raise NotImplementedError

    def publish(self, model: nn.Module) -> None:
        """Makes the learner's new weights the ones actions are chosen with."""
        raise NotImplementedError

    def stage_totals(self) -> dict[str, float]:
        """CPU seconds so far outside the learner process, by stage, for the benchmark."""
        return self.pool.stage_totals()

    def concurrent_ops(self) -> int:
        """Threads of the learner process that run ops at the same time: the updates (the
        learner threads take turns)."""
        return 1

    def update_seconds(self) -> float:
        """Wall-clock seconds spent updating so far, the update under way up to now."""
        done, since = self.updating
        return done + (time.perf_counter() - since if since is not None else 0.0)

    def actor_layout(self) -> str:
        """Who steps the environments, in words."""
        actors = self.settings.actors
        return f"{actors.num_actors} actors x {actors.envs_per_actor} envs"

    def learner_thread(self, pool: Pool, writer: FileWriter) -> None:
        try:
            while self.learner.step < self.total_steps and not self.stop_requested.is_set():
                # In the order batches leave the pool, so that the replay sees each env
                # stream's rollouts in order and stores their shared steps once.
                with self.batch_order_lock:
                    got = pool.get_batch()
                    if got is None:
                        return
                    batch, core_state, sources = got
                    if self.replay is not None:
                        self.replay.add(batch, core_state, sources)
                episode_returns, episode_extras = rollout.ended_episodes(
                    batch, self.env_spec.extra_keys
                )
                num_online = batch["reward"].shape[1]
                if self.replay is not None:
                    ratio = self.settings.replay.replay_ratio
                    batch, core_state = self.replay.mix_into(batch, core_state, ratio)
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                core_state = tuple(s.to(self.device) for s in core_state)
                # Updates are serialised anyway; logging inside keeps logs.csv in step order.
                with self.update_lock:
                    started = time.perf_counter()
                    self.updating = (self.updating[0], started)
                    try:
                        stats = self.learner.learn(batch, core_state, num_online)
                    except NonFiniteLossError as error:
                        if not pool.drops_bad_batches:
                            # The replay saved as the run stops must not hold them: the
                            # resumed run would draw them again.
                            self.forget_culprits(batch, core_state, sources)
                            raise
                        batch, stats = self.learn_without_culprits(
                            pool, batch, core_state, sources, num_online, error
                        )
                        if stats is not None:  # the episodes of the rollouts kept
                            online = {key: value[:, :num_online] for key, value in batch.items()}
                            extra_keys = self.env_spec.extra_keys
                            episode_returns, episode_extras = rollout.ended_episodes(
                                online, extra_keys
                            )
                    finally:
                        self.updating = (self.updating[0] + time.perf_counter() - started, None)
                    if stats is not None:
                        self.drops_before_learning = None
                        self.progress.record(stats, episode_returns, episode_extras)
                        writer.log(stats | self.progress.figures())
            # Done: the other learner threads may be waiting for rollouts that never come.
            self.stop_requested.set()
        except BaseException as error:  # surfaced by the main thread, not swallowed
            self.record_failure(error)

    def learn_without_culprits(
        self,
        pool: Pool,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        sources: list[Hashable],
        num_online: int,
        error: NonFiniteLossError,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float] | None]:
        """A batch from network peers that makes the loss non-finite: the streams whose
        rollouts do so on their own are closed, and the update learns from the others (the
        culprits' columns emptied); the batch learnt from and the update's stats, or None
        where it is dropped (no culprit found, or none but culprits). One peer can neither
        stop the run nor hold back what the others send. (With the user's own
        environments, MonoBeast and RayBeast, it stops the run.)"""
        columns = self.forget_culprits(batch, core_state, sources)
        culprits = [sources[column] for column in columns]
        closed = pool.close_streams(
            {source[0] for source in culprits}, "its rollouts made the loss non-finite"
        )
        if culprits and len(culprits) < len(sources):
            kept = rollout.without_columns(batch, columns)
            kept_state = rollout.without_state_columns(core_state, columns)
            try:
                stats = self.learner.learn(kept, kept_state, num_online)
            except NonFiniteLossError as again:  # the others too: dropped
                error = again
            else:
                self.peer_warnings.warning(
                    "Learnt from a batch without the rollouts of %s: they made its loss "
                    "non-finite.%s",
                    pool.describe_sources(culprits),
                    f" Closed the streams of {', '.join(closed)}." if closed else "",
                )
                return kept, stats
        self.peer_warnings.warning(
            "Dropped a batch: %s. It came from %s.%s",
            error,
            pool.describe_sources(culprits or sources),
            f" Closed the streams of {', '.join(closed)}." if closed else "",
        )
        if self.drops_before_learning is not None and not culprits:
            # No rollout broke it on its own: the learner's settings are the likelier cause.
            self.drops_before_learning += 1
            if self.drops_before_learning >= DROPS_BEFORE_LEARNING_LIMIT:
                raise NonFiniteLossError(
                    f"none of the first {DROPS_BEFORE_LEARNING_LIMIT} batches could be "
                    f"learnt from: each made the loss non-finite (the last: {error}). Lower "
                    "--learning_rate (or the costs), or check the environments"
                ) from error
        if not model_is_sound(self.learner.model, self.env_spec):  # no batch can be learnt from
            raise NonFiniteLossError(
                f"the model's weights or outputs became non-finite before step "
                f"{self.learner.step} (an update too large); every batch now makes the loss "
                "non-finite. Lower "
                "--learning_rate, and start again from a checkpoint saved before (or anew)"
            ) from error
        return batch, None

    def forget_culprits(
        self, batch: dict[str, torch.Tensor], core_state: tuple[torch.Tensor, ...], sources: list
    ) -> list[int]:
        """The online columns that make the loss non-finite on their own (a failed
        update's); LASER's replay forgets what it stored of their sources."""
        columns = self.learner.nonfinite_columns(batch, core_state, len(sources))
        if columns and self.replay is not None:
            self.replay.forget({sources[column] for column in columns})
        return columns

    def train(self) -> dict:
        run = self.run
        env_id = self.env_spec.env_id
        resumed = self.checkpoint.resume_if_possible()  # before any run file
        setup_console_logging()
        writer = FileWriter(
            run.savedir,
            run.xpid,
            self.recorded_flags,
            sources=self.recorded_sources,
            resumed_step=self.learner.step if resumed else None,
            command=without_secrets(sys.argv),
        )
        if resumed:
            log.info("Resuming from %s (%s).", self.checkpoint.path, self.checkpoint.summary())
            if self.checkpoint.changes:
                log.warning("%s", self.checkpoint.changes)
            if self.checkpoint.replay_line:
                log.info("%s", self.checkpoint.replay_line)
            log.info("%s", NOT_RESTORED_LINE)
        log.info(
            "Training %s on %s: %s model, %d parameters, learner on %s.",
            run.xpid,
            env_id,
            self.config["kind"],
            count_parameters(self.learner.model),
            self.device,
        )
        log.info(
            "Run folder: %s (logs.csv, out.log, model.tar). Curves: tensorboard --logdir %s, "
            "or python -m torchbeast.plot %s",
            run.run_dir,
            run.run_dir,
            run.run_dir,
        )
        source = self.settings.actors.layout_source
        log.info("Layout: %s%s.", self.actor_layout(), f" ({source})" if source else "")
        learner = self.settings.learner
        if dict(run.sources).get("batch_size") == "derived":
            log.info(
                "Learner batch: %d rollouts, learning rate %g, grown with the envs "
                "(--batch_size and --learning_rate set your own).",
                learner.batch_size,
                learner.learning_rate,
            )
        log.info("%s", self.threads_line)
        for line in self.precision_lines:
            log.info("%s", line)
        if self.graph_line:
            log.info("%s", self.graph_line)
        seed, drawn = self.settings.env.seed, dict(run.sources).get("seed") == "derived"
        if seed is not None:
            log.info("Seed: %d%s.", seed, f" (drawn; --seed {seed} repeats it)" if drawn else "")
        for preset, values in run.presets_applied().items():
            given = " ".join(flag_text(name, value) for name, value in values.items())
            log.info("Settings from the %s: %s (--no_presets leaves them out).", preset, given)
        if self.settings.env.env is None:  # a PolyBeast learner its first environment told
            self.log_presets_not_applied(env_id)
        # The env id as resolved (a PolyBeast learner may learn it from its first stream).
        env = dataclasses.replace(self.settings.env, env=env_id)
        envs.log_training_reward(env, self.settings.learner.reward_clipping)
        self.log_replay_flags_unused()
        self.log_num_buffers_unused()
        per_update = learner.batch_size * learner.unroll_length
        if per_update > self.total_steps > self.learner.step:
            log.warning(  # e.g. a mistyped --batch_size: its first batch may take hours
                "One update learns from --batch_size %d x --unroll_length %d = %d steps, "
                "more than --total_steps %d: the run ends after one update per learner thread.",
                learner.batch_size,
                learner.unroll_length,
                per_update,
                self.total_steps,
            )
        if self.learner.step >= self.total_steps:
            log.info(
                "Already trained to %d steps (--total_steps %d).",
                self.learner.step,
                self.total_steps,
            )
            writer.close()
            return self.progress.last_stats

        with sigterm_handled(self.request_stop) as sigterm:
            stop_signal = self.train_with_pool(writer, sigterm)
        pool = self.pool
        if pool.error is not None:
            raise TrainingError(pool.error)
        if isinstance(self.failure, NonFiniteLossError):
            raise TrainingError(f"stopped: {self.failure}; {self.checkpoint.good_one()}")
        if isinstance(self.failure, RunFolderError):
            raise TrainingError(
                f"{self.failure}: stopped at step {self.learner.step}; "
                f"{self.checkpoint.on_disk()}. Free space (or fix the folder) and "
                f"{self.how_to_go_on()}."
            )
        if self.failure is not None:
            raise self.failure
        if stop_signal is not None and self.learner.step < self.total_steps:
            name = signal.Signals(stop_signal).name
            raise Stopped(
                stop_signal,
                f"stopped by {name} at step {self.learner.step}; {self.checkpoint.on_disk()}: "
                f"{self.how_to_go_on()}",
            )
        return self.progress.last_stats

    def how_to_go_on(self) -> str:
        """The command that resumes this run: the same one, or where its name was drawn
        from the time (no --xpid given), one that names it. Without a checkpoint
        (--disable_checkpoint) the same command starts anew."""
        if self.checkpoint.saved_step is None:
            return "run the same command to start again"
        if dict(self.settings.run.sources).get("xpid", DEFAULT) in (DEFAULT, DERIVED):
            xpid = self.settings.run.xpid  # the same command would draw another name
            return f"run it again with --xpid {xpid} (or --xpid latest) to resume"
        return "run the same command to resume"

    def log_presets_not_applied(self, env_id: str) -> None:
        """Says which of ``env_id``'s presets the run goes without: presets apply as flags
        are parsed, and this learner learnt its env from its first environment since."""
        flags, sources = self.recorded_flags, self.recorded_sources  # its envs' options too
        if flags.get("no_presets"):
            return
        missed = {
            name: value
            for preset in envs.family_of(env_id).presets(env_id, flags)
            for name, value in preset.flags.items()
            if name in flags and sources.get(name, DEFAULT) == DEFAULT and flags[name] != value
        }
        if missed:
            log.warning(
                "%s's presets did not apply (%s): the learner was not told --env. Give it "
                "--env %s to take them, or those flags.",
                env_id,
                " ".join(flag_text(name, value) for name, value in missed.items()),
                env_id,
            )

    def log_replay_flags_unused(self) -> None:
        """Says where LASER's flags are given but its replay is off (--replay_size 0): the
        run would otherwise be plain IMPALA without a word. (Not refused: a grid of runs
        may give them to every run, --replay_size 0 among its values.)"""
        if self.replay is not None:
            return
        sources, replay = dict(self.settings.run.sources), self.settings.replay
        given = [
            flag_text(name, getattr(replay, name))
            for name in ("replay_ratio", "learn_start", "replay_checkpoint_gib")
            if sources.get(name, DEFAULT) != DEFAULT
        ]
        if given:
            log.warning(
                "%s: LASER's replay is off (--replay_size 0), so %s nothing; give "
                "--replay_size N (transitions) to turn it on.",
                " ".join(given),
                "it does" if len(given) == 1 else "they do",
            )

    def log_num_buffers_unused(self) -> None:
        """Says where --num_buffers was given to a runtime that keeps no shared-memory
        buffers (its resolver dropped it: ``config.resolvers.drop_num_buffers``)."""
        sources = dict(self.settings.run.sources)
        if self.settings.actors.num_buffers is None and sources.get("num_buffers") == DERIVED:
            log.warning(
                "--num_buffers does nothing here: only MonoBeast keeps rollouts in "
                "shared-memory buffers; leave it out."
            )

    def summary(self, seconds: float, first_step: int) -> str:
        """The run's last line: where it got, how fast, how well, and where it is."""
        step, run_dir = self.learner.step, self.run.run_dir
        window = self.progress.window_text(".1f")
        return (
            f"Summary: step {step} of {self.total_steps}, {step - first_step} of them in "
            f"{format_duration(seconds)} this start; {window}{self.progress.best_text()}; "
            f"{self.checkpoint.on_disk()}; curve: python -m torchbeast.plot {run_dir}"
        )

    def request_stop(self) -> None:
        """Stops the run at the next safe point: the learner threads and the actors."""
        self.stop_requested.set()
        if self.pool is not None:
            self.pool.stopping.set()

    def train_with_pool(self, writer: FileWriter, sigterm: Sigterm) -> int | None:
        """Starts the actors, learns until the end or a stop, then saves the checkpoint,
        stops the actors and closes the files whatever happened; returns the signal that
        stopped the run (SIGTERM or Ctrl-C's SIGINT), None for none."""
        started, first_step = time.monotonic(), self.learner.step
        try:
            pool = self.pool = self.create_pool()
        except BaseException:  # refused as it starts (RayBeast's CPUs): the files say so
            writer.close(successful=False)
            raise
        if sigterm.received:  # while the pool was made
            self.request_stop()
        # Ctrl-C while it trains: the first stops the run as SIGTERM does, the others
        # change nothing (raised as KeyboardInterrupt, a burst of them broke the stop
        # itself, and the run ended without its checkpoint).
        interrupt = FirstSignal(self.request_stop)
        previous_interrupt = signal.signal(signal.SIGINT, interrupt)
        threads: list[threading.Thread] = []
        try:
            pool.start()
            threads = [
                threading.Thread(target=self.learner_thread, args=(pool, writer), name=f"learn-{i}")
                for i in range(self.run.num_learner_threads)
            ]
            for thread in threads:
                thread.start()
            self.monitor(pool, threads)
        finally:
            if interrupt.received:
                log.info("Interrupted: saving a checkpoint and stopping the actors.")
            self.request_stop()
            for thread in threads:
                thread.join()
            self.print_last_progress()
            try:
                self.save_checkpoint()
            finally:  # the actors stop and the files close whatever became of the checkpoint
                pool.stop()
                successful = (
                    self.learner.step >= self.total_steps
                    and self.failure is None
                    and pool.error is None
                )
                if successful:
                    log.info("Learning finished after %d steps.", self.learner.step)
                elif self.failure is None and pool.error is None:
                    log.info("Stopped at step %d.", self.learner.step)
                log.info("%s", self.summary(time.monotonic() - started, first_step))
                writer.close(successful)
                if not interrupt.received:  # else it stays, until the command has said so
                    signal.signal(signal.SIGINT, previous_interrupt)
        if interrupt.received:
            return signal.SIGINT
        return signal.SIGTERM if sigterm.received else None

    def monitor(self, pool: Pool, threads: list[threading.Thread]) -> None:
        """Prints progress, checkpoints on time, and returns when training should end."""
        last_checkpoint = time.monotonic()
        self.last_printed = self.monitor_started = (time.monotonic(), self.learner.step)
        while any(t.is_alive() for t in threads) and not self.stop_requested.is_set():
            if pool.error is not None or pool.stopping.is_set():
                return
            time.sleep(min(PROGRESS_INTERVAL_S, 0.2))
            now = time.monotonic()
            if now - self.last_printed[0] >= PROGRESS_INTERVAL_S:
                self.print_progress()
            if now - last_checkpoint >= self.run.checkpoint_interval:
                if not self.save_checkpoint():
                    return
                last_checkpoint = now

    def print_progress(self) -> None:
        """The progress line, with the speed since the last one (since the start of
        monitoring where that was under a second ago: one update in 14 ms said 1436 SPS
        after a line that said 100)."""
        now, step = time.monotonic(), self.learner.step
        last_time, last_step = self.last_printed
        if now - last_time < 1.0:
            last_time, last_step = self.monitor_started
        self.progress.print(step, (step - last_step) / max(now - last_time, 1e-9))
        self.last_printed = (now, step)

    def print_last_progress(self) -> None:
        """As the run ends, once its learner threads are done, the line for the steps
        since the last one: a run shorter than the interval, or its last seconds, still
        shows where it got (also under --suppress_logs)."""
        if self.last_printed is not None and self.learner.step > self.last_printed[1]:
            self.print_progress()

    def save_checkpoint(self) -> bool:
        """Saves the checkpoint; where the folder cannot take it (a full disk), the run
        stops (the first failure is the one said) and the previous checkpoint stays whole.
        A run that cannot checkpoint would lose at its end all it learnt since: stopping
        costs at most the time to free space and run the same command again."""
        try:
            self.checkpoint.save()
            return True
        except RunFolderError as error:
            self.record_failure(error)
            return False

    def record_failure(self, error: BaseException) -> None:
        """Stops the run for ``error``; where several threads fail, the first is said."""
        with self.failure_lock:
            if self.failure is None:
                self.failure = error
        self.stop_requested.set()


def step_bytes(env_spec: EnvSpec, unroll_length: int) -> int:
    """The bytes one step of a rollout takes (its frame, reward, logits, ...)."""
    return sum(
        torch.Size(shape[1:]).numel() * dtype.itemsize
        for shape, dtype in rollout_spec(env_spec, unroll_length).values()
    )


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# Copies of the model's parameters the learner holds (weights, gradients, the optimizer's
# state, the copy a multi-pass update keeps to undo a failed pass), besides one per actor.
LEARNER_MODEL_COPIES = 6


def check_model_fits(config: dict, env_spec: EnvSpec, num_actors: int) -> None:
    """Refuses, before any is built, a model whose copies could never fit in this
    machine's memory (e.g. a mistyped --hidden_size: an allocation's traceback, or the
    machine swapping)."""
    copies, memory = LEARNER_MODEL_COPIES + num_actors, machine_memory()
    limit = int(0.8 * memory / (4 * copies))  # fp32 parameters
    parameters = parameters_over(config, env_spec.observation_shape, env_spec.num_actions, limit)
    if parameters is None:
        return
    raise TrainingError(
        f"the {config['kind']} model (--hidden_size {config['hidden_size']}, --num_layers "
        f"{config['num_layers']}) has {parameters:,} parameters: its copies in the learner and "
        f"{num_actors} actors need about {parameters * 4 * copies / 2**30:.1f} GiB, but this "
        f"machine has {memory / 2**30:.1f} GiB: give a smaller --hidden_size (or --num_layers)"
    )


def check_rollouts_fit(settings: Settings, env_spec: EnvSpec) -> None:
    """Refuses, before training, rollouts that could never fit in this machine's memory
    at once: MonoBeast's --num_buffers of them, elsewhere two batches' (the one learnt
    from and the next); else the run would be killed for memory with no word."""
    unroll_length, batch_size = settings.learner.unroll_length, settings.learner.batch_size
    buffers = settings.actors.num_buffers
    held = buffers or 2 * batch_size
    per_rollout = (unroll_length + 1) * step_bytes(env_spec, unroll_length)
    memory = machine_memory()
    if held * per_rollout <= 0.8 * memory:
        return
    fits = int(0.8 * memory / per_rollout)
    derived = dict(settings.run.sources).get("num_buffers") == DERIVED
    actors, envs_per_actor = settings.actors.num_actors, settings.actors.envs_per_actor
    if buffers is None:
        why = f"two batches of --batch_size {batch_size}"
    elif derived:
        why = (
            f"--num_buffers, derived from --num_actors {actors}, --envs_per_actor "
            f"{envs_per_actor} and --batch_size {batch_size}"
        )
    else:
        why = f"--num_buffers {buffers}"
    if fits < 2:  # not a batch of one: the rollouts are too long
        fix = "a shorter --unroll_length"
    elif fits < 2 * batch_size:  # not even the batches
        also = "" if buffers is None or derived else " and --num_buffers"
        fix = f"a shorter --unroll_length, or --batch_size {fits // 2}{also} or less"
    elif buffers is None:
        fix = f"--batch_size {fits // 2} or less, or a shorter --unroll_length"
    elif derived:
        fix = f"at most {fits // 2} envs in all (--num_actors x --envs_per_actor)"
    else:
        fix = f"--num_buffers {fits} or less"
    raise TrainingError(
        f"{held} rollouts of --unroll_length {unroll_length} ({why}) need about "
        f"{held * per_rollout / 2**30:.1f} GiB but this machine has {memory / 2**30:.1f} GiB: "
        f"give {fix}"
    )


def check_replay_fits(replay: ReplaySettings, env_spec: EnvSpec, unroll_length: int) -> None:
    """Refuses a replay that could never hold a rollout, or never fit in this machine's
    memory, before training."""
    if replay.replay_size < unroll_length:
        raise TrainingError(
            f"--replay_size {replay.replay_size} counts transitions (steps), fewer than one "
            f"rollout of --unroll_length {unroll_length}: it would never hold one; give at "
            f"least {unroll_length} (thousands of rollouts are usual, e.g. 100000)"
        )
    per_step = step_bytes(env_spec, unroll_length)
    needed = replay.replay_size * per_step
    memory = machine_memory()
    if needed > 0.8 * memory:
        affordable = int(0.8 * memory / per_step)
        raise TrainingError(
            f"--replay_size {replay.replay_size} needs about {needed / 2**30:.1f} GiB "
            f"({per_step} bytes per transition of {env_spec.env_id}) but this machine has "
            f"{memory / 2**30:.1f} GiB: use --replay_size {affordable} or less"
        )

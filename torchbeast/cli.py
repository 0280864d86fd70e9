"""What every entry point does after building its parser: parse, dispatch, report errors."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

import gymnasium as gym

from torchbeast import entry, video
from torchbeast.config.flags import parse_flags_and_sources
from torchbeast.config.layers import COMMAND_LINE
from torchbeast.config.settings import Settings, build_settings
from torchbeast.core.errors import UserError, os_error_line
from torchbeast.runtime.console import setup_console_logging
from torchbeast.runtime.registry import RUNTIMES
from torchbeast.runtime.supervision import RunBusy, Stopped, run_folder_held, sigterm_handled

log = logging.getLogger("torchbeast")

# gym's DependencyNotInstalled: e.g. --mode test_render of CartPole without pygame.
USER_ERRORS = (UserError, RunBusy, gym.error.DependencyNotInstalled)


def report_errors(body: Callable[[], object]) -> int:
    """Runs ``body``; an error the user can fix is one line on stderr and exit code 1."""
    try:
        # Here, not above: --help and a mistyped flag answer without it (~1 s); and inside,
        # since a signal may come while it loads.
        import torch

        entry.work_begins()  # a Ctrl-C from here on unwinds the body (KeyboardInterrupt)
        try:
            body()
        except torch.OutOfMemoryError:
            print(
                "error: out of GPU memory: lower --batch_size or --unroll_length, "
                "or train on the CPU with --disable_cuda",
                file=sys.stderr,
            )
            return 1
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # e.g. an unwritable --savedir, or a full disk
        print(f"error: {os_error_line(error)}", file=sys.stderr)
        return 1
    except Stopped as stopped:  # by a signal, before the run's end
        print(stopped.message, file=sys.stderr)
        return stopped.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def has_display() -> bool:
    """Whether a window can open here (X11 or Wayland)."""
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


# Where training runs or gets its envs other than here: test and eval do not use them.
PLACES_OF_TRAINING = ("ray_address", "env_servers", "serve", "connect")


def run(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    runtime: str,
    train: Callable[[Settings], object] | None = None,
) -> int:
    """Runs the mode the flags ask for: training in the entry point's ``runtime`` (its
    registered ``train`` unless another is given), or test and eval, which play on this
    machine whatever the runtime."""
    settings = parse_command(parser, argv, runtime)
    mode = settings.run.mode
    if mode == "train":
        train = train or RUNTIMES[runtime].train
        # Before the runtime starts: its first lines (listening, connecting) obey it too.
        setup_console_logging(settings.run.suppress_logs)
        run = settings.run

        def train_alone() -> object:
            with run_folder_held(run.run_dir, run.xpid):
                return train(settings)

        with sigterm_handled():  # a scheduler's SIGTERM while the run starts unwinds it
            return report_errors(train_alone)
    from torchbeast import evaluation  # imports torch, which the modes above do not need

    setup_console_logging(settings.run.suppress_logs)
    sources = dict(settings.run.sources)
    if elsewhere := [
        f"--{name}" for name in PLACES_OF_TRAINING if sources.get(name) == COMMAND_LINE
    ]:
        log.warning(
            "%s: --mode %s plays on this machine, with an env of its own; %s not used.",
            " ".join(elsewhere),
            mode,
            "it is" if len(elsewhere) == 1 else "they are",
        )
    if mode == "eval":
        return report_errors(lambda: evaluation.evaluate(settings))
    return report_errors(lambda: evaluation.test(settings, render=mode == "test_render"))


def parse_command(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    runtime: str,
    check_files: bool = True,
) -> Settings:
    """The settings of a command line, refused in one line (``parser.error``) where its
    mode cannot do what it asks; ``check_files``: and where its --video could not be
    written (a study checks its cells' commands before it makes their folders)."""
    flags, sources = parse_flags_and_sources(argv, parser)
    settings = build_settings(flags, runtime, sources)
    mode = settings.run.mode
    if settings.run.video is not None:
        if mode in ("train", "test_render"):
            parser.error(f"--video records the games of --mode test and eval, not {mode}")
        try:
            video.check_path(settings.run.video, writable=check_files)
        except video.VideoError as error:
            parser.error(str(error))
    if mode == "test_render" and sys.platform == "linux" and not has_display():
        parser.error(
            "--mode test_render opens a window, and this machine has no display ($DISPLAY "
            "is not set): record the games with --mode test --video FILE.gif instead"
        )
    if settings.run.random_policy and mode == "train":
        parser.error("--random_policy plays in --mode test and eval; it does not train")
    if settings.run.sample_actions and mode == "train":
        parser.error("--sample_actions plays in --mode test and eval; training always samples")
    if settings.run.sample_actions and settings.run.random_policy:
        parser.error("--sample_actions draws the model's actions; --random_policy plays none")
    if mode == "train" and sources.get("num_episodes") == COMMAND_LINE:
        parser.error(  # a user may expect training to stop after so many episodes
            "--num_episodes counts the games of --mode test and eval; training stops at "
            "--total_steps"
        )
    return settings

"""The runtimes by name, for the entry points, the benchmark and the docs: adding a runtime
means adding it here, and touches neither the algorithm nor them.

A runtime is a module with

    session(settings) -> context manager of a Trainer whose ``train()`` runs the actors
    train(settings) -> dict: ``with session(settings) as trainer: return trainer.train()``

and a ``Trainer`` subclass (``runtime.training``) that learns its env spec, starts its
pool (``runtime.pool.Pool``) and publishes weights. A runtime with flags of its own names
the torch-free class of its settings, whose fields declare them (``core.settings.flag``:
the edge adds them to its parser and builds the settings from them, ``config.parsers``,
``config.settings``; the manual's table of them is generated, ``docs``); one whose
benchmark needs flags set for it (PolyBeast: its env servers) names the function that
gives them. A new runtime is its package and one entry here: nothing in ``config``
names a runtime.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchbeast.config.settings import Settings


def function(path: str) -> Callable:
    """The function (or class) a "module:name" path names, its module imported."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Runtime:
    name: str  # what --runtime names it
    title: str  # what people call it
    module: str  # imported on first use: it may need settings made before (Ray)
    description: str  # its parser's
    entry_point: str  # the module a user runs: python -m ENTRY_POINT
    # "module:Class" of the runtime's own settings (Settings.runtime), a frozen dataclass
    # whose fields declare its flags; and "module:function" (parser) that adds what its
    # flags derive (resolvers, other defaults). Torch-free.
    settings: str | None = None
    adjust_parser: str | None = None
    # Whether rollouts live in --num_buffers shared-memory buffers (MonoBeast), so that the
    # flag is resolved and checked; the other runtimes accept it and ignore it.
    shared_memory_buffers: bool = False
    prepare: str | None = None  # "module:function" to call with the settings before import
    # "module:function" that returns the manual's table of the runtime's own flags, between
    # the markers of table NAMEflags (config.reference.markers); None: the generated table
    # of the flags its settings declare.
    flags_table: str | None = None
    # "module:function" (flags, folder) -> {flag: value} that a benchmark run in the
    # temporary ``folder`` sets beyond the user's flags; None: none.
    bench_flags: str | None = None
    # "module:function" (flags, key) -> {flag: value}: what a run of a study (its flags,
    # a key of its own) adds so that runs side by side on one machine never meet (shared
    # addresses); torch-free. None: nothing.
    study_flags: str | None = None

    def load(self, settings: Settings) -> ModuleType:
        """The runtime's module, imported once its ``prepare`` step has run."""
        if self.prepare is not None:
            function(self.prepare)(settings)
        return importlib.import_module(self.module)

    def bench_overrides(self, flags: argparse.Namespace, folder: str) -> dict:
        """The flags a benchmark run in ``folder`` sets for this runtime."""
        return {} if self.bench_flags is None else function(self.bench_flags)(flags, folder)

    def apart_flags(self, flags: dict[str, object], key: str) -> dict[str, object]:
        """The flags a study's run of ``flags`` adds to run apart from the others
        (``study_flags``), ``key`` its own."""
        return {} if self.study_flags is None else function(self.study_flags)(flags, key)

    def train(self, settings: Settings, **options) -> dict:
        """Trains with this runtime: its module's ``train``."""
        return self.load(settings).train(settings, **options)


RUNTIMES = {
    runtime.name: runtime
    for runtime in (
        Runtime(
            "mono",
            "MonoBeast",
            "torchbeast.runtime.mono",
            "MonoBeast: IMPALA on one machine, actors in processes.",
            entry_point="torchbeast.monobeast",
            settings="torchbeast.runtime.mono_settings:MonoSettings",
            adjust_parser="torchbeast.runtime.mono_settings:adjust_parser",
            shared_memory_buffers=True,
        ),
        Runtime(
            "poly",
            "PolyBeast",
            "torchbeast.runtime.poly.trainer",
            "PolyBeast learner: IMPALA with environments as gRPC peers.",
            entry_point="torchbeast.polybeast",
            settings="torchbeast.config.poly:PolySettings",
            adjust_parser="torchbeast.config.poly_flags:adjust_learner_parser",
            flags_table="torchbeast.config.reference:poly_reference",
            bench_flags="torchbeast.runtime.poly.trainer:bench_flags",
            study_flags="torchbeast.config.poly:sockets_of_its_own",
        ),
        Runtime(
            "ray",
            "RayBeast",
            "torchbeast.runtime.ray.trainer",
            "RayBeast: IMPALA with Ray actors, on one machine or a Ray cluster.",
            entry_point="torchbeast.raybeast",
            settings="torchbeast.runtime.ray.settings:RaySettings",
            prepare="torchbeast.runtime.ray.prepare:prepare_environment",
        ),
    )
}

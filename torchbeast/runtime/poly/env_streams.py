"""What serves an env stream, for the two ways streams open (the learner dials env servers,
``dialling``; env clients dial the learner, ``learner_servicer``): neither needs more of
the learner's pool than this."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from torchbeast.runtime.poly import polybeast_pb2 as pb


class EnvStreams(Protocol):
    """Runs env streams: ``PolyActorPool``."""

    stopping: threading.Event
    # Whether this command started the env processes: their environment's failure is
    # then the run's own (as in MonoBeast), not a peer's.
    owns_envs: bool
    # Set once a dialled stream has served an action: a server misconfigured after that
    # costs its own streams, not the run (``dialling.misconfigured``).
    has_served: threading.Event

    def serve_env(
        self, incoming: Iterator[pb.EnvMessage], cancel: Callable[[], object]
    ) -> Iterator[pb.Action]:
        """Runs one stream: reads its messages, yields the Actions to send back."""
        ...

    def fail(self, message: str) -> None:
        """Ends the run with ``message``."""
        ...

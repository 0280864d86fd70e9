"""The environment the run trains on, as the learner's end of the streams knows it: from
the learner (``--env`` or its checkpoint) or, when it was told nothing, from the first
Hello; every Hello is checked against it."""

from __future__ import annotations

import logging
import threading

from torchbeast.core.checkpoint import describe_spec
from torchbeast.core.spec import EnvSpec

log = logging.getLogger("torchbeast")


class SpecMismatch(ValueError):
    """An environment's spec differs from the one this learner trains on."""


class RunSpec:
    """The run's env spec; ``known`` is set once there is one."""

    def __init__(self, spec: EnvSpec | None):
        self.spec = spec
        self.known = threading.Event()
        if spec is not None:
            self.known.set()
        self.lock = threading.Lock()

    def register(self, client_id: str, spec: EnvSpec) -> None:
        """Checks a Hello's spec against the run's; the first Hello decides it only when
        the learner was told nothing about the environment."""
        with self.lock:
            if self.spec is None:
                self.spec = spec
                self.known.set()
                log.info(
                    "The learner was not told the environment (--env), so the first one to "
                    "connect decides it: %s sent %s, observations %s %s, %d actions.",
                    client_id,
                    spec.env_id,
                    spec.observation_dtype,
                    list(spec.observation_shape),
                    spec.num_actions,
                )
            elif spec != self.spec:
                raise SpecMismatch(
                    f"environment {describe_spec(spec)} does not match the run's "
                    f"{describe_spec(self.spec)}"
                )

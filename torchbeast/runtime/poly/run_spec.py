"""The environment the run trains on, as the learner's end of the streams knows it: from
the learner (``--env`` or its checkpoint) or, when it was told nothing, from the first
Hello; every Hello is checked against it."""

from __future__ import annotations

import logging
import threading

from torchbeast import envs
from torchbeast.core.checkpoint import describe_spec
from torchbeast.core.errors import shown
from torchbeast.core.spec import EnvSpec

log = logging.getLogger("torchbeast")


class SpecMismatch(ValueError):
    """An environment's spec differs from the one this learner trains on."""


class RunSpec:
    """The run's env spec; ``known`` is set once there is one. And the env family flags
    the run's environments were made with (``env_options``), as the first Hello with any
    said them: every other environment must say the same (one run, one reward)."""

    def __init__(self, spec: EnvSpec | None, env_options: dict[str, object] | None = None):
        self.spec = spec
        self.known = threading.Event()
        if spec is not None:
            self.known.set()
        self.env_options = env_options
        self.lock = threading.Lock()

    def register(self, client_id: str, spec: EnvSpec, env_options: dict[str, object]) -> None:
        """Checks a Hello's spec and env options against the run's; the first Hello
        decides the spec and the options only where the learner was told nothing of them
        (no --env, and no checkpoint that records them)."""
        with self.lock:
            if self.spec is not None and spec != self.spec:
                raise SpecMismatch(
                    f"environment {describe_spec(spec)} does not match the run's "
                    f"{describe_spec(self.spec)}"
                )
            if self.env_options is not None and env_options != self.env_options:
                raise SpecMismatch(
                    f"environment made with {describe_options(env_options)} does not match "
                    f"the run's environments, made with {describe_options(self.env_options)}"
                )
            if self.spec is None:
                check_first_env_id(spec.env_id)
            if self.env_options is None:
                self.env_options = env_options  # before the spec is known: read with it
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


def check_first_env_id(env_id: str) -> None:
    """Refuses (SpecMismatch) an env id the first Hello names that this learner does not
    know (that stream is refused, and the learner waits for another), or that names a
    module to import first (``module:Id``): a peer's words import no code here."""
    if ":" in env_id:
        raise SpecMismatch(
            f"environment {shown(env_id)} names a module to import, and a learner imports "
            f"no code a peer names: give the learner --env {shown(env_id, quote=False)}"
        )
    try:
        envs.family_of(env_id)
    except envs.EnvError as error:
        raise SpecMismatch(f"{error} (the learner was not told --env)") from None


def describe_options(options: dict[str, object]) -> str:
    """Env options as flags: "--fuel_multiplier 5.0 --move_penalty 1.0"."""
    flags = (f"--{name} {shown(value, quote=False)}" for name, value in sorted(options.items()))
    return " ".join(flags) or "none"  # a peer's values: escaped, as any string of its

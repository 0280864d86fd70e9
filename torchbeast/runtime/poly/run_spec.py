"""The environment the run trains on, as the learner's end of the streams knows it: from
the learner (``--env`` or its checkpoint) or, when it was told nothing, from the first
Hello; every Hello is checked against it."""

from __future__ import annotations

import logging
import threading

from torchbeast import envs
from torchbeast.config.layers import checked_options
from torchbeast.core.checkpoint import describe_spec
from torchbeast.core.errors import UserError, first_line, shown
from torchbeast.core.models import model_config, parameters_over
from torchbeast.core.settings import ModelSettings
from torchbeast.core.spec import EnvSpec

log = logging.getLogger("torchbeast")

# A learner told no --env builds its model for the first Hello's observations: a peer's
# word makes no larger one (an AtariNet on [1, 1024, 1024] frames has 504M parameters;
# on Atari's own [4, 84, 84], 1.7M). Told --env, the learner builds what the user asked.
MAX_PEER_MODEL_PARAMETERS = 100_000_000


class SpecMismatch(ValueError):
    """An environment's spec differs from the one this learner trains on."""


class RunSpec:
    """The run's env spec; ``known`` is set once there is one. And the env family flags
    the run's environments were made with (``env_options``), as the first Hello with any
    said them: every other environment must say the same (one run, one reward)."""

    def __init__(
        self,
        spec: EnvSpec | None,
        env_options: dict[str, object] | None = None,
        model: ModelSettings | None = None,
    ):
        """``model``: the learner's model settings, which the first Hello's spec must fit
        (``check_model_fits``) where it decides the spec."""
        self.spec = spec
        self.model = model
        self.known = threading.Event()
        if spec is not None:
            self.known.set()
        self.env_options = env_options
        self.lock = threading.Lock()

    def register(self, client_id: str, spec: EnvSpec, env_options: dict[str, object]) -> None:
        """Checks a Hello's spec and env options against the run's; the first Hello
        decides the spec and the options only where the learner was told nothing of them
        (no --env, and no checkpoint that records them). The options are checked as a
        flags file's values are (``"x"`` is no --fuel_multiplier) before anything reads
        them."""
        with self.lock:
            if self.spec is not None and spec != self.spec:
                raise SpecMismatch(
                    f"environment {describe_spec(spec)} does not match the run's "
                    f"{describe_spec(self.spec)}"
                )
            if self.spec is None:
                check_first_env_id(spec.env_id)
                if self.model is not None:
                    check_model_fits(spec, self.model)
            # Only the run's env id, or one check_first_env_id let by, is looked up: a
            # peer's module:Id imports nothing here.
            family = family_or_none((self.spec or spec).env_id)
            try:
                env_options = checked_options(family and family.options, env_options)
            except ValueError as error:
                raise SpecMismatch(f"environment made with {error}") from None
            if self.env_options is not None and not same_envs(
                family, env_options, self.env_options
            ):
                raise SpecMismatch(
                    f"environment made with {describe_options(env_options)} does not match "
                    f"the run's environments, made with {describe_options(self.env_options)}"
                )
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


def family_or_none(env_id: str) -> envs.EnvFamily | None:
    """``env_id``'s family; None for an id no family takes now (a checkpoint's, say)."""
    try:
        return envs.family_of(env_id)
    except envs.EnvError:
        return None


def same_envs(
    family: envs.EnvFamily | None, options: dict[str, object], run_options: dict[str, object]
) -> bool:
    """Whether env ``options`` make the run's envs (made with ``run_options``), compared as
    their family compares them (``EnvFamily.compared_options``: a proxy flag given its
    default value and one not given are one proxy); as they were said without a family.
    A plug-in family whose comparison fails refuses the stream, not the run."""
    if family is None:
        return options == run_options
    try:
        return family.compared_options(options) == family.compared_options(run_options)
    except Exception as error:
        log.warning(
            "%s failed to compare env options: %s: %s",
            family.name,
            type(error).__name__,
            first_line(error),
        )
        return False


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


def check_model_fits(spec: EnvSpec, model: ModelSettings) -> None:
    """Refuses (SpecMismatch) a first Hello's spec that the learner's model settings cannot
    build a model for (e.g. --torso atari for CartPole's [4]), or only one larger than
    ``MAX_PEER_MODEL_PARAMETERS``: that stream is refused, not the run stopped or the
    machine's memory spent on a peer's word."""
    try:
        config = model_config(model, spec.observation_shape)
    except UserError as error:
        raise SpecMismatch(f"{error} (the learner was not told --env)") from None
    shape, actions = spec.observation_shape, spec.num_actions
    if parameters := parameters_over(config, shape, actions, MAX_PEER_MODEL_PARAMETERS):
        raise SpecMismatch(
            f"environment {describe_spec(spec)} would make a model of "
            f"{parameters / 1e6:.0f}M parameters (--torso {config['kind']}), more than the "
            f"{MAX_PEER_MODEL_PARAMETERS // 1_000_000}M a learner builds for what the "
            f"first env stream says: give the learner --env "
            f"{shown(spec.env_id, quote=False)} to build it"
        )


def describe_options(options: dict[str, object]) -> str:
    """Env options as flags: "--fuel_multiplier 5.0 --move_penalty 1.0"."""
    flags = (f"--{name} {shown(value, quote=False)}" for name, value in sorted(options.items()))
    return " ".join(flags) or "none"  # a peer's values: escaped, as any string of its

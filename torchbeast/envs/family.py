"""Environment families: what torchbeast knows about a kind of environment, in one place.

A family says which ids it takes, how it makes N of them stepped together, the flags it
adds (``options``, their own group in ``--help``), and its presets: settings that runs measured to
learn, applied beneath the command line (``config.layers``). The built-in families are
Atari (with Riverraid's reward proxies), MinAtar, PixelCue and, for every other id whose
spaces torchbeast can train, Gymnasium's own (classic control and a user's ``module:Id``).

A package adds its own family through an entry point in the group ``torchbeast.env_families``
that names an ``EnvFamily`` instance (or a class to instantiate), in its ``pyproject.toml``::

    [project.entry-points."torchbeast.env_families"]
    congestion = "my_package.family:CongestionFamily"

Families from entry points are asked before the built-in ones, so a package can take over
ids that a built-in family would also take.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym

from torchbeast.core.errors import first_line
from torchbeast.envs.registry import EnvError, cannot_draw, gym_spec

if TYPE_CHECKING:
    from torchbeast.envs.batched import BatchedEnv
    from torchbeast.envs.settings import EnvSettings

log = logging.getLogger("torchbeast")

ENTRY_POINT_GROUP = "torchbeast.env_families"


@dataclass(frozen=True)
class Preset:
    """Flag values a run measured to learn, for a family or one of its games.

    ``scope``: what it is for, as the log and ``--print_settings`` name it ("MinAtar",
    "MinAtar/SpaceInvaders-v1"); ``measured``: the run that measured it (command, seed and
    figure), which the manual's table of presets repeats."""

    scope: str
    flags: Mapping[str, object]
    measured: str = ""
    when: str = ""  # the command lines it applies to, as the manual's table says


class EnvFamily:
    """A family of environments. Subclasses set ``name`` and ``summary`` and override what
    their family needs; the base makes any Gymnasium id with ``gym.make`` and has no flags
    and no presets."""

    name = "Gymnasium"
    summary = "any other Gymnasium id with a Box observation and Discrete actions"
    # The family's flags, declared once as the fields of a frozen dataclass made with
    # ``core.settings.flag`` (None: it has none). They appear in their own group of
    # --help, ``polybeast_env`` takes them too, and their values reach the family's envs
    # through ``EnvSettings.options``.
    options: type | None = None

    @property
    def flag_names(self) -> tuple[str, ...]:
        """The names of the family's flags (``options``' fields)."""
        if self.options is None:
            return ()
        return tuple(field.name for field in dataclasses.fields(self.options))

    def takes(self, env_id: str, spec: gym.envs.registration.EnvSpec) -> bool:
        """Whether this family makes ``env_id`` (its registered ``spec``)."""
        return True

    def presets(self, env_id: str, given: Mapping[str, object]) -> list[Preset]:
        """The presets for ``env_id``, family-wide first, then the game's; ``given``: the
        flags set so far (defaults, a config file, the command line), for presets that
        depend on them."""
        return []

    def known_presets(self) -> list[Preset]:
        """Every preset the family may apply, for the manual's table."""
        return []

    def check(self, settings: EnvSettings) -> None:
        """Raises EnvError where the family's flags cannot apply to ``settings.env``."""

    def make(
        self, settings: EnvSettings, num_envs: int, num_threads: int, render: str | None
    ) -> BatchedEnv:
        """``num_envs`` copies of ``settings.env``, stepped together; ``render``: Gymnasium's
        render mode, "human" (a window) or "rgb_array" (``BatchedEnv.frame``), or None."""
        from torchbeast.envs.batched import BatchedEnv

        env_id = settings.env
        make_kwargs = {"render_mode": render} if render else {}
        offered = declared_render_modes(env_id)
        if render and offered is not None and render not in offered:
            raise EnvError(cannot_draw(env_id, f"its render modes are {list(offered)}"))
        try:
            vector_env = gym.vector.SyncVectorEnv(
                [lambda: gym.make(env_id, **make_kwargs)] * num_envs,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            )
        except TypeError as error:
            if render and "render_mode" in str(error):
                raise EnvError(cannot_draw(env_id, "it takes no render_mode")) from None
            raise
        return BatchedEnv(vector_env, env_id, track_lives=False)

    def reward_description(self, settings: EnvSettings) -> str | None:
        """What trains the agent where it is not the env's own reward, or None."""
        return None

    def log_training_reward(self, settings: EnvSettings, reward_clipping: str) -> None:
        """Says which reward trains the agent where it is not the env's own."""

    def played_unlike_trained(self, settings: EnvSettings, trained_flags: Mapping) -> list[str]:
        """One line for each of the family's flags that test or eval plays with (the
        command line's) but the run did not train with (``trained_flags``: its checkpoint's)."""
        return flag_differences(self.options, self.flag_names, settings, trained_flags)

    def compared_options(self, options: Mapping[str, object]) -> dict[str, object]:
        """The family flags ``options`` (as a Hello or a checkpoint carries them: a flag
        not given is left out) as they decide the envs, so that two spellings of the same
        envs compare equal: here each flag not given has its default. A name that is no
        flag of the family stays as it is (a peer's words: they do not match ours)."""
        fields = dataclasses.fields(self.options) if self.options is not None else ()
        return {field.name: field.default for field in fields} | dict(options)

    def evaluation_figures(self, settings: EnvSettings, trained_flags: Mapping) -> dict:
        """What ``--mode eval`` adds to ``eval.json`` for this family (e.g. the reward
        settings the run was trained with), beside the returns."""
        return {}

    def cannot_train(self, env_id: str) -> str | None:
        """Why torchbeast cannot train on ``env_id`` (for the list of ids), or None. The
        base class makes one env and looks at its spaces."""
        from torchbeast.envs.batched import space_problem

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                env = gym.make(env_id)
        except Exception as error:  # a missing dependency, a required argument, ...
            return f"cannot be made here: {first_line(error)}"
        try:
            return space_problem(env.observation_space, env.action_space)
        finally:
            env.close()


# The entry point of each plug-in family, by the family's id(): where the messages say
# it came from.
_plugins: dict[int, str] = {}
_left_out: set[int] = set()  # plug-ins that broke as they were asked (``family_of``)


def same_package(entry_point: str, env_entry_point: object) -> bool:
    """Whether a plug-in's entry point ("corridors.family:CorridorFamily") and an env's
    registered entry point (a "module:Class" string, or the class) are of one package."""
    if not isinstance(env_entry_point, str):  # a class or function: its module's name
        env_entry_point = env_entry_point.__module__
    return entry_point.split(".")[0].split(":")[0] == env_entry_point.split(".")[0].split(":")[0]


def is_plugin(family: EnvFamily) -> bool:
    """Whether a package's entry point brought ``family`` (not one of torchbeast's)."""
    return id(family) in _plugins


def plugin_text(family: EnvFamily) -> str:
    """``env family 'Congestion' (entry point my_package.family:CongestionFamily)``."""
    return f"env family {family.name!r} (entry point {_plugins.get(id(family), '?')})"


def _entry_point_families() -> list[EnvFamily]:
    families = []
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry_point.load()
            family = loaded() if isinstance(loaded, type) else loaded
        except Exception as error:  # a broken plug-in must not stop a run that does not use it
            log.warning(
                "Env family %r (entry point %s) could not be loaded: %s",
                entry_point.name,
                entry_point.value,
                error,
            )
            continue
        if not isinstance(family, EnvFamily):
            log.warning(
                "Entry point %s names %r, not a torchbeast.envs.family.EnvFamily; ignored",
                entry_point.value,
                family,
            )
            continue
        _plugins[id(family)] = entry_point.value  # (kept alive, in the cached tuple)
        families.append(family)
    return families


def families() -> tuple[EnvFamily, ...]:
    """Every family, in the order they are asked: plug-ins, then the built-in ones, the
    generic Gymnasium family last; a plug-in that broke as it was asked is left out."""
    return tuple(family for family in _loaded_families() if id(family) not in _left_out)


@functools.cache
def _loaded_families() -> tuple[EnvFamily, ...]:
    from torchbeast.envs.atari import AtariFamily
    from torchbeast.envs.cue import PixelCueFamily
    from torchbeast.envs.minatar import MinAtarFamily

    return (*_entry_point_families(), AtariFamily(), MinAtarFamily(), PixelCueFamily(), EnvFamily())


def family_of(env_id: str) -> EnvFamily:
    """The family that makes ``env_id``; EnvError for an unknown id. The plug-ins load
    first, so that a package's ids are registered before the lookup."""
    candidates = families()
    spec = gym_spec(env_id)
    for family in candidates:
        try:
            if family.takes(env_id, spec):
                return family
        except Exception as error:
            if not is_plugin(family):
                raise
            if same_package(_plugins[id(family)], spec.entry_point):  # its own env: say so
                raise EnvError(
                    f"{plugin_text(family)} failed to tell whether it takes {env_id!r}: "
                    f"{type(error).__name__}: {error}; fix or reinstall its package"
                ) from error
            # A broken plug-in must not stop a run that does not use it, nor make its ids.
            _left_out.add(id(family))
            log.warning(
                "%s is left out: its takes(%r) raised %s: %s",
                plugin_text(family),
                env_id,
                type(error).__name__,
                error,
            )
    raise EnvError(f"no environment family takes {env_id!r}")  # the generic one takes all


def declared_render_modes(env_id: str) -> list[str] | None:
    """The render modes ``env_id``'s class declares in its metadata (as Gymnasium reads
    them), or None where it declares none."""
    creator = gym_spec(env_id).entry_point
    if isinstance(creator, str):
        creator = gym.envs.registration.load_env_creator(creator)
    metadata = getattr(creator, "metadata", None)  # a class declares it; a function may not
    return metadata.get("render_modes") if isinstance(metadata, Mapping) else None


def check_foreign_flags(settings: EnvSettings, family: EnvFamily) -> None:
    """EnvError where ``settings`` set a flag that another family declares and
    ``settings.env``'s own does not: it would be silently ignored (a Riverraid proxy on
    CartPole trains on CartPole's reward)."""
    for other in families():
        if other is family or other.options is None:
            continue
        for field in dataclasses.fields(other.options):
            value = settings.option(field.name, field.default)
            if field.name not in family.flag_names and value != field.default:
                raise EnvError(
                    f"{flag_text(field.name, value)} is a flag of the {other.name} family "
                    f"({other.summary}); {settings.env} is not one of its envs: leave it out"
                )


def flag_differences(
    options: type | None, names: Iterable[str], settings: EnvSettings, trained_flags: Mapping
) -> list[str]:
    """A line for each flag of ``names`` (fields of ``options``) whose value in
    ``settings`` is not the one in ``trained_flags`` (absent: the default)."""
    fields = dataclasses.fields(options) if options is not None else ()
    defaults = {field.name: field.default for field in fields}
    lines = []
    for name in names:
        played = setting_text(name, settings.option(name, defaults[name]))
        trained = setting_text(name, trained_flags.get(name, defaults[name]))
        if played != trained:  # as said: a switch off and one never given are the same
            lines.append(f"Playing with {played}, but the run was trained with {trained}.")
    return lines


def setting_text(name: str, value: object) -> str:
    """A flag's value as a line names it: ``--name value``, ``--name`` for a switch that is
    on, ``no --name`` for one that is off or a flag not given."""
    return f"no --{name}" if value is None or value is False else flag_text(name, value)


def flag_text(name: str, value: object) -> str:
    """``--name value`` as a command line gives it (a switch that is on: ``--name``)."""
    return f"--{name}" if value is True else f"--{name} {value}"


def presets_table() -> str:
    """The manual's table of every family's presets (``python -m torchbeast.docs``)."""
    rows = [
        "| family | applies to | settings | measured by |",
        "|---|---|---|---|",
    ]
    for family in families():
        for preset in family.known_presets():
            flags = " ".join(f"`{flag_text(name, value)}`" for name, value in preset.flags.items())
            rows.append(f"| {family.name} | {preset.when} | {flags} | {preset.measured} |")
    return "\n".join(rows)

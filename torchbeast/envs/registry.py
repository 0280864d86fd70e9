"""Which environment ids torchbeast can make: the optional envs registered with Gymnasium
(ale-py's Atari, PixelCue, MinAtar if installed) and an id's registered spec; ``EnvError``
for an id or space torchbeast cannot run."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types

import gymnasium as gym

from torchbeast.core.errors import UserError, shown

LIST_IDS_HINT = "list valid ids with: python -m torchbeast.envs"
MINATAR_PREFIX = "MinAtar/"  # the ids MinAtar registers


class EnvError(UserError, ValueError):
    """An environment id or space that torchbeast cannot run; the message says why."""


class EnvImportError(EnvError):
    """The module a ``module:Id`` env id names cannot be imported here."""


_registering = threading.Lock()


# What MinAtar's package imports for its display alone (a window, and render's palette;
# seaborn brings scipy.stats): its import took 2.1-2.5 s here, in every process of a MinAtar
# run (the learner and each actor), and 0.4 s with these loaded on their first use.
MINATAR_DISPLAY_MODULES = ("seaborn", "matplotlib.pyplot")


class LoadedOnFirstUse(types.ModuleType):
    """A module's stand-in in ``sys.modules``: the module is imported when an attribute it
    lacks is first read, and lends it its attributes from then on. (Python 3.11's
    ``importlib.util.LazyLoader`` loads at the next ``import`` of the name, which reads
    ``__spec__``.)"""

    def __init__(self, spec: importlib.machinery.ModuleSpec):
        super().__init__(spec.name)
        # What the import system and inspect read of every module (inspect.getmodule asks
        # each one in sys.modules for its __file__, as torch's import does): it has them.
        self.__spec__, self.__loader__, self.__package__ = spec, spec.loader, spec.parent
        if spec.has_location:
            self.__file__ = spec.origin
        if spec.submodule_search_locations is not None:
            self.__path__ = spec.submodule_search_locations
        self.__lock = threading.Lock()  # private names: the module's own do not replace them
        self.__module: types.ModuleType | None = None

    def __getattr__(self, attribute: str) -> object:  # only for those it lacks
        with self.__lock:
            if self.__module is None:
                name = self.__spec__.name
                if sys.modules.get(name) is self:
                    del sys.modules[name]
                self.__module = importlib.import_module(name)
                vars(self).update(vars(self.__module))
        return getattr(self.__module, attribute)


def load_on_first_use(name: str) -> None:
    """Puts a ``LoadedOnFirstUse`` for module ``name`` in ``sys.modules``. Not where it is
    already imported, or where it cannot be found (an import of it then fails as before)."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(name)  # imports the parent package, if any
    except ImportError:
        return
    if spec is None:
        return
    sys.modules[name] = stand_in = LoadedOnFirstUse(spec)
    if parent:  # as an import binds it
        setattr(sys.modules[parent], child, stand_in)


def _register_optional_envs(with_minatar: bool = True) -> None:
    """Registers ale-py's Atari ids, PixelCue and (``with_minatar``) MinAtar's ids.

    MinAtar's package imports matplotlib and seaborn for its display, a second of CPU in
    every process that imports it (the learner and each actor): runs of other envs skip
    it, and runs of MinAtar load those on their first use (``MINATAR_DISPLAY_MODULES``)."""
    # Under a lock: an env client process creates its envs from several threads at once,
    # and gymnasium's registry is a plain dict (a concurrent registration raised
    # "dictionary changed size during iteration" and stopped every client of the process).
    with _registering:
        import ale_py

        from torchbeast.envs import cue

        gym.register_envs(ale_py)
        cue.register()
        if not with_minatar:
            return
        if "minatar" not in sys.modules and importlib.util.find_spec("minatar") is None:
            return
        for name in MINATAR_DISPLAY_MODULES:
            load_on_first_use(name)
        try:
            import minatar.gym
        except ImportError:
            return
        if "MinAtar/Breakout-v1" not in gym.registry:
            minatar.gym.register_envs()


def gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id``; ``module:Id`` imports ``module`` first."""
    module, colon, name = env_id.rpartition(":")
    if colon and (not module or module.startswith(".")):  # ":Id", ".mod:Id": no module's name
        raise EnvError(
            f"environment {env_id!r} names no module before its ':' (a module's full name, "
            f"as in my_package.envs:{name or 'MyEnv-v0'}): give one, or the id alone"
        )
    _register_optional_envs(with_minatar=name.startswith(MINATAR_PREFIX))
    try:
        if module:
            importlib.import_module(module)
        return gym.spec(name)
    except ImportError as error:
        raise EnvImportError(
            f"cannot import {module!r} for environment {env_id!r} ({error})"
        ) from None
    except gym.error.Error as error:
        hint = "install it with: pip install MinAtar; " if name.startswith(MINATAR_PREFIX) else ""
        raise EnvError(
            f"unknown environment id {env_id!r} ({error}); {hint}{LIST_IDS_HINT}"
        ) from None
    except Exception as error:  # the module's own code failed as it was imported
        reason = shown(f"{type(error).__name__}: {error}", quote=False)
        raise EnvImportError(
            f"importing {module!r} for environment {env_id!r} failed ({reason}): fix the "
            "module, then run the same command"
        ) from None


def cannot_draw(env_id: str, why: str) -> str:
    """The line that refuses --video or --mode test_render for ``env_id``."""
    return (
        f"{env_id} cannot draw itself ({why}): --video and --mode test_render need an env "
        "that renders; play it with --mode test or eval without them"
    )

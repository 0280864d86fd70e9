"""Flags from the settings that declare them (``core.settings.flag``), and settings from
the parsed flags: the one place where a setting's field becomes a parser's argument and
back, so that each setting is declared once."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
import weakref
from collections.abc import Iterator
from typing import Any, Literal

from torchbeast.config import values
from torchbeast.core.settings import Flag

# Each parser's flags added from declarations: name -> the Flag that declared it.
_added: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# (the field's type, its check) -> the parser's value type, which refuses other values.
VALUE_TYPES = {
    (int, None): int,
    (int, "positive"): values.positive_int,
    (int, "nonnegative"): values.nonnegative_int,
    (int, "seed"): values.seed_int,
    (float, None): float,
    (float, "positive"): values.positive_float,
    (float, "nonnegative"): values.nonnegative_float,
    (float, "unit"): values.unit_float,
    (float, "finite"): values.finite_float,
    (str, None): str,
}


@dataclasses.dataclass(frozen=True)
class DeclaredFlag:
    """A settings field that is a flag: ``--name``, its default, its type and its ``Flag``."""

    name: str
    default: Any
    value_type: Any  # the field's type, None left out (``int | None`` -> int)
    flag: Flag
    group: str

    def argument(self) -> tuple[list[str], dict[str, Any]]:
        """The option strings and keyword arguments of ``add_argument``."""
        kwargs: dict[str, Any] = {"default": self.default, "help": self.flag.help}
        names = [f"--{self.name}", *self.flag.aliases]
        if self.value_type is bool:
            if self.default is not False:
                raise TypeError(f"--{self.name}: a switch must default to False")
            kwargs["action"] = Switch
            if not self.name.startswith("no_"):  # --no_no_fire_on_life_loss: not said
                names.append(f"--no_{self.name}")
        elif typing.get_origin(self.value_type) is Literal:
            kwargs["choices"] = list(typing.get_args(self.value_type))
        else:
            key = (self.value_type, self.flag.check)
            if key not in VALUE_TYPES:
                raise TypeError(f"--{self.name}: no value type for {key}")
            kwargs["type"] = VALUE_TYPES[key]
        if self.flag.metavar is not None:
            kwargs["metavar"] = self.flag.metavar
        return names, kwargs


class Switch(argparse.Action):
    """A switch, off by default: ``--name`` turns it on and ``--no_name`` (where it has
    one) off, so that the command line wins over a preset or a flags file that turned it
    on (``--normalize_values`` in Riverraid's survival preset)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, const=True, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        off = option_string is not None and option_string == f"--no_{self.dest}"
        setattr(namespace, self.dest, not off)


def without_none(hint: Any) -> Any:
    """``X | None`` -> X; other types as they are."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


@functools.cache
def _hints(settings_type: type) -> dict[str, Any]:
    return typing.get_type_hints(settings_type)


def nested_settings(settings_type: type, field: dataclasses.Field) -> type | None:
    """The settings class a field holds (PolySettings.network), or None."""
    hint = without_none(_hints(settings_type)[field.name])
    return hint if dataclasses.is_dataclass(hint) and isinstance(hint, type) else None


def declared_flags(settings_type: type, group: str | None = None) -> Iterator[DeclaredFlag]:
    """The flags ``settings_type`` declares, in field order (those of the settings it holds
    where it holds some), each in its own group, or else ``group``, or else the class's
    ``flags_group``."""
    for field in dataclasses.fields(settings_type):
        nested = nested_settings(settings_type, field)
        if nested is not None:
            yield from declared_flags(nested, group)
        elif "flag" in field.metadata:
            flag: Flag = field.metadata["flag"]
            title = flag.group or group or vars(settings_type).get("flags_group")
            if title is None:
                raise TypeError(f"--{field.name}: no --help group ({settings_type.__name__})")
            hint = without_none(_hints(settings_type)[field.name])
            yield DeclaredFlag(field.name, field.default, hint, flag, title)


def group_of(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The parser's group of that title, made (after the others) if it has none."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def add_declared_flags(
    parser: argparse.ArgumentParser,
    settings_type: type,
    group: str | None = None,
    plugin: str | None = None,
) -> None:
    """Adds the flags ``settings_type`` declares to their groups (``declared_flags``), but
    those the parser has from the same declaration already (settings that several
    commands' classes hold, such as the env's); a name declared twice is refused.
    ``plugin``: the package's env family that declares them (``envs.family.plugin_text``),
    named where one of them is also another setting's."""
    added = _added.setdefault(parser, {})  # name -> (flag, the plug-in that declared it)
    for declared in declared_flags(settings_type, group):
        names, kwargs = declared.argument()
        taken = [name for name in names if name in parser._option_string_actions]
        if declared.name in added or taken:
            # The setting that has the name already (a switch's --no_name: another's name).
            owner = parser._option_string_actions[taken[0]].dest if taken else declared.name
            flag, earlier = added.get(owner, (None, None))
            if flag is declared.flag:
                continue
            if plugin or earlier:  # a package's mistake, not ours: one line, before --help
                also = "torchbeast's own settings declare"
                if plugin and earlier:
                    also = f"{earlier} declares too"
                said = f"--{declared.name}"
                if owner != declared.name:
                    said += f", a switch, so {taken[0]} too"
                raise SystemExit(
                    f"error: {plugin or earlier} declares {said}, which {also}: "
                    "rename its flag, or uninstall its package"
                )
            raise ValueError(f"--{declared.name} is declared by two settings")
        group_of(parser, declared.group).add_argument(*names, **kwargs)
        added[declared.name] = (declared.flag, plugin)


def from_flags(settings_type, parsed: argparse.Namespace, /, **given):
    """``settings_type`` from the ``parsed`` flags of its fields' names, but those ``given``;
    a field that holds settings is built the same way. A field with a default keeps it
    where the parser had no such flag (a runtime's own flag, e.g. MonoBeast's
    --central_inference, read by the settings of every runtime)."""
    values_ = dict(given)
    for field in dataclasses.fields(settings_type):
        if field.name in given:
            continue
        nested = nested_settings(settings_type, field)
        if nested is not None:
            values_[field.name] = from_flags(nested, parsed)
        elif field.default is dataclasses.MISSING or field.name in vars(parsed):
            values_[field.name] = getattr(parsed, field.name)
    return settings_type(**values_)

"""Where each flag's value comes from. Four layers, each above the one before:

1. the parser's **default**;
2. the env family's **presets** (``envs.family``): settings that runs measured to learn,
   for the family and for the game (``--no_presets`` leaves them out, so that the original's
   and the fork's command lines run exactly as their authors ran them);
3. a **file** given with ``--config FILE`` (TOML: the flags' names as keys, with ``_`` or
   ``-``; a switch is ``true`` or ``false``);
4. the **command line**, which always wins.

``--print_settings`` prints every value with its source and exits; ``meta.json`` records
the sources beside the flags.
"""

from __future__ import annotations

import argparse
import functools
import tomllib
from collections.abc import Mapping

from torchbeast.config.argparser import did_you_mean
from torchbeast.config.declared import add_declared_flags
from torchbeast.core.errors import shown
from torchbeast.envs.family import Preset, family_of
from torchbeast.envs.registry import EnvError

DEFAULT = "default"
COMMAND_LINE = "command line"


# A flags file is a few KB; reading stops past this, so that a device (/dev/zero) or a
# huge file is one line, not all of memory. A pipe (`--config <(...)`) is read as a file.
CONFIG_FILE_LIMIT = 1 << 20

# Flags about how the command line is read, which a config file cannot give.
COMMAND_LINE_ONLY = ("config", "print_settings", "help")


def flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's flags by destination (``learning_rate``), help left out."""
    return {
        action.dest: action
        for action in parser._actions
        if action.option_strings and action.dest != argparse.SUPPRESS
    }


def asks_for_help(argv: list[str]) -> bool:
    return any(
        token == "-h" or (token.startswith("--h") and "--help".startswith(token)) for token in argv
    )


def given_on_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    """The flags ``argv`` gives, parsed and checked as the parser does, without defaults."""
    actions = flag_actions(parser).values()
    saved = {action: action.default for action in actions}
    saved_parser_defaults = parser._defaults
    try:
        for action in actions:
            action.default = argparse.SUPPRESS
        parser._defaults = {}
        return vars(parser.parse_args(argv))
    finally:
        for action, default in saved.items():
            action.default = default
        parser._defaults = saved_parser_defaults


def file_value(action: argparse.Action, value: object) -> object:
    """``value`` from a config file as the flag's type makes it; ValueError if it cannot be."""
    if action.nargs == 0:  # a switch: store_true and the like
        if not isinstance(value, bool):
            raise ValueError("a switch takes true or false")
        return action.const if value else action.default
    if isinstance(value, (dict, list)):
        raise ValueError("a flag takes one value")
    if isinstance(value, bool):
        raise ValueError("takes a value, not true or false")
    convert = action.type or str
    try:
        converted = convert(str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
        raise ValueError(str(error) or f"invalid value {value!r}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{converted!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


@functools.cache
def declared_actions(options: type) -> dict[str, argparse.Action]:
    """The parser's actions of the flags ``options`` declares (an env family's), by name."""
    parser = argparse.ArgumentParser(add_help=False)
    add_declared_flags(parser, options, group="options")
    return flag_actions(parser)


def checked_options(options: type | None, values: Mapping[str, object]) -> dict[str, object]:
    """``values`` of the flags ``options`` declares (an env family's, as a peer's Hello
    says them), each checked and made the flag's type as a config file's value is
    (``file_value``: ``"x"`` is no --fuel_multiplier, 5 is 5.0); names it does not declare
    as they are. ValueError naming the flag and its value."""
    actions = declared_actions(options) if options is not None else {}
    checked = dict(values)
    for name, value in values.items():
        if name in actions:
            try:
                checked[name] = file_value(actions[name], value)
            except ValueError as error:
                raise ValueError(f"--{name} {shown(value, quote=False)}: {error}") from None
    return checked


def read_config_file(path: str, parser: argparse.ArgumentParser) -> dict:
    """The flag values in the TOML file at ``path``, checked as the command line's are;
    a wrong key or value stops the parse with one line naming the file and the fix."""
    try:
        with open(path, "rb") as f:
            raw = f.read(CONFIG_FILE_LIMIT + 1)
    except OSError as error:
        parser.error(f"--config {path}: cannot read it ({error.strerror or error})")
    if len(raw) > CONFIG_FILE_LIMIT:
        parser.error(
            f"--config {path}: over {CONFIG_FILE_LIMIT >> 20} MiB, so no flags file: "
            "give the TOML file of the run's flags"
        )
    try:
        # UTF-8, with the byte-order mark some editors write taken as it means.
        table = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        parser.error(f"--config {path}: not UTF-8 text (UTF-16?): save it as UTF-8")
    except tomllib.TOMLDecodeError as error:
        parser.error(f"--config {path}: not valid TOML ({error})")
    actions = flag_actions(parser)
    options = [f"--{dest}" for dest in actions]
    values, keys = {}, {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in COMMAND_LINE_ONLY:
            parser.error(
                f"--config {path}: {shown(key)} belongs on the command line, not in a file"
            )
        if name not in actions or isinstance(actions[name], argparse._HelpAction):
            near = did_you_mean(f"--{name}", options)
            parser.error(f"--config {path}: {shown(key)} is no flag of this command{near}")
        if name in keys:  # TOML refuses a key twice, not batch-size beside batch_size
            parser.error(
                f"--config {path}: {shown(keys[name])} and {shown(key)} both set --{name}: keep one"
            )
        keys[name] = key
        try:
            values[name] = file_value(actions[name], value)
        except ValueError as error:
            shown_value = (
                shown(value) if isinstance(value, str) else shown(repr(value), quote=False)
            )
            reason = shown(error, quote=False)
            parser.error(f"--config {path}: {key} = {shown_value}: {reason}")
    return values


def presets_for(
    env_id: object, view: Mapping[str, object], parser: argparse.ArgumentParser
) -> tuple[dict, dict[str, str]]:
    """The values of the env's presets this parser has flags for, and each one's source."""
    if not isinstance(env_id, str):
        return {}, {}
    try:
        presets: list[Preset] = family_of(env_id).presets(env_id, view)
    except EnvError:  # an unknown id: the run says so when it makes its envs
        return {}, {}
    actions = flag_actions(parser)
    values, sources = {}, {}
    for preset in presets:
        for name, value in preset.flags.items():
            if name in actions:
                check_preset_value(preset, name, value, actions[name], parser)
                values[name], sources[name] = value, f"preset {preset.scope}"
    return values, sources


def check_preset_value(
    preset: Preset, name: str, value: object, action: argparse.Action, parser
) -> None:
    """Refuses a preset's value its flag does not take, naming the preset: the parser
    would blame the flag (``argument --learning_rate: invalid ... value``), never given."""
    try:
        if isinstance(value, str) and action.type is not None:
            action.type(value)
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"not one of {', '.join(map(str, action.choices))}")
    except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
        parser.error(
            f"the preset {preset.scope} sets --{name} {value!r}, which it does not take "
            f"({error}): the env family's preset is wrong; --no_presets leaves presets out"
        )


def parse_in_layers(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Parses ``argv`` over the defaults, presets and config file; returns the flags and
    where each value came from."""
    if asks_for_help(argv):
        return parser.parse_args(argv), {}
    given = given_on_command_line(parser, argv)
    defaults = {dest: parser.get_default(dest) for dest in flag_actions(parser)}
    if given.get("config") == "":  # e.g. --config "$FILE" with $FILE unset
        parser.error("--config names no file (it is empty): give the file's path, or leave it out")
    config = given.get("config") or defaults.get("config")
    file_values = read_config_file(config, parser) if config else {}
    view = {**defaults, **file_values, **given}
    # Presets are for training: test and eval modes take the model from the checkpoint.
    training = view.get("mode", "train") == "train"
    if view.get("no_presets") or not training:
        preset_values, sources = {}, {}
    else:
        preset_values, sources = presets_for(view.get("env"), view, parser)
    layered = {**preset_values, **file_values}
    saved = {dest: parser.get_default(dest) for dest in layered}
    try:
        parser.set_defaults(**layered)
        flags = parser.parse_args(argv)
    finally:
        parser.set_defaults(**saved)
    if not training and "env" not in given and "env" not in file_values:
        flags.env = None  # the checkpoint's (evaluation.load_trained)
        sources["env"] = "checkpoint"
    for dest in vars(flags):
        if dest in given:
            sources[dest] = COMMAND_LINE
        elif dest in file_values:
            sources[dest] = f"file {config}"
        else:
            sources.setdefault(dest, DEFAULT)
    return flags, sources


def shown_value(name: str, value: object) -> str:
    """A flag's value as the settings table shows it: a secret's is hidden (the table is
    pasted into issues and kept in CI logs), but whether one was given shows."""
    from torchbeast.config.poly import HIDDEN, SECRET_FLAGS  # at the top: a circular import

    return HIDDEN if name in SECRET_FLAGS and value else repr(value)


def settings_table(flags: argparse.Namespace, sources: Mapping[str, str]) -> str:
    """Every flag's value and its source, one per line, as ``--print_settings`` shows."""
    rows = [
        (f"--{name}", shown_value(name, value), sources.get(name, DEFAULT))
        for name, value in sorted(vars(flags).items())
    ]
    width = max(len(name) for name, _, _ in rows)
    value_width = min(max(len(value) for _, value, _ in rows), 40)
    return "\n".join(
        f"{name:<{width}}  {value:<{value_width}}  {source}" for name, value, source in rows
    )

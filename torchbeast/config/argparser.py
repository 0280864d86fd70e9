"""The parser every command uses: errors in one line with the nearest flag, both
spellings of a flag (``--entropy-cost`` is ``--entropy_cost``), and a help text whose
defaults are said once."""

from __future__ import annotations

import argparse
import difflib
import sys


def did_you_mean(name: str, options: list[str]) -> str:
    """ " (did you mean X?)" for the option nearest to ``name``, or ""."""
    near = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to a flag's help unless its help already says its default, or
    the default is None, False or "" (no value, or a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, "") or "default" in text:
            return text
        return super()._get_help_string(action)


class FlagParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def _long_options(self) -> set[str]:
        return {
            option
            for action in self._actions
            for option in action.option_strings
            if option.startswith("--")
        }

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        options = self._long_options()
        spelled = []
        for token in args:
            name, equals, value = token.partition("=")
            if token.startswith("--") and name not in options:
                underscored = "--" + name[2:].replace("-", "_")
                if underscored in options:
                    token = underscored + equals + value
            spelled.append(token)
        return super().parse_known_args(spelled, namespace)

    def error(self, message: str):
        """One line: the problem, the nearest flag to an unknown one, and where to look."""
        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ").split()
            flags = [token.partition("=")[0] for token in unknown if token.startswith("-")]
            if flags:
                message += did_you_mean(flags[0], sorted(self._long_options()))
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

"""The base of every error a user can cause and fix: entry points print its message as
one line and exit with status 1, whatever part of the program raised it."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user must fix (a flag, a file, an address); the message says how."""

"""The base of every error a user can cause and fix: entry points print its message as
one line and exit with status 1, whatever part of the program raised it."""

from __future__ import annotations

import os


class UserError(Exception):
    """A problem the user must fix (a flag, a file, an address); the message says how."""


SHOWN_CHARS = 200  # the most of a string not ours that a log line or a message carries


def shown(text: object, limit: int = SHOWN_CHARS, quote: bool = True) -> str:
    """A string this program did not choose (a peer's, a file's), as a log line or an
    error message may carry it: quoted, unprintable characters escaped (``\\n``, ``\\x1b``:
    it cannot forge a log line), and at most ``limit`` characters of it, with its length
    said where it is cut (``'xxxx…' (1048576 chars)``). ``quote``: False for a text that
    needs no quotes (a value's repr)."""
    text = str(text)
    pieces, length = [], 0
    for char in text[:limit]:
        piece = char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        if length + len(piece) > limit:
            break
        pieces.append(piece)
        length += len(piece)
    mark = "'" if quote else ""
    if len(pieces) == len(text):
        return f"{mark}{''.join(pieces)}{mark}"
    return f"{mark}{''.join(pieces)}…{mark} ({len(text)} chars)"


class RunFolderError(UserError, OSError):
    """A file of the run's folder could not be written (a full disk, a folder gone)."""


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind ``error`` (itself, or what it was raised from or during)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def first_line(error: BaseException, otherwise: str | None = None) -> str:
    """The first line of ``error``'s message (a traceback-free reason for a one-line
    error); ``otherwise``, or the error's type's name, where the message is empty."""
    text = str(error).strip()
    if text:
        return text.splitlines()[0]
    return type(error).__name__ if otherwise is None else otherwise


def write_failure(error: BaseException) -> str:
    """Why a write failed, in the OS's words ("No space left on device"), also where torch
    wraps the OSError in an error of its own."""
    cause = os_error_in(error)
    if cause is not None and cause.strerror:
        return cause.strerror
    return shown(first_line(error, repr(error)))


def unwritable(path: str, flag: str) -> str | None:
    """Why the file ``path`` (given with ``flag``) could not be written, before minutes
    of work would end in the attempt; None where it can be."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{flag} {path} is a folder: give a file's path"
    if not os.path.isdir(folder):
        return f"{flag} {path}: no folder {folder}: create it, or give another path"
    if not os.access(folder, os.W_OK):
        return f"{flag} {path}: the folder {folder} cannot be written: give another path"
    return None


def os_error_line(error: OSError) -> str:
    """An OSError as one line that names the path and what to check."""
    if not error.filename:
        return str(error)
    return (
        f"{error.strerror or error}: {error.filename}. Check that path: --savedir (a study's "
        "savedir) must be a folder this user can write or create, and each file a flag "
        "names must exist"
    )

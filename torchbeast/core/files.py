"""Files written whole or not at all (no torch here: the tools and the study use it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller to write; once the block ends, it
    takes ``path``'s place. A crash, a Ctrl-C or a full disk midway leaves the file that
    was there, never half of the new one, and no temporary file; a reader sees the old
    file or the new one. Each process writes its own temporary file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def write_whole(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` whole or not at all (``replaced_whole``)."""
    with replaced_whole(path) as temporary:
        temporary.write_text(text)

"""Regenerates the manual's generated tables from the parsers and the registries:
``python -m torchbeast.docs`` (``make docs`` then builds the manual).

The first table holds the flags of every runtime; then each runtime in the registry with
flags of its own has its table (all in docs/flags.md); and the env families' presets have
theirs (docs/environments.md). Each table lies between its markers
(``config.reference.markers``) in exactly one page."""

from __future__ import annotations

import sys
from pathlib import Path

from torchbeast.config.reference import (
    markdown_reference,
    markers,
    replace_block,
    runtime_reference,
)
from torchbeast.envs.family import presets_table
from torchbeast.runtime.registry import RUNTIMES, function

SHARED_TABLE = "flags"
PAGES = ("README.md", "docs/*.md")  # where the tables may be, from the repository's root


def generated_tables() -> dict[str, str]:
    """Each generated table's name (its markers) -> its Markdown."""
    tables = {SHARED_TABLE: markdown_reference(), "presets": presets_table()}
    for runtime in RUNTIMES.values():
        if runtime.flags_table is not None:
            tables[f"{runtime.name}flags"] = function(runtime.flags_table)()
        elif runtime.settings is not None:
            tables[f"{runtime.name}flags"] = runtime_reference(runtime.name)
    return tables


def pages(root: str | Path = ".") -> list[Path]:
    """The README and the manual's pages."""
    root = Path(root)
    return sorted(path for pattern in PAGES for path in root.glob(pattern))


def page_of(table: str, root: str | Path = ".") -> Path:
    """The one page that holds ``table``'s markers."""
    begin, _ = markers(table)
    holding = [path for path in pages(root) if begin in path.read_text()]
    if len(holding) != 1:
        raise SystemExit(f"the {table} table must be in exactly one page, not {holding}")
    return holding[0]


def update_pages(root: str | Path = ".") -> None:
    """Writes every generated table into the page that holds its markers."""
    for table, body in generated_tables().items():
        path = page_of(table, root)
        path.write_text(replace_block(path.read_text(), table, body))


if __name__ == "__main__":
    update_pages(sys.argv[1] if len(sys.argv) > 1 else ".")

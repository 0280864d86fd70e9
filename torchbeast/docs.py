"""Regenerates the flag tables in README.md from the parsers: ``python -m torchbeast.docs``.

The first table holds the flags of every runtime; then each runtime in the registry with
flags of its own has its table; and the env families' presets have theirs."""

from __future__ import annotations

import sys

from torchbeast.config.reference import markdown_reference, replace_block, runtime_reference
from torchbeast.envs.family import presets_table
from torchbeast.runtime.registry import RUNTIMES, function

SHARED_TABLE = "flags"


def readme_tables() -> dict[str, str]:
    """Each generated table's name (its README markers) -> its Markdown."""
    tables = {SHARED_TABLE: markdown_reference(), "presets": presets_table()}
    for runtime in RUNTIMES.values():
        if runtime.flags_table is not None:
            tables[f"{runtime.name}flags"] = function(runtime.flags_table)()
        elif runtime.settings is not None:
            tables[f"{runtime.name}flags"] = runtime_reference(runtime.name)
    return tables


def update_readme(path: str) -> None:
    with open(path) as f:
        text = f.read()
    for table, body in readme_tables().items():
        text = replace_block(text, table, body)
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    update_readme(sys.argv[1] if len(sys.argv) > 1 else "README.md")

"""Regenerates the flag tables in README.md from the parsers: ``python -m torchbeast.docs``."""

from __future__ import annotations

import sys

from torchbeast import raybeast
from torchbeast.config import flags
from torchbeast.runtime.poly import trainer


def update_readme(path: str) -> None:
    flags.update_readme(path)
    with open(path) as f:
        text = f.read()
    text = flags.replace_block(
        text, trainer.README_BEGIN, trainer.README_END, trainer.markdown_reference()
    )
    text = flags.replace_block(
        text, raybeast.README_BEGIN, raybeast.README_END, raybeast.markdown_reference()
    )
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    update_readme(sys.argv[1] if len(sys.argv) > 1 else "README.md")

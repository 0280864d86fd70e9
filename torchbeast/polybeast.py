"""PolyBeast in one command: starts the env servers and the learner, stops both when done.

python -m torchbeast.polybeast --env PongNoFrameskip-v4
python -m torchbeast.polybeast --serve unix:/tmp/learner    # inverted: env clients dial in
"""

from __future__ import annotations

import sys

from torchbeast.entry import interrupt_quits

# Imported in main, not here: the env processes' fork server is a new interpreter, which
# imports this module first (as a spawned env process does, before it can guard itself
# against outliving this one: processes.guarded_main); torch would take seconds there.


def main(argv: list[str] | None = None) -> int:
    with interrupt_quits():
        from torchbeast.cli import run
        from torchbeast.config.parsers import make_poly_parser

        return run(make_poly_parser(), argv, "poly")


if __name__ == "__main__":
    sys.exit(main())

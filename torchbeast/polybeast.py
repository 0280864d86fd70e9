"""PolyBeast in one command: starts the env servers and the learner, stops both when done.

python -m torchbeast.polybeast --env PongNoFrameskip-v4
python -m torchbeast.polybeast --serve unix:/tmp/learner    # inverted: env clients dial in
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchbeast.config.settings import Settings

# Imported in the functions, not here: each env process is spawned, which re-imports this
# module before the process can guard itself against outliving this one
# (processes.guarded_main); torch would make that window seconds long.


def train(settings: Settings) -> dict:
    from torchbeast.runtime.poly import trainer

    return trainer.train(settings)


def main(argv: list[str] | None = None) -> int:
    from torchbeast.cli import run
    from torchbeast.runtime.poly import trainer

    parser = trainer.make_learner_parser("PolyBeast: env servers and learner in one command.")
    parser.set_defaults(env="PongNoFrameskip-v4")
    return run(parser, argv, "poly", train=train)


if __name__ == "__main__":
    sys.exit(main())

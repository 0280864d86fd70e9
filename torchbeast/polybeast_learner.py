"""PolyBeast learner: dials env servers (or serves env clients) and trains on what they send.

python -m torchbeast.polybeast_learner                              # dial unix:/tmp/polybeast.N
python -m torchbeast.polybeast_learner --serve unix:/tmp/learner    # inverted: clients dial in
"""

from __future__ import annotations

import sys

from torchbeast.cli import run
from torchbeast.runtime.poly import trainer


def main(argv: list[str] | None = None) -> int:
    parser = trainer.make_learner_parser(
        "PolyBeast learner: IMPALA with environments as gRPC peers."
    )
    return run(
        parser, argv, "poly", train=lambda settings: trainer.train(settings, start_envs=False)
    )


if __name__ == "__main__":
    sys.exit(main())

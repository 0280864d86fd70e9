"""MonoBeast: single-machine IMPALA with actor processes and shared memory.

python -m torchbeast.monobeast --env PongNoFrameskip-v4
python -m torchbeast.monobeast --env PongNoFrameskip-v4 --mode test --xpid example
"""

from __future__ import annotations

import sys

from torchbeast.cli import run
from torchbeast.config.flags import make_parser
from torchbeast.runtime import mono


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("MonoBeast: IMPALA on one machine, actors in processes.")
    return run(parser, argv, "mono", train=mono.train)


if __name__ == "__main__":
    sys.exit(main())

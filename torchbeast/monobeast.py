"""MonoBeast: single-machine IMPALA with actor processes and shared memory.

python -m torchbeast.monobeast --env PongNoFrameskip-v4
python -m torchbeast.monobeast --env PongNoFrameskip-v4 --mode test --xpid example
"""

from __future__ import annotations

import sys

from torchbeast.entry import interrupt_quits


def main(argv: list[str] | None = None) -> int:
    with interrupt_quits():  # around the imports: they take seconds
        from torchbeast.cli import run
        from torchbeast.config.parsers import make_mono_parser

        return run(make_mono_parser(), argv, "mono")


if __name__ == "__main__":
    sys.exit(main())

"""RayBeast: IMPALA with Ray actors, on this machine or on an existing Ray cluster.

python -m torchbeast.raybeast --env PongNoFrameskip-v4                # a local Ray, started here
python -m torchbeast.raybeast --ray_address auto --env PongNoFrameskip-v4   # a running cluster
"""

from __future__ import annotations

import sys

from torchbeast.entry import interrupt_quits


def main(argv: list[str] | None = None) -> int:
    with interrupt_quits():  # around the imports: they take seconds
        from torchbeast.cli import run
        from torchbeast.config.parsers import make_ray_parser

        return run(make_ray_parser(), argv, "ray")


if __name__ == "__main__":
    sys.exit(main())

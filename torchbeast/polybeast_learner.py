"""PolyBeast learner: dials env servers (or serves env clients) and trains on what they send.

python -m torchbeast.polybeast_learner                              # dial unix:/tmp/polybeast.N
python -m torchbeast.polybeast_learner --serve unix:/tmp/learner    # inverted: clients dial in
"""

from __future__ import annotations

import sys

from torchbeast.entry import interrupt_quits


def main(argv: list[str] | None = None) -> int:
    with interrupt_quits():  # around the imports: they take seconds
        from torchbeast.cli import run
        from torchbeast.config.parsers import make_learner_parser
        from torchbeast.runtime.registry import RUNTIMES

        poly = RUNTIMES["poly"]
        # The env processes are someone else's: this command starts none.
        return run(
            make_learner_parser(),
            argv,
            "poly",
            train=lambda settings: poly.train(settings, start_envs=False),
        )


if __name__ == "__main__":
    sys.exit(main())

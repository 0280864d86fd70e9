"""PolyBeast environments: env servers the learner dials, or env clients that dial it.

python -m torchbeast.polybeast_env --num_servers 10                 # serve unix:/tmp/polybeast.N
python -m torchbeast.polybeast_env --connect unix:/tmp/learner --num_servers 2 \
    --clients_per_process 8
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # Imported here: each env process is spawned, which re-imports this module before
    # the process can guard itself against outliving this one (processes.guarded_main).
    from torchbeast.config.parsers import make_env_parser
    from torchbeast.config.poly import addresses_of, check_addresses, poly_env_settings
    from torchbeast.envs import EnvError
    from torchbeast.runtime.poly.env_side import EnvProcessKilled, run_processes

    parser = make_env_parser()
    flags = parser.parse_args(argv)
    check_addresses(parser, addresses_of(flags))
    settings = poly_env_settings(flags)
    try:
        return run_processes(settings)
    except (EnvError, EnvProcessKilled) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

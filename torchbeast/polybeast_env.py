"""PolyBeast environments: env servers the learner dials, or env clients that dial it.

python -m torchbeast.polybeast_env --num_servers 10                 # serve unix:/tmp/polybeast.N
python -m torchbeast.polybeast_env --connect unix:/tmp/learner --num_servers 2 \
    --clients_per_process 8
"""

from __future__ import annotations

import sys

from torchbeast.entry import interrupt_quits, work_begins


def main(argv: list[str] | None = None) -> int:
    with interrupt_quits():
        return serve_or_connect(argv)


def serve_or_connect(argv: list[str] | None) -> int:
    # Imported here: an env process spawned (where no fork server can start) re-imports
    # this module before it can guard itself against outliving this one
    # (processes.guarded_main).
    from torchbeast.config.parsers import make_env_parser
    from torchbeast.config.poly import addresses_of, check_addresses, poly_env_settings
    from torchbeast.envs import EnvError
    from torchbeast.runtime.poly.env_side import EnvProcessKilled, run_processes

    parser = make_env_parser()
    flags = parser.parse_args(argv)
    check_addresses(parser, addresses_of(flags))
    check_mode_flags(parser, flags)
    settings = poly_env_settings(flags)
    work_begins()
    try:
        return run_processes(settings)
    except (EnvError, EnvProcessKilled) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


# The flags of one mode, which the other would ignore without a word.
CLIENT_FLAGS = ("clients_per_process", "client_steps")  # inverted mode's (--connect)
SERVER_FLAGS = ("max_streams",)  # classic mode's


def check_mode_flags(parser, flags) -> None:
    """Refuses a flag of the mode ``flags`` do not run in (one line, exit code 2)."""
    given = CLIENT_FLAGS if flags.connect is None else SERVER_FLAGS
    for name in given:
        if getattr(flags, name) != parser.get_default(name):
            if flags.connect is None:
                parser.error(
                    f"--{name} is for env clients that dial a learner (--connect ADDRESS); "
                    "env servers serve each stream the learner dials: give --connect, or "
                    f"leave --{name} out"
                )
            parser.error(
                f"--{name} is for env servers; with --connect these are env clients: "
                f"leave --{name} out"
            )


if __name__ == "__main__":
    sys.exit(main())

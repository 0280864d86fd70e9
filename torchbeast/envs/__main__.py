"""Lists the environment ids torchbeast can train, by family:
``python -m torchbeast.envs [FILTER] [--all]``."""

from __future__ import annotations

import sys

import gymnasium as gym

from torchbeast.config.argparser import FlagParser
from torchbeast.envs.family import families
from torchbeast.envs.registry import _register_optional_envs


def make_parser() -> FlagParser:
    parser = FlagParser(
        prog="python -m torchbeast.envs",
        description="Lists the environment ids torchbeast can train (--env), by family.",
    )
    parser.add_argument("filter", nargs="?", default="", help="Only ids containing this.")
    parser.add_argument(
        "--all", action="store_true", help="Also the ids it cannot train, with the reason."
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    candidates = families()
    _register_optional_envs()
    by_family: dict[str, list[str]] = {family.name: [] for family in candidates}
    for env_id in sorted(gym.registry):
        if args.filter.lower() not in env_id.lower():
            continue
        spec = gym.registry[env_id]
        family = next(family for family in candidates if family.takes(env_id, spec))
        problem = family.cannot_train(env_id)
        if problem is None:
            by_family[family.name].append(env_id)
        elif args.all:
            by_family[family.name].append(f"{env_id}  (cannot train: {problem})")
    for family in candidates:
        ids = by_family[family.name]
        if ids:
            print(f"{family.name}: {family.summary} ({len(ids)})")
            print("".join(f"  {env_id}\n" for env_id in ids), end="")
    if args.filter and not any(by_family.values()):
        hidden = "" if args.all else " (--all also lists those it cannot train)"
        print(f"error: no environment id contains {args.filter!r}{hidden}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

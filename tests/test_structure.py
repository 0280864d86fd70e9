"""The shape the design asks of the package, checked on its source: no import circles,
a torch-free edge, and generic layers that reach env families only through their registry."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from tests import warm_start
from torchbeast.core.settings import flag

PACKAGE = Path(__file__).resolve().parent.parent / "torchbeast"
FAMILY_MODULES = {"torchbeast.envs.atari", "torchbeast.envs.minatar", "torchbeast.envs.cue",
                  "torchbeast.envs.riverraid"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    }


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports at module level, TYPE_CHECKING included
    (a circle of type hints is still a circle of meaning); a function's own imports aside."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for child in ast.walk(node):
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                names = {f"{child.module}.{alias.name}" for alias in child.names}
                submodules = names & known.keys()
                found.update(submodules or {child.module})
    return {name for name in found if name in known}


def test_no_module_of_the_package_imports_itself_in_a_circle():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    circles = []

    def visit(name: str, trail: list[str], done: set[str]) -> None:
        for target in graph[name]:
            if target in trail:
                circles.append(trail[trail.index(target) :] + [target])
            elif target not in done:
                visit(target, [*trail, target], done)
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name], done)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_generic_layers_reach_env_families_only_through_the_registry():
    known = modules()
    for name, path in known.items():
        if name.startswith("torchbeast.envs"):
            continue
        reached = imports(path, known) & FAMILY_MODULES
        assert not reached, f"{name} imports {sorted(reached)}: go through envs.family"


def test_the_edge_builds_settings_without_torch():
    code = (
        "import sys; import torchbeast.config.settings, torchbeast.config.flags, "
        "torchbeast.config.parsers; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("entry", ["monobeast", "polybeast", "polybeast_learner", "raybeast"])
@pytest.mark.parametrize("argv", [["--help"], ["--lerning_rate", "0.1"]], ids=["help", "typo"])
def test_help_and_a_mistyped_flag_are_answered_without_loading_torch(entry, argv):
    # Importing PyTorch costs about a second; a user who asks for help should not wait for it.
    code = (
        f"import sys, torchbeast.{entry} as entry\n"
        f"try:\n    entry.main({argv!r})\nexcept SystemExit as stop:\n"
        "    print('exit', stop.code, 'torch' in sys.modules, file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    exit_code = 0 if argv == ["--help"] else 2
    assert result.stderr.strip().splitlines()[-1] == f"exit {exit_code} False", result.stderr


def test_every_runtimes_pool_is_a_pool():
    from torchbeast.runtime.mono import ActorPool
    from torchbeast.runtime.poly.learner_end import PolyActorPool
    from torchbeast.runtime.pool import Pool
    from torchbeast.runtime.ray.actor_pool import RayActorPool

    assert all(issubclass(pool, Pool) for pool in (ActorPool, PolyActorPool, RayActorPool))


# A runtime of the test's own: its flags and settings, and one registry entry.


@dataclasses.dataclass(frozen=True)
class FakeSettings:
    flags_group: ClassVar[str] = "FakeBeast"

    fake_workers: int = flag(3, "Workers.", check="positive")


def test_a_new_runtime_is_its_functions_and_one_registry_entry(monkeypatch):
    from torchbeast import docs, learncheck
    from torchbeast.config.flags import parse_flags
    from torchbeast.config.parsers import make_bench_parser, make_runtime_parser
    from torchbeast.config.settings import build_settings
    from torchbeast.runtime import registry

    fake = registry.Runtime(
        "fake", "FakeBeast", "tests.test_structure", "FakeBeast: a test's runtime.",
        entry_point="tests.fakebeast", settings="tests.test_structure:FakeSettings",
    )  # fmt: skip
    monkeypatch.setitem(registry.RUNTIMES, "fake", fake)
    parser = make_runtime_parser("fake")
    flags = parse_flags(["--fake_workers", "5", "--xpid", "x"], parser)
    assert build_settings(flags, "fake").runtime == FakeSettings(fake_workers=5)
    assert "FakeBeast, besides" in docs.generated_tables()["fakeflags"]
    assert "`--fake_workers`" in docs.generated_tables()["fakeflags"]
    bench = make_bench_parser(list(registry.RUNTIMES))
    with pytest.raises(SystemExit):  # another runtime's own flag is refused
        parse_flags(["--runtime", "mono", "--fake_workers", "4"], bench)
    assert parse_flags(["--runtime", "fake", "--fake_workers", "4"], bench).fake_workers == 4
    # The learning checks run it by its entry point.
    command = learncheck.CHECKS["cartpole"].command("runs", "x", runtime="fake")
    assert command[1:3] == ["-m", "tests.fakebeast"]


@pytest.mark.parametrize("tool", ["lightlog", "scaling", "learncheck", "study", "study_plot"])
def test_every_tools_usage_error_is_one_line(tool):
    # Not argparse's usage block and error: one line, the problem and where to look.
    result = warm_start.run(
        [sys.executable, "-m", f"torchbeast.{tool}", "--no_such_flag"],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "--help" in lines[0], lines

"""The README and the manual (docs/*.md, built with MkDocs): the manual builds without a
warning (a broken link or anchor fails it), every link of the README reaches a file and
its heading, and every command either shows parses with the flags it uses."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from torchbeast import learncheck, lightlog, plot, scaling, study, study_plot
from torchbeast.config.flags import parse_flags, parse_flags_and_sources
from torchbeast.config.parsers import (
    make_bench_parser,
    make_env_parser,
    make_learner_parser,
    make_mono_parser,
    make_poly_parser,
    make_ray_parser,
)
from torchbeast.config.poly import poly_env_settings
from torchbeast.envs.__main__ import make_parser as make_envs_parser
from torchbeast.runtime.registry import RUNTIMES

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_manual_builds_without_a_warning(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stdout + built.stderr
    assert (tmp_path / "index.html").exists() and (tmp_path / "results" / "index.html").exists()


def slug(heading: str) -> str:
    """A heading's anchor, as MkDocs and GitHub make it: "The recipe's speed, and how"
    -> "the-recipes-speed-and-how"."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def test_every_link_of_the_readme_reaches_a_file_and_its_heading():
    readme = REPO / "README.md"
    links = re.findall(r"\]\(([^)\s]+)\)", readme.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) > 20
    for link in local:
        path, _, anchor = link.partition("#")
        target = readme.parent / path if path else readme
        assert target.exists(), f"README.md links to {link}, which does not exist"
        if anchor:
            assert anchor in anchors(target), f"README.md links to {link}: no such heading"


# --------------------------------------------------------------------------- commands


def shown_commands(page: Path) -> tuple[list[str], dict[str, str]]:
    """The ``python -m torchbeast.*`` and ``make`` commands a page shows, in its code
    blocks (continuation lines joined, comments cut) and in its inline code; and the
    files its blocks write for them (``cat > run.toml <<'TOML' ... TOML``)."""
    text = page.read_text()
    commands, files = [], {}
    for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, flags=re.S):
        for name, _marker, body in re.findall(r"cat > (\S+) <<'(\w+)'\n(.*?)\n\2\n", block, re.S):
            files[name] = body + "\n"
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(("python -m torchbeast", "make ")):
                commands.append(line)
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        span = " ".join(span.split())
        template = any(mark in span for mark in ("...", "[", "<"))  # a form, not a command
        if span.startswith("python -m torchbeast.") and not template:
            if len(span.split()) > 3:  # with no argument, it names the tool
                commands.append(span)
    return commands, files


def training_parse(parser_of):
    return lambda argv: parse_flags_and_sources(argv, parser_of())


PARSERS = {
    "torchbeast.monobeast": training_parse(make_mono_parser),
    "torchbeast.polybeast": training_parse(make_poly_parser),
    "torchbeast.polybeast_learner": training_parse(make_learner_parser),
    "torchbeast.polybeast_env": lambda argv: poly_env_settings(make_env_parser().parse_args(argv)),
    "torchbeast.raybeast": training_parse(make_ray_parser),
    "torchbeast.bench": lambda argv: parse_flags(argv, make_bench_parser(list(RUNTIMES))),
    "torchbeast.plot": lambda argv: plot._parser().parse_args(argv),
    "torchbeast.lightlog": lambda argv: lightlog.make_parser().parse_args(argv),
    "torchbeast.learncheck": lambda argv: learncheck.make_parser().parse_known_args(argv),
    "torchbeast.scaling": lambda argv: scaling.make_parser().parse_known_args(argv),
    "torchbeast.envs": lambda argv: make_envs_parser().parse_args(argv),
    "torchbeast.study": lambda argv: study.make_parser().parse_args(argv),
    "torchbeast.study_plot": lambda argv: study_plot.make_parser().parse_args(argv),
    "torchbeast.docs": lambda argv: None,
}
MAKE_TARGETS = {"install", "train", "test", "learn", "bench", "lint", "format", "docs"}


def as_argv(command: str) -> list[str]:
    """A shown command as words, its shell variables ($FUEL) given a value."""
    return shlex.split(re.sub(r"\$\{?\w+\}?", "1", command))


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_command_a_page_shows_parses_with_the_flags_it_uses(
    page, capsys, tmp_path, monkeypatch
):
    commands, files = shown_commands(page)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)  # where the page's blocks wrote their files
    for command in commands:
        words = as_argv(command)
        if words[0] == "make":
            assert words[1] in MAKE_TARGETS, f"{page.name}: {command}: no such make target"
            args = next((w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")), "")
            if words[1] == "train":
                PARSERS["torchbeast.monobeast"](shlex.split(args))
            continue
        module = words[2]
        assert module in PARSERS, f"{page.name}: {command}: no such entry point"
        try:
            PARSERS[module](words[3:])
        except SystemExit as error:
            if error.code == 0:  # --print_settings prints them and exits
                continue
            message = capsys.readouterr().err.strip().splitlines()[-1:]
            pytest.fail(f"{page.name}: `{command}` does not parse: {message} ({error})")

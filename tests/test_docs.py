"""The user docs against the code: every relative link and ``#anchor`` of README.md,
bench/README.md and docs/*.md resolves, and every ``stitchrec`` command line in their shell
blocks names subcommands and long flags that ``stitchrec``'s parser has."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
SHELL = ("", "sh", "bash", "console", "shell")
SHIPPED = ("configs/", "features/schemas/")  # folders of files the checkout ships


def slugs(text: str) -> set[str]:
    """GitHub's anchors of the headings of ``text`` (``-1``, ``-2``, ... for repeats)."""
    text = FENCE.sub("", text)
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    """``file:line target`` of each relative link of ``doc`` whose file or anchor is missing."""
    text = doc.read_text()
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    for m in LINK.finditer(prose):
        target, _, anchor = m.group(1).partition("#")
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path = (doc.parent / target).resolve() if target else doc
        line = prose.count("\n", 0, m.start()) + 1
        if not path.exists():
            out.append(f"{doc.name}:{line} {m.group(1)} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in slugs(path.read_text()):
            out.append(f"{doc.name}:{line} {m.group(1)} (no such heading)")
    return out


def command_lines(doc: Path) -> list[tuple[int, str]]:
    """``(line, command)`` of each logical line (``\\`` continuations joined) of the shell
    blocks of ``doc``; ``line`` is its first line."""
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1).strip() not in SHELL:
            continue
        line = text.count("\n", 0, m.start(2)) + 1
        pending: tuple[int, str] | None = None
        for offset, raw in enumerate(m.group(2).splitlines()):
            start, prefix = pending or (line + offset, "")
            if raw.rstrip().endswith("\\"):
                pending = (start, prefix + raw.rstrip()[:-1])
            else:
                pending = None
                out.append((start, prefix + raw))
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def unknown_flags(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """The long flags of each ``stitchrec`` call in ``command`` that its subcommand's parser
    lacks, ``COMMAND?`` for a subcommand it does not have, and the files it names under
    ``SHIPPED`` folders that do not exist."""
    out = []
    for part in re.split(r"&&|\|\||;|\|", command):
        try:
            tokens = shlex.split(part, comments=True)
        except ValueError:
            continue
        words = [t for t in tokens if not re.match(r"\w+=", t)]  # VAR=value prefixes
        words = words[1:] if words[:1] == ["$"] else words  # a shown prompt
        if not words or not (words[0] == "stitchrec" or words[0].endswith("/stitchrec")):
            continue
        current, i = parser, 1
        while i < len(words) and _subparsers(current):
            choices = _subparsers(current)
            if words[i] not in choices:
                if not words[i].startswith("-"):
                    out.append(f"{words[i]}?")
                    current = None
                break
            current, i = choices[words[i]], i + 1
        if current is None:
            continue
        for token in words[i:]:
            flag = token.split("=")[0]
            if flag.startswith("--") and flag not in current._option_string_actions:
                out.append(flag)
            if token.startswith(SHIPPED) and not (ROOT / token).exists():
                out.append(f"{token} (no such file)")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc: Path):
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stitchrec_command_uses_flags_its_parser_has(doc: Path):
    parser = build_parser()
    wrong = [
        f"{doc.relative_to(ROOT)}:{line} {flags}"
        for line, command in command_lines(doc)
        if (flags := unknown_flags(command, parser))
    ]
    assert wrong == []


def test_the_checks_catch_a_stale_flag_a_missing_subcommand_and_a_broken_anchor(tmp_path: Path):
    parser = build_parser()
    assert unknown_flags("stitchrec train --config c.toml --epochz 3", parser) == ["--epochz"]
    assert unknown_flags(".venv/bin/stitchrec trian --config c.toml", parser) == ["trian?"]
    assert unknown_flags("stitchrec crosses fives --help | head  # --not-a-flag", parser) == []
    assert unknown_flags("stitchrec train --config configs/nope.toml", parser) == [
        "configs/nope.toml (no such file)"
    ]
    assert unknown_flags("$ X=1 stitchrec fuse explain r --batch 8 --floor-call 9", parser) == [
        "--floor-call"
    ]
    doc = tmp_path / "a.md"
    doc.write_text("# A title\n\n[ok](#a-title) [bad](#b-title) [gone](b.md)\n")
    assert broken_links(doc) == ["a.md:3 #b-title (no such heading)", "a.md:3 b.md (no such file)"]
    doc.write_text("text\n\n```sh\nstitchrec export \\\n  --run r --keep 2\n```\n")
    assert command_lines(doc) == [(4, "stitchrec export   --run r --keep 2")]

"""The user docs against the code: every relative link and ``#anchor`` of README.md,
bench/README.md and docs/*.md resolves, every ``stitchrec`` command line in their shell
blocks names subcommands and long flags that ``stitchrec``'s parser has, and every ``python``
block parses, imports names that exist, calls only names it imports or binds, and calls the
functions and classes it imports from StitchRec with arguments their signatures take (the
blocks' modules are imported; the blocks themselves are only parsed)."""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import inspect
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
PROJECT = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}  # our packages


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


def python_blocks(doc: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ``python`` block of ``doc``; ``line`` is its first line."""
    text = doc.read_text()
    return [
        (text.count("\n", 0, m.start(2)) + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1).strip() in ("python", "py")
    ]


MISSING = object()


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _imported(module: str, name: str) -> object:
    """What ``from module import name`` gives: the attribute, else the submodule; MISSING
    where there is neither."""
    found = getattr(importlib.import_module(module), name, MISSING)
    if found is MISSING and _module_exists(f"{module}.{name}"):
        found = importlib.import_module(f"{module}.{name}")
    return found


def _our_signature(obj: object) -> inspect.Signature | None:
    """The call signature of a StitchRec function or class; None for anything else."""
    if not callable(obj) or (getattr(obj, "__module__", None) or "").split(".")[0] not in PROJECT:
        return None
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _call_problem(call: ast.Call, sig: inspect.Signature) -> str | None:
    """Why ``call`` does not fit ``sig`` (a wrong count, a name it has not), else None."""
    starred = any(isinstance(x, ast.Starred) for x in call.args)
    spread = any(k.arg is None for k in call.keywords)
    if not starred and not spread:
        try:
            sig.bind(*call.args, **{k.arg: k.value for k in call.keywords})
        except TypeError as e:
            return str(e)
        return None
    kinds = {p.kind for p in sig.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        named = {n for n, p in sig.parameters.items() if p.kind != p.POSITIONAL_ONLY}
        unknown = [k.arg for k in call.keywords if k.arg is not None and k.arg not in named]
        if unknown:
            return f"no parameter {unknown}"
    return None


def python_block_problems(code: str) -> list[str]:
    """What is wrong with one ``python`` block: it does not parse; it imports a module or a
    name that does not exist; it calls a name it neither imports nor binds (nor a builtin); it
    calls a StitchRec function or class with arguments its signature does not take."""
    try:  # a block may ``await`` at top level, as in an async function's body
        tree = compile(code, "<doc>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        return [f"line {e.lineno}: does not parse: {e.msg}"]
    out, imported, bound = [], {}, set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not _module_exists(a.name):
                    out.append(f"line {node.lineno}: no module {a.name}")
                bound.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if not _module_exists(node.module or ""):
                out.append(f"line {node.lineno}: no module {node.module}")
                continue
            for a in node.names:
                found = _imported(node.module, a.name)
                if found is MISSING:
                    out.append(f"line {node.lineno}: {node.module} has no {a.name}")
                imported[a.asname or a.name] = found
                bound.add(a.asname or a.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name = node.func.id
        if name not in bound:
            out.append(f"line {node.lineno}: calls {name}, which the block does not import")
        elif (sig := _our_signature(imported.get(name))) and (problem := _call_problem(node, sig)):
            out.append(f"line {node.lineno}: {name}(...): {problem}")
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


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_imports_and_calls_what_the_code_has(doc: Path):
    wrong = [
        f"{doc.relative_to(ROOT)}:{line} {problem}"
        for line, code in python_blocks(doc)
        for problem in python_block_problems(code)
    ]
    assert wrong == []


def test_the_python_check_catches_a_missing_name_a_bad_call_and_a_missing_import():
    ok = (
        "from serving.client import RankingClient\n"
        "from pipelines.export import export_ensemble\n"
        "import tensorflow as tf\n"
        "c = RankingClient('h:1', token=None)\n"
        "export_ensemble(run, [c], combine='logits', **more)\n"
        "server = await f(tf.constant(1))\n"
        "def f(x):\n    return len(x)\n"
    )
    assert python_block_problems(ok) == []
    assert python_block_problems("from serving.client import RankClient") == [
        "line 1: serving.client has no RankClient"
    ]
    assert python_block_problems("import serving.clients\nfrom nope import x") == [
        "line 1: no module serving.clients",
        "line 2: no module nope",
    ]
    assert python_block_problems("from serving.client import RankingClient\nRankingClient()") == [
        "line 2: RankingClient(...): missing a required argument: 'target'"
    ]
    bad_keyword = "from pipelines.export import export_ensemble\nexport_ensemble(r, c, mode=1)"
    assert python_block_problems(bad_keyword) == [
        "line 2: export_ensemble(...): got an unexpected keyword argument 'mode'"
    ]
    assert python_block_problems("opt = make_optimizer('adam', 0.1)") == [
        "line 1: calls make_optimizer, which the block does not import"
    ]
    assert python_block_problems("f(a=1, ..., b=2)") == [
        "line 1: does not parse: positional argument follows keyword argument"
    ]


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

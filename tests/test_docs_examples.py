"""Every python code block of the documentation runs, page by page, in a fresh namespace.

A page's ``.. code-block:: python`` blocks run in order in one namespace (a later block
uses the names an earlier one defined), in-process, with the session's local Spark
running, inside a temporary working directory.  A failing block fails its page's test,
naming the page and the block's line.  Blocks in another language (``bash``,
``console``, ``text``) are shown, not run; a literal block with no language (``::``) is
refused, so that no python example can skip the run unnoticed.
"""
from __future__ import annotations

import os
import re
import time
import traceback
from dataclasses import dataclass

import pytest

DOCS = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))

#: languages shown and not run
SHOWN = {"bash", "console", "text", "none", "json", "ini", "java"}
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\. (?:code-block|code|sourcecode)::\s*(?P<lang>\S*)\s*$")
_ANY_DIRECTIVE = re.compile(r"^\s*\.\. ")


@dataclass(frozen=True)
class Block:
    """One code block of a page: its language, the 1-based line of its directive, its code."""

    page: str
    line: int
    lang: str
    code: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_blocks(path: str) -> tuple[list[Block], list[int]]:
    """The code blocks of the ``.rst`` file ``path``, and the lines of its bare ``::`` literal blocks."""
    page = os.path.relpath(path, DOCS)
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    blocks: list[Block] = []
    bare: list[int] = []
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if m is None:
            text = lines[i].rstrip()
            if text.endswith("::") and not _ANY_DIRECTIVE.match(text):
                bare.append(i + 1)
            i += 1
            continue
        start, base = i, len(m.group("indent"))
        i += 1
        while i < len(lines) and lines[i].strip().startswith(":") and _indent(lines[i]) > base:
            i += 1                                         # the directive's options
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        cut = min((_indent(ln) for ln in body if ln.strip()), default=0)
        code = "\n".join(ln[cut:] for ln in body)
        blocks.append(Block(page, start + 1, m.group("lang") or "", code))
    return blocks, bare


def pages() -> list[str]:
    """Every ``.rst`` page under docs/, relative to it, sorted."""
    found = []
    for root, dirs, files in os.walk(DOCS):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found += [os.path.relpath(os.path.join(root, f), DOCS) for f in files if f.endswith(".rst")]
    return sorted(found)


PAGES = pages()


def test_every_block_names_a_language_that_runs_or_is_shown():
    problems = []
    n_python = 0
    for page in PAGES:
        blocks, bare = parse_blocks(os.path.join(DOCS, page))
        problems += [f"{page}:{line}: a literal block with no language (use .. code-block:: LANG)" for line in bare]
        for b in blocks:
            if b.lang == "python":
                n_python += 1
            elif b.lang not in SHOWN:
                problems.append(f"{page}:{b.line}: code-block language {b.lang!r} is neither run (python) "
                                f"nor shown ({', '.join(sorted(SHOWN))})")
    assert not problems, "\n".join(problems)
    assert n_python >= 30, f"only {n_python} python blocks found under {DOCS}: is the parser broken?"


def test_parser_finds_blocks_in_order_and_bare_literals(tmp_path):
    page = tmp_path / "page.rst"
    page.write_text("Title\n=====\n\n.. code-block:: python\n   :caption: one\n\n   x = 1\n\n   y = x + 1\n\n"
                    "Text::\n\n    shown, not run\n\n  .. code-block:: bash\n\n     ls\n\nEnd.\n", encoding="utf-8")
    blocks, bare = parse_blocks(str(page))
    assert [(b.line, b.lang, b.code) for b in blocks] == [(4, "python", "x = 1\n\ny = x + 1"), (15, "bash", "ls")]
    assert bare == [11]


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang == "python"
                                                          for b in parse_blocks(os.path.join(DOCS, p))[0])])
def test_page_examples_run(page, spark, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    if page == "guides/connect.rst":  # its examples are a Connect server's client
        monkeypatch.setenv("SPARK_CONNECT_URL", request.getfixturevalue("connect_server").url)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    blocks = [b for b in parse_blocks(os.path.join(DOCS, page))[0] if b.lang == "python"]
    namespace: dict = {"__name__": "__docs__"}
    environ = dict(os.environ)
    t0 = time.perf_counter()
    try:
        for b in blocks:
            try:
                exec(compile(b.code, f"docs/{page}:{b.line}", "exec"), namespace)
            except Exception:
                pytest.fail(f"docs/{page}, the code block at line {b.line} failed:\n{traceback.format_exc()}",
                            pytrace=False)
    finally:                                   # what a page sets in the environment stays on that page
        os.environ.clear()
        os.environ.update(environ)
    print(f"{page}: {len(blocks)} blocks in {time.perf_counter() - t0:.1f} s")

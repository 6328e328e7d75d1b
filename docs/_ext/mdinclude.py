"""``.. markdown-include:: PATH``: a Markdown file's text as reStructuredText, at build time.

The benchmark figures live in ``benchmarks/README.md``, next to the scripts that make them;
this directive puts that file into the documentation without a copy that could go stale.
It understands the Markdown the file uses: ``#`` headings (the first, the file's title, is
dropped; ``##`` and ``###`` become section levels of the including page), pipe tables,
``-`` bullets with indented continuation lines, paragraphs, and inline code, bold and
italics.
"""
from __future__ import annotations

import os
import re

from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList

_LEVELS = {2: "-", 3: "~", 4: "^"}
_INLINE = re.compile(r"(`[^`]+`|\*\*[^*]+\*\*|(?<![\w*])\*[^*\s][^*]*(?<!\s)\*(?![\w*]))")


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("|", "\\|").replace("*", "\\*").replace("`", "\\`")


def inline(text: str) -> str:
    """Markdown inline code, bold and italics as reStructuredText (everything else escaped)."""
    out: list[str] = []
    pos = 0
    for m in _INLINE.finditer(text):
        out.append(_escape(text[pos:m.start()]))
        tok = m.group(0)
        if tok.startswith("`"):
            body = tok[1:-1]
            rst = f"``{body}``" if not body.startswith(" ") and not body.endswith(" ") else f"``{body.strip()}``"
        elif tok.startswith("**"):
            rst = f"**{tok[2:-2]}**"
        else:
            rst = f"*{tok[1:-1]}*"
        before = text[m.start() - 1] if m.start() > 0 else " "
        after = text[m.end()] if m.end() < len(text) else " "
        if not (before.isspace() or before in "([{'\"/-:"):
            rst = "\\ " + rst
        if not (after.isspace() or after in ".,;:!?)]}'\"/-"):
            rst = rst + "\\ "
        out.append(rst)
        pos = m.end()
    out.append(_escape(text[pos:]))
    return "".join(out)


def _cells(row: str) -> list[str]:
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|"):
        row = row[:-1]
    return [c.strip() for c in row.split("|")]


def convert(md: str) -> list[str]:
    """The reStructuredText lines of the Markdown text ``md``."""
    lines = md.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        head = re.match(r"^(#+)\s+(.*)$", line)
        if head:
            level = len(head.group(1))
            if level > 1:
                title = inline(head.group(2).strip())
                out += ["", title, _LEVELS.get(level, "^") * max(len(title), 4), ""]
            i += 1
            continue
        if line.lstrip().startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(lines[i])
                i += 1
            header, body = _cells(rows[0]), [r for r in rows[1:] if not re.match(r"^\s*\|[\s:|-]+\|\s*$", r)]
            out += ["", ".. list-table::", "   :header-rows: 1", ""]
            for cells in [header] + [_cells(r) for r in body]:
                cells = (cells + [""] * len(header))[:len(header)]
                for k, cell in enumerate(cells):
                    text = inline(cell)
                    out.append(f"   {'* -' if k == 0 else '  -'} {text}".rstrip())
            out.append("")
            continue
        prev = lines[i - 1] if i > 0 else ""
        in_list = prev.startswith("- ") or (prev.startswith("  ") and bool(out) and out[-1] != "")
        if line.startswith("- ") and prev.strip() and not in_list:
            out.append("")                       # a list right after a paragraph
        elif line.strip() and not line.startswith(("- ", " ")) and in_list:
            out.append("")                       # a paragraph right after a list
        if re.match(r"^\s*\(?[0-9a-z]\)\s", line) and (not out or out[-1] == ""):
            line = "\\" + line.lstrip()          # "(a) ..." starting a paragraph is not a list
        out.append(inline(line) if line.strip() else "")
        i += 1
    return out


class MarkdownInclude(Directive):
    """Parse the Markdown file named by the argument (relative to the page) as part of the page."""

    required_arguments = 1
    has_content = False
    option_spec = {"encoding": directives.encoding}

    def run(self) -> list:
        env = self.state.document.settings.env
        rel, path = env.relfn2path(self.arguments[0])
        env.note_dependency(rel)
        with open(path, encoding="utf-8") as fh:
            rst = convert(fh.read())
        self.state_machine.insert_input(StringList(rst, source=os.path.abspath(path)), os.path.abspath(path))
        return []


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's extension hook
    app.add_directive("markdown-include", MarkdownInclude)
    return {"parallel_read_safe": True, "version": "1"}

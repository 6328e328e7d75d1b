"""The habits that keep the code readable, checked on every test run.

- ``ruff`` (pyflakes, pycodestyle, import order, bugbear) on the package, tests, benchmarks
  and examples, and ``mypy`` on ``src/sparknet``: both clean, with the settings in
  ``pyproject.toml``.
- No source file of the package over 600 lines: a longer one is doing several jobs.
- Test-only machinery (``sparknet.cluster.testing``) is imported by no production module.

Both tools are in the ``test`` extras; a missing one fails here, saying how to install it.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PACKAGE = os.path.join(ROOT, "src", "sparknet")
MAX_LINES = 600


def _tool(module: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; install the test extras: python -m pip install '.[test]'")
    return [sys.executable, "-m", module]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _sources(exts: tuple[str, ...]) -> list[str]:
    out = []
    for base, _, files in os.walk(PACKAGE):
        out += [os.path.join(base, f) for f in files if f.endswith(exts)]
    return sorted(out)


def test_ruff_is_clean():
    res = _run(_tool("ruff") + ["check", "src", "tests", "benchmarks", "examples"])
    assert res.returncode == 0, f"ruff found problems:\n{res.stdout}{res.stderr}"


def test_mypy_is_clean():
    # mypy's cache outside the checkout: a fresh clone then re-checks only what changed (the
    # cache keeps each module's source hash, so a stale entry is re-checked, never trusted)
    cache = os.environ.get("MYPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sparknet-mypy")
    res = _run(_tool("mypy") + ["--cache-dir", cache])
    assert res.returncode == 0, f"mypy found problems:\n{res.stdout}{res.stderr}"


def test_no_package_file_over_600_lines():
    long = []
    for path in _sources((".py", ".pyx", ".pxd")):
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, "files doing several jobs (split them along their seams):\n" + "\n".join(long)


def test_production_code_does_not_import_test_machinery():
    offenders = []
    for path in _sources((".py",)):
        if os.path.basename(path) == "testing.py":
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "sparknet.cluster.testing" or n.endswith(".testing") and "sparknet" in n
                   for n in names):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not offenders, "production modules import sparknet.cluster.testing:\n" + "\n".join(offenders)

"""The habits that keep the code readable, checked on every test run.

- ``ruff`` (pyflakes, pycodestyle, import order, bugbear) on the package, tests, benchmarks
  and examples, and ``mypy`` on ``src/sparknet``: both clean, with the settings in
  ``pyproject.toml``.
- No source file of the package over 600 lines: a longer one is doing several jobs.
- Test-only machinery (``sparknet.cluster.testing``) is imported by no production module.
- Imports run one way: no import circle among the package's modules (the ones left are listed
  below as debt, so a new one fails), ``sparknet.cluster`` never imports ``sparknet.ml`` and the
  core (``sparknet/*.py`` but the command line, ``sparknet/layers``) never imports
  ``sparknet.cluster``.
- No private name (``_x``) of the package is imported by another of its modules.

Both tools are in the ``test`` extras; a missing one fails here, saying how to install it.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import subprocess
import sys
from typing import Iterator

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PACKAGE = os.path.join(ROOT, "src", "sparknet")
MAX_LINES = 600


def _tool(module: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; install the test extras: "
                    f"python -m pip install '.[test]'")
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
    cache = os.environ.get("MYPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "sparknet-mypy")
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
    assert not offenders, ("production modules import sparknet.cluster.testing:\n"
                           + "\n".join(offenders))


# ----------------------------------------------------------------- the import graph
# Module-level imports only count for circles Python would trip over: those inside functions
# are read when the function runs, and those under ``if TYPE_CHECKING:`` never run.  The graph
# with the deferred imports is checked too (a circle there is a tangle of modules, even when it
# imports), against the debt it holds today.

#: Circles (strongly connected components) of the module-level import graph still to break.
KNOWN_CIRCLES: list[set[str]] = []

#: Circles still to break once imports inside functions count too.
KNOWN_DEFERRED_CIRCLES: list[set[str]] = []

#: Imports across the layers (importer, imported), deferred into functions, still to remove.
KNOWN_CLUSTER_TO_ML: set[tuple[str, str]] = set()
KNOWN_CORE_TO_CLUSTER: set[tuple[str, str]] = set()


def _module_paths() -> dict[str, str]:
    """Every module of the package (compiled kernels included, as leaves) -> its source file."""
    src = os.path.dirname(PACKAGE)
    out = {}
    for path in _sources((".py", ".pyx")):
        parts = os.path.relpath(path, src).rsplit(".", 1)[0].split(os.sep)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt], deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when ``body`` runs (with ``deferred``: also those in its
    functions); never those under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _imports(node.body, deferred)
            yield from _imports(node.orelse, deferred)
        elif isinstance(node, ast.Try):
            for block in [node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)]:
                yield from _imports(block, deferred)
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            yield from _imports(node.body, deferred)
        elif deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(node.body, deferred)


@functools.lru_cache(maxsize=None)
def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports.  ``from x import y`` counts as importing the
    module ``x.y`` when there is one, else ``x``."""
    modules = _module_paths()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        if not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        for node in _imports(tree.body, deferred):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                mod = ".".join(p for p in (base, node.module or "") if p)
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                targets = subs + ([mod] if len(subs) < len(node.names) else [])
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    circles.append(comp)
    return circles


def _check_circles(circles: list[set[str]], known: list[set[str]], what: str) -> None:
    new = [sorted(c) for c in circles if not any(c <= k for k in known)]
    assert not new, (f"new import circles ({what}); break them (move the shared piece down to the "
                     "lower module):\n" + "\n".join(" <-> ".join(c) for c in new))
    assert sum(map(len, circles)) <= sum(map(len, known)), (
        f"more modules in import circles ({what}) than the known debt: "
        f"{sorted(map(sorted, circles))}")


def test_import_graph_has_no_new_circles():
    _check_circles(import_circles(import_graph()), KNOWN_CIRCLES, "module-level imports")


def test_import_graph_with_deferred_imports_has_no_new_circles():
    _check_circles(import_circles(import_graph(deferred=True)), KNOWN_DEFERRED_CIRCLES,
                   "imports inside functions included")


def test_import_circles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, import_circles(graph))) == [["a", "b", "c"], ["d", "e"]]


def _crossings(importer: str, imported: str, deferred: bool) -> set[tuple[str, str]]:
    def inside(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    def core(name: str) -> bool:       # the command line (sparknet.__main__) sits above it all
        parts = name.split(".")
        return (len(parts) <= 2 or parts[1] == "layers") and name != "sparknet.__main__"

    importers = core if importer == "core" else (lambda n: inside(n, importer))
    return {(a, b) for a, deps in import_graph(deferred).items() if importers(a)
            for b in deps if inside(b, imported)}


def test_cluster_does_not_import_ml():
    assert not _crossings("sparknet.cluster", "sparknet.ml", deferred=False), \
        ("sparknet.cluster imports sparknet.ml at module level: the trainers must not need the "
         "Estimators")
    extra = _crossings("sparknet.cluster", "sparknet.ml", deferred=True) - KNOWN_CLUSTER_TO_ML
    assert not extra, f"new imports of sparknet.ml from sparknet.cluster: {sorted(extra)}"


def test_core_does_not_import_cluster():
    assert not _crossings("core", "sparknet.cluster", deferred=False), \
        "the core (sparknet/*.py, sparknet/layers) imports sparknet.cluster at module level"
    extra = _crossings("core", "sparknet.cluster", deferred=True) - KNOWN_CORE_TO_CLUSTER
    assert not extra, f"new imports of sparknet.cluster from the core: {sorted(extra)}"


# ---------------------------------------------------------- private names stay in their module
#: Private names of pyspark that sparknet needs, with the reason (no public equivalent).
THIRD_PARTY_PRIVATE = {
    ("pyspark.sql.connect.udf", "_create_udf"): "a Connect UDF with a given eval type",
    ("pyspark.ml.base", "_PredictorParams"): "the Params every Spark ML Predictor shares",
    ("pyspark.ml.base", "_FitMultipleIterator"): "fitMultiple's iterator, as Estimator uses it",
}

#: Private names of the package still imported by other modules (debt: the list only shrinks).
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def _private_imports(modules: dict[str, str]) -> set[tuple[str, str, str]]:
    """(importer, module, name) of every ``from module import _name`` (imports inside functions
    included) where ``_name`` is not a module of a package holding the importer: a private
    module is shared within its package, a private name within its module."""
    found = set()
    for name, path in modules.items():
        if not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                sub = f"{mod}.{alias.name}"
                shared_module = sub in modules and (name + ".").startswith(mod + ".")
                if private and not shared_module:
                    found.add((name, mod, alias.name))
    return found


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore is its module's own: what another module needs gets a
    public name (in a private module, if it is the package's business only)."""
    found = _private_imports(_module_paths())
    third = {(imp, mod, n) for imp, mod, n in found if (mod, n) in THIRD_PARTY_PRIVATE}
    new = sorted(found - third - KNOWN_PRIVATE_IMPORTS)
    assert not new, ("private names imported from other modules (make them public, or move the "
                     "code that needs them): " + ", ".join(f"{a} imports {m}.{n}"
                                                           for a, m, n in new))
    unused = sorted(k for k in THIRD_PARTY_PRIVATE if k not in {(m, n) for _, m, n in third})
    assert not unused, f"pyspark privates no longer imported, drop them from the list: {unused}"


def test_the_private_import_check_finds_one(tmp_path):
    """A module importing another's private function is flagged; a private module of its own
    package is not (so the check cannot pass vacuously)."""
    (tmp_path / "pkg").mkdir()
    for f, text in {"__init__.py": "", "_impl.py": "def _helper(): pass\n",
                    "a.py": "from pkg._impl import _helper\n", "b.py": "from pkg import _impl\n"
                    }.items():
        (tmp_path / "pkg" / f).write_text(text)
    modules = {"pkg": str(tmp_path / "pkg" / "__init__.py")}
    modules |= {f"pkg.{m}": str(tmp_path / "pkg" / f"{m}.py") for m in ("_impl", "a", "b")}
    assert _private_imports(modules) == {("pkg.a", "pkg._impl", "_helper")}


# ------------------------------------------------------------------ the tests themselves
TESTS = os.path.join(ROOT, "tests")
HELPERS = os.path.join(TESTS, "helpers")
# builders that live in tests/helpers/ (models.py, frames.py), with the names their copies had
SHARED_BUILDERS = {"mlp", "_mlp", "mp_layers", "_mp_layers", "array_frame", "_array_df",
                   "vector_frame", "_vector_df", "row_frame", "_cached_df"}


def _test_sources() -> Iterator[tuple[str, ast.Module]]:
    for base, _, files in os.walk(TESTS):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, ROOT), ast.parse(fh.read(), path)


def _touches_sys_path(node: ast.AST) -> bool:
    """``sys.path`` written: assigned, or one of its mutating methods called."""
    def is_sys_path(n: ast.AST) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
                and n.value.id == "sys")

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return is_sys_path(node.func.value) and node.func.attr in {
            "insert", "append", "extend", "remove", "pop", "clear", "__setitem__"}
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value))
                   for t in targets)
    return False


def _two_dense_softmax(fn: ast.FunctionDef) -> bool:
    """Whether ``fn`` only returns ``Sequential([Dense(.., relu), Dense(.., softmax)], ..)``:
    a copy of :func:`helpers.models.mlp` under another name."""
    body = [s for s in fn.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    call = body[0].value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == "Sequential" and call.args and isinstance(call.args[0], ast.List)):
        return False
    acts = []
    for layer in call.args[0].elts:
        if not (isinstance(layer, ast.Call) and isinstance(layer.func, ast.Name)
                and layer.func.id == "Dense"):
            return False
        acts += [kw.value.value for kw in layer.keywords if kw.arg == "activation"
                 and isinstance(kw.value, ast.Constant)]
    return acts == ["relu", "softmax"] and len(call.args[0].elts) == 2


def test_tests_do_not_edit_sys_path():
    """Shared test code is the ``helpers`` package, on the path through pyproject's pytest
    ``pythonpath``; a driver script run as its own process imports only sparknet."""
    found = [f"{path}:{node.lineno}" for path, tree in _test_sources() for node in ast.walk(tree)
             if _touches_sys_path(node)]
    assert not found, ("sys.path edited in tests (import from tests/helpers/ instead): "
                       + ", ".join(found))


def test_shared_builders_are_not_copied():
    """The small networks and DataFrames the tests share are built in tests/helpers/ only."""
    found = []
    for path, tree in _test_sources():
        if path.startswith(os.path.relpath(HELPERS, ROOT) + os.sep):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (node.name in SHARED_BUILDERS
                                                      or _two_dense_softmax(node)):
                found.append(f"{path}:{node.lineno} {node.name}")
    assert not found, ("builders redefined outside tests/helpers/ (use helpers.models or "
                       "helpers.frames): " + ", ".join(found))


def test_the_test_checks_find_what_they_look_for():
    """The two checks above flag a sys.path edit and an mlp copy (so they cannot pass vacuously)."""
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path[0] = 'y'\n"
                     "def net(seed=0):\n"
                     "    return Sequential([Dense(8, activation='relu'),\n"
                     "                       Dense(10, activation='softmax')], seed=seed)\n")
    assert sum(_touches_sys_path(n) for n in ast.walk(tree)) == 2
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert [_two_dense_softmax(f) for f in fns] == [True]

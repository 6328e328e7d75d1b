"""The Sphinx documentation builds with warnings treated as errors."""
from pathlib import Path

import pytest

from helpers import docs_build


@pytest.mark.slow
def test_sphinx_builds_without_warnings():
    pytest.importorskip("sphinx", reason="sphinx is not installed: pip install '.[test]'")
    build = docs_build.take()  # started as the run started (tests/helpers/docs_build.py)
    try:
        returncode, output = build.result(timeout=300)
        assert returncode == 0, output
        _check_pages(Path(build.out) / "html")
    finally:
        build.close()


def _check_pages(html: Path) -> None:
    for page in ("api/index", "api/sparknet", "api/layers", "api/cluster", "api/ml", "api/export",
                 "api/internals/index", "install", "quickstart", "troubleshooting", "changelog", "benchmarks", "scaling",
                 "guides/dense", "guides/conv", "guides/recurrent", "guides/data_parallel", "guides/async",
                 "guides/model_parallel", "guides/spark_ml", "guides/inference", "guides/checkpoints", "guides/connect",
                 "guides/attention", "guides/normalization", "guides/tabular", "guides/export", "guides/precision"):
        assert (html / f"{page}.html").exists(), f"docs/{page}.rst was not built"
    # the benchmark figures come from benchmarks/README.md at build time, tables included
    bench = (html / "benchmarks.html").read_text(encoding="utf-8")
    assert "Kernels, one thread" in bench and bench.count("<table") >= 10
    # an API page a browser opens at once: none over 300 kB (the reference is split by package)
    big = {p.relative_to(html).as_posix(): p.stat().st_size for p in (html / "api").rglob("*.html")
           if p.stat().st_size > 300_000}
    assert not big, f"API pages over 300 kB: {big}"

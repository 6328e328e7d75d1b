"""The Sphinx documentation builds with warnings treated as errors."""
import os
import subprocess
import sys

import pytest

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


@pytest.mark.slow
def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is not installed: pip install '.[test]'")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = tmp_path / "html"
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

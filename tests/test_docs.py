"""The Sphinx documentation builds with warnings treated as errors."""
import os
import subprocess
import sys

import pytest

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is not installed: pip install '.[test]'")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "html" / "api.html").exists()

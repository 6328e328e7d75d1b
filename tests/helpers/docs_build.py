"""The Sphinx build of the docs, started as the run starts and read by ``test_docs``.

The build (~50 s of one core, most of it autodoc and the HTML writer) needs nothing the
other tests make, so it runs beside them at the lowest CPU priority: it takes the core the
run leaves idle (while a one-process test runs, Spark's JVMs wait) and gives way to the
tests otherwise.  When ``test_docs`` is not selected, nothing starts.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from helpers.early_job import EarlyJob

DOCS = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs"))
TEST = "test_docs.py::test_sphinx_builds_without_warnings"

# sphinx-build's own entry point, at nice 19
_NICE_SPHINX = "import os, sys; os.nice(19); from sphinx.cmd.build import main; sys.exit(main(sys.argv[1:]))"


class DocsBuild:
    """``sphinx -W --keep-going -b html docs <out>`` running in its own process group."""

    def __init__(self) -> None:
        self.out = tempfile.mkdtemp(prefix="sparknet-docs-")
        argv = [sys.executable, "-c", _NICE_SPHINX, "-W", "--keep-going", "-q", "-b", "html",
                DOCS, os.path.join(self.out, "html")]
        self.job = EarlyJob(argv, dict(os.environ))

    def result(self, timeout: float) -> tuple[int | None, str]:
        """The build's exit status and its output, once it ends (killed after ``timeout``)."""
        stdout, stderr = self.job.communicate(timeout=timeout)
        return self.job.returncode, stdout + stderr

    def close(self) -> None:
        self.job.kill()
        shutil.rmtree(self.out, ignore_errors=True)


_STARTED: dict[str, DocsBuild] = {}


def start_early(nodeids: list[str]) -> None:
    """Start the build when the run has the docs test and Sphinx is installed."""
    if any(n.endswith(TEST) for n in nodeids) and "build" not in _STARTED:
        try:
            import sphinx  # noqa: F401
        except ImportError:
            return  # the test skips, saying why
        _STARTED["build"] = DocsBuild()


def take() -> DocsBuild:
    """The build started with the run, or one started now."""
    return _STARTED.pop("build", None) or DocsBuild()


def stop() -> None:
    """Kill a build nobody read and remove its output."""
    build = _STARTED.pop("build", None)
    if build is not None:
        build.close()

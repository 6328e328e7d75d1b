"""Executors that cannot run sparknet, found on a session's first fit.

A session built by hand (``SparkSession.builder.master(...)`` from a virtual environment's
Python run by path, without ``PYSPARK_PYTHON``) starts executors whose Python may not have
sparknet, or has another version than the driver's.  Every task of a fit would then fail
with ``ModuleNotFoundError`` wrapped in Java traces.  :func:`check_workers` runs one task that
imports sparknet and reports its version, once per application, and turns a failure into one
:class:`~sparknet.errors.WorkerSetupError` that says how to ship sparknet to the workers.
"""
from __future__ import annotations

import logging
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

from sparknet._version import __version__
from sparknet.errors import WorkerSetupError

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: the applications whose executors import this driver's sparknet
_CHECKED: set[str] = set()
_LOCK = threading.Lock()

_HOW = ("install the same sparknet where the executors run: start the session with "
        "PYSPARK_PYTHON pointing at a Python that has it (on one machine: {python}), ship a packed "
        "environment with spark.archives, or pip install the wheel on every worker (see the "
        "install guide, 'On a cluster')")


def worker_version(_: object) -> list[tuple[str, str]]:
    """On an executor: this sparknet's version and the Python running it."""
    return [(__version__, sys.executable)]


def check_workers(sc: "SparkContext | Any") -> None:
    """Run one task that imports sparknet on an executor, once per application.

    Raises:
        WorkerSetupError: the executors' Python cannot import sparknet (or numpy, scipy,
            pyarrow it needs), or imports another version than the driver's.
    """
    app = str(sc.applicationId)
    with _LOCK:  # a fit loads its training and validation data side by side: one check
        if app in _CHECKED:
            return
        # the check is no job of the caller's group
        group = sc.getLocalProperty("spark.jobGroup.id")
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        try:
            version, python = sc.parallelize([0], 1).mapPartitions(worker_version).collect()[0]
        except Exception as exc:
            missing = re.search(r"No module named '([\w.]+)'", str(exc))
            if missing is None:
                raise
            log.debug("the import check's task failed", exc_info=True)
            raise WorkerSetupError(
                f"the executors' Python cannot import {missing.group(1)!r} (ModuleNotFoundError on "
                f"the first task), so no fit can run there: "
                + _HOW.format(python=sys.executable)) from None
        finally:
            sc.setLocalProperty("spark.jobGroup.id", group)  # type: ignore[arg-type]
        if version != __version__:
            raise WorkerSetupError(
                f"the executors run sparknet {version} ({python}) and this driver "
                f"{__version__}: " + _HOW.format(python=sys.executable))
        _CHECKED.add(app)

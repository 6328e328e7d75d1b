"""A driver program started ahead of the test that reads it.

A test whose driver program runs on the standalone cluster spends most of its time waiting
for that program's Spark start (a driver JVM, then two executor JVMs).  A module fixture
starts the program as the module's first test starts, when that test is selected: the
program runs while the module's other tests run in this process, and the test then reads
what it printed.  The program runs in its own process group, killed whatever happens.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import pytest

HELPERS = os.path.dirname(os.path.abspath(__file__))


def has_java() -> bool:
    """Whether a JVM can start here (``java`` on PATH or ``JAVA_HOME`` set)."""
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


def in_background(fn: Callable[[], Any], name: str) -> Future:
    """``fn()`` started now on a thread of its own; its result (or error) in the future."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def discard(future: Future | None, close: str) -> None:
    """Close (its method ``close``) what a background start made and nobody took; a start
    that failed left nothing to close."""
    if future is None:
        return
    try:
        getattr(future.result(), close)()
    except Exception:  # noqa: BLE001 - its start failed: nothing runs
        pass


def selected(request: Any, name: str) -> bool:
    """Whether the test function ``name`` of the requesting fixture's module runs in this
    session (``request`` of a module-scoped fixture)."""
    here = request.node.path
    return any(item.path == here and getattr(item, "originalname", item.name) == name
               for item in request.session.items)


def cluster(request: Any) -> Any:
    """The run's standalone cluster with both workers alive, or None when it cannot be had:
    the error (or skip) then comes to the test that asks for the cluster itself, not to the
    module's first test."""
    try:
        return request.getfixturevalue("_standalone").ensure_workers()
    except (Exception, pytest.skip.Exception):
        return None


class EarlyJob:
    """``argv`` started now with ``env``, in a process group of its own.

    Args:
        argv: the program and its arguments.
        env: its environment.
        stdin: give it a pipe on its standard input (``self.proc.stdin``), for a program that
            waits for the test's cue.
    """

    def __init__(self, argv: list[str], env: dict[str, str], stdin: bool = False) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else None, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)

    def communicate(self, timeout: float) -> tuple[str, str]:
        """Its stdout and stderr once it ends (killed, with everything it started, after
        ``timeout`` seconds from now)."""
        try:
            return self.proc.communicate(timeout=timeout)
        finally:
            self.kill()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def kill(self) -> None:
        """Kill the program's process group (its JVM included) if it still runs."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.communicate()


def start_for(request: Any, test: str, script: str, args: list[str] | None = None,
              env: dict[str, str] | None = None, stdin: bool = False) -> Iterator[EarlyJob | None]:
    """The body of a module fixture that starts ``helpers/<script> <cluster url> <args>`` as
    the module's first test starts, when ``test`` is selected, Java is there and the run's
    cluster can be had: yields the :class:`EarlyJob` (``None`` otherwise), killed at the
    module's end."""
    if not (has_java() and selected(request, test)):
        yield None
        return
    standalone = cluster(request)  # the run's shared cluster
    if standalone is None:
        yield None
        return
    full_env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                    **(env or {}))
    job = EarlyJob([sys.executable, os.path.join(HELPERS, script), standalone.url,
                    *(args or [])], full_env, stdin=stdin)
    yield job
    job.kill()

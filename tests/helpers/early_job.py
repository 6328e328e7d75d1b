"""A driver program started ahead of the test that reads it.

A test whose driver program runs on the standalone cluster spends most of its time waiting
for that program's Spark start (a driver JVM, then two executor JVMs).  A module fixture
starts the program as the module's first test starts, when that test is selected: the
program runs while the module's other tests run in this process, and the test then reads
what it printed.  The program runs in its own process group, killed whatever happens.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest


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

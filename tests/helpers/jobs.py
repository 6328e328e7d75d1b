"""Waiting for Spark's status store to see jobs end.

A job's end reaches ``statusTracker()`` through the listener bus, after the action that ran it has
returned (and after a cancelled job's tasks are killed), so a test asks whether jobs are still
active only after giving the bus a bounded time to catch up.
"""
from __future__ import annotations

import time


def wait_no_active_jobs(sc, timeout: float = 30.0) -> list[int]:
    """Poll ``sc``'s status tracker until no job is active or ``timeout`` s pass; return those left."""
    tracker = sc.statusTracker()
    deadline = time.monotonic() + timeout
    active = list(tracker.getActiveJobsIds())
    while active and time.monotonic() < deadline:
        time.sleep(0.1)
        active = list(tracker.getActiveJobsIds())
    return active

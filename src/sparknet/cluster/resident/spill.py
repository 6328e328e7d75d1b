"""The spill files of resident state (:mod:`sparknet.cluster.resident.driver`) and their owners,
so that nothing a fit writes outlives it.

Every :class:`~sparknet.cluster.resident.driver.Resident` keeps its arrays as ``.npy`` files under
one folder per host, ``<base>/sparknet-resident-<key>/part-NNNNN/``, where ``<base>`` is
``/dev/shm`` when it has room, else the executor's local directory.  The folder also
holds ``owner.json``: the driver's host, process id and start time, and the Spark
application id.  Tasks that use the state touch that file (at most once a minute), so
its modification time is the state's last use.

:meth:`Resident.close` deletes the folders on every host that ran a task.  A driver that
was killed cannot; the next Resident built on the same host removes them
(:func:`sweep_stale`, run by the driver and by each executor's builder): a folder is
stale when its driver ran on this host and that process is gone (or the pid now
belongs to another process), or, for a driver on another host, when it has not been
used for :data:`STALE_AGE` seconds.  A folder of the calling application, or younger
than :data:`GRACE` seconds, is never touched.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from sparknet.checkpoint import process_start

log = logging.getLogger(__name__)

SHM = "/dev/shm"
#: Free space kept in /dev/shm besides twice a shard's size before spilling there.
SHM_HEADROOM = 256 << 20
#: Prefix of every resident state's folder.
PREFIX = "sparknet-resident-"
OWNER_FILE = "owner.json"
#: Seconds without use after which the folder of a driver on another host is stale
#: (that driver cannot be asked whether it still runs).
STALE_AGE = 6 * 3600.0
#: A folder younger than this is never removed (its owner file may not be written yet).
GRACE = 60.0
#: At most one sweep per process per this many seconds.
SWEEP_EVERY = 600.0
#: Seconds between two touches of an owner file by one process.
TOUCH_EVERY = 60.0

_last_sweep = 0.0
_touched: dict[str, float] = {}


@dataclass(frozen=True)
class Owner:
    """The driver a resident folder belongs to."""

    host: str
    pid: int
    start: int          # the pid's start time (clock ticks after boot; 0 when unknown)
    app_id: str

    @classmethod
    def this_driver(cls, app_id: str) -> "Owner":
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_start(pid) or 0, str(app_id))


def candidate_bases(extra: str | None = None) -> list[str]:
    """Every folder spill files may go to on this host."""
    bases = [SHM] + [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    bases += [tempfile.gettempdir()] + ([extra] if extra else [])
    out: list[str] = []
    for b in bases:
        if b not in out and os.path.isdir(b):
            out.append(b)
    return out


def spill_base(nbytes: int) -> str:
    """Where to put spill files: /dev/shm when it has room, else the executor's local dir."""
    try:
        if os.path.isdir(SHM) and shutil.disk_usage(SHM).free > 2 * nbytes + SHM_HEADROOM:
            return SHM
    except OSError:  # pragma: no cover - exotic filesystems
        pass
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    if local and os.path.isdir(local):
        return local
    return tempfile.gettempdir()


def spill(directory: str, name: str, arr: np.ndarray) -> np.ndarray:
    """Write ``arr`` atomically as ``directory/name.npy`` and return its r+ memory map."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name + ".npy")
    tmp = os.path.join(directory, f"{name}.{os.getpid()}.tmp.npy")
    np.save(tmp, np.ascontiguousarray(arr), allow_pickle=False)
    os.replace(tmp, path)
    return open_npy(path)


def open_npy(path: str) -> np.ndarray:
    """The ``.npy`` file at ``path`` memory-mapped read-write (``r+``), so in-place writes
    reach the file; an empty array is read into memory instead (there is nothing to map)."""
    if np.load(path, mmap_mode="r", allow_pickle=False).size == 0:
        return np.load(path, allow_pickle=False)
    return np.load(path, mmap_mode="r+", allow_pickle=False)


def load_dir(directory: str) -> dict[str, np.ndarray] | None:
    """Every finished ``.npy`` file of ``directory``, mapped; None when it does not exist."""
    if not os.path.isdir(directory):
        return None
    out = {}
    for fname in os.listdir(directory):
        if fname.endswith(".npy") and not fname.endswith(".tmp.npy"):
            out[fname[:-4]] = open_npy(os.path.join(directory, fname))
    return out


def write_owner(folder: str, owner: Owner) -> None:
    """Create ``folder`` (a state's folder on this host) with its owner file, if absent."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, OWNER_FILE)
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({**asdict(owner), "created": time.time()}, f)
    os.replace(tmp, path)


def touch(folder: str) -> None:
    """Mark the state of ``folder`` as used now (throttled to once per
    :data:`TOUCH_EVERY` seconds per process)."""
    now = time.time()
    if now - _touched.get(folder, 0.0) < TOUCH_EVERY:
        return
    _touched[folder] = now
    try:
        os.utime(os.path.join(folder, OWNER_FILE))
    except OSError:
        pass


def stale_reason(folder: str, app_id: str, now: float | None = None) -> str | None:
    """Why the resident folder ``folder`` is left over (its owner is gone), or None when
    it may still be in use."""
    now = time.time() if now is None else now
    path = os.path.join(folder, OWNER_FILE)
    try:
        age = now - os.stat(path).st_mtime
        with open(path) as f:
            rec = json.load(f)
    except FileNotFoundError:
        try:
            age = now - os.stat(folder).st_mtime
        except OSError:
            return None
        return f"no owner file, unused for {age:.0f} s" if age > max(GRACE, 600.0) else None
    except (OSError, ValueError):
        return None
    if rec.get("app_id") == app_id or age < GRACE:
        return None
    if rec.get("host") == socket.gethostname():
        pid, start = int(rec.get("pid", -1)), int(rec.get("start", 0))
        now_start = process_start(pid) if pid > 0 else None
        if now_start is None:
            return f"its driver (pid {pid}, application {rec.get('app_id')}) is gone"
        if start and now_start and now_start != start:
            return f"its driver (pid {pid}, application {rec.get('app_id')}) is gone (pid reused)"
        return None
    if age > STALE_AGE:
        return f"its driver on {rec.get('host')} has not used it for {age / 3600:.1f} h"
    return None


def sweep_stale(app_id: str, extra_base: str | None = None, force: bool = False) -> list[str]:
    """Remove the resident folders on this host whose owner is gone (see the module
    docstring); returns the folders removed.  At most once per :data:`SWEEP_EVERY`
    seconds per process unless ``force``."""
    global _last_sweep
    now = time.time()
    if not force and now - _last_sweep < SWEEP_EVERY:
        return []
    _last_sweep = now
    removed = []
    for base in candidate_bases(extra_base):
        try:
            names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            folder = os.path.join(base, name)
            why = stale_reason(folder, app_id, now)
            if why is None:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.exists(folder):
                removed.append(folder)
                log.warning("sparknet: removed %s, left by an earlier fit (%s)", folder, why)
    return removed


def remove_key(key: str, extra_base: str | None = None) -> int:
    """Delete the folder of the state ``key`` under every base of this host; returns how
    many existed."""
    n = 0
    for base in candidate_bases(extra_base):
        folder = os.path.join(base, PREFIX + key)
        if os.path.isdir(folder):
            shutil.rmtree(folder, ignore_errors=True)
            n += 1
    return n

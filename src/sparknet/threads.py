"""How many BLAS threads sparknet's kernels use in this process.

sparknet parallelises across Spark tasks and Python threads (its kernels release the
GIL), so by default each training or inference call limits BLAS to **one** thread:
on a busy machine a multi-threaded BLAS on small matrices spins and can run 10-20x
slower.  Raise the limit for single-process training of large layers on an idle
machine with :func:`set_num_threads` (or ``num_threads=`` on ``fit``).

One mechanism, three uses:

* :func:`blas_threads` -- a block runs with BLAS at a given count, restored after;
* :class:`capped` -- a cheap cap at :func:`get_num_threads` around each call of a
  layer's kernels (a no-op when BLAS already runs at most that many threads);
* :func:`set_worker_threads` -- a Spark task sets its Python worker's BLAS to the
  task's cores, once per worker.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from sparknet._validation import positive_int

_num_threads: int | None = 1
_libs: list[Any] | None = None
_worker_threads: int | None = None


def set_num_threads(n: int | None) -> None:
    """Set the default BLAS thread count (``None``: leave BLAS's own setting alone)."""
    global _num_threads
    _num_threads = positive_int(n, "num_threads", allow_none=True)


def get_num_threads() -> int | None:
    """The default BLAS thread count (``None`` means BLAS decides)."""
    return _num_threads


def _blas_libs() -> list[Any]:
    """The BLAS libraries loaded in this process (threadpoolctl controllers), found once."""
    global _libs
    if _libs is None:
        try:
            from threadpoolctl import ThreadpoolController
            _libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        except Exception:  # threadpoolctl missing or unable to inspect: leave BLAS alone
            _libs = []
    return _libs


def _set_all(n: int) -> list[tuple[Any, int]]:
    """Set every BLAS to ``n`` threads; return what changed as ``(lib, previous)``."""
    saved = []
    for lib in _blas_libs():
        prev = lib.num_threads
        if prev != n:
            lib.set_num_threads(n)
            saved.append((lib, prev))
    return saved


def _restore(saved: list[tuple[Any, int]]) -> None:
    for lib, n in saved:
        lib.set_num_threads(n)


@contextlib.contextmanager
def blas_threads(n: int | None = 0) -> Iterator[None]:
    """Run BLAS with ``n`` threads inside the block (0: the default; None: no limit)."""
    limit = _num_threads if n == 0 else n
    if limit is None:
        yield
        return
    saved = _set_all(int(limit))
    try:
        yield
    finally:
        _restore(saved)


class capped:
    """Context manager: cap BLAS at :func:`get_num_threads` (cheap when it already is at
    most that), then restore it.  Layers wrap each kernel call in it, so a hand-written
    loop gets the same cap as ``fit``."""

    __slots__ = ("_saved",)

    def __enter__(self) -> "capped":
        self._saved: list[tuple[Any, int]] = []
        limit = _num_threads
        if limit is not None:
            for lib in _blas_libs():
                prev = lib.num_threads
                if prev > limit:
                    lib.set_num_threads(limit)
                    self._saved.append((lib, prev))
        return self

    def __exit__(self, *exc: object) -> None:
        _restore(self._saved)


def set_worker_threads(cpus: int) -> None:
    """Set this (Spark Python worker) process's BLAS to ``cpus`` threads, once per worker."""
    global _worker_threads
    n = max(1, int(cpus))
    if _worker_threads == n:
        return
    _set_all(n)
    _worker_threads = n

"""How many BLAS threads sparknet's kernels use in this process.

sparknet parallelises across Spark tasks and Python threads (its kernels release the
GIL), so by default each training or inference call limits BLAS to **one** thread:
on a busy machine a multi-threaded BLAS on small matrices spins and can run 10-20x
slower.  Raise the limit for single-process training of large layers on an idle
machine with :func:`set_num_threads` (or ``num_threads=`` on ``fit``).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

_num_threads = 1
_controller = None


def set_num_threads(n: int | None) -> None:
    """Set the default BLAS thread count (``None``: leave BLAS's own setting alone)."""
    global _num_threads
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"num_threads must be a positive integer or None, got {n!r}")
    _num_threads = n


def get_num_threads() -> int | None:
    """The default BLAS thread count (``None`` means BLAS decides)."""
    return _num_threads


@contextlib.contextmanager
def blas_threads(n: int | None = 0) -> Iterator[None]:
    """Limit BLAS to ``n`` threads inside the block (0: the default; None: no limit)."""
    global _controller
    limit = _num_threads if n == 0 else n
    if limit is None:
        yield
        return
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a declared dependency
        yield
        return
    if _controller is None:
        _controller = ThreadpoolController()
    with _controller.limit(limits=int(limit), user_api="blas"):
        yield

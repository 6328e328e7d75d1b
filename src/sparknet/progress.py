"""Progress reporting on the driver (tqdm when available, a silent fallback otherwise)."""
from __future__ import annotations

import contextlib
import sys


class _NoBar:
    def __init__(self, *a, **k):
        pass

    def update(self, n=1):
        pass

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass


@contextlib.contextmanager
def progress_bar(total: int, desc: str, unit: str = "it", disable: bool = False):
    """A tqdm bar on stderr, or a no-op when disabled or tqdm is missing."""
    bar = _NoBar()
    if not disable:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                       dynamic_ncols=True, mininterval=0.5)
        except ImportError:  # pragma: no cover - tqdm is a dependency
            pass
    try:
        yield bar
    finally:
        bar.close()

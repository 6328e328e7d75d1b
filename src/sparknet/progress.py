"""Progress reporting on the driver (tqdm when available, a silent fallback otherwise)."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator


class _NoBar:
    """The part of tqdm's interface the callers use, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, desc: str, unit: str = "it", disable: bool = False) -> Iterator[Any]:
    """A tqdm bar on stderr, or a no-op when disabled or tqdm is missing."""
    bar: Any = _NoBar()
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

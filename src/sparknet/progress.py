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


def check_verbose(verbose: Any) -> int:
    """``verbose`` as 0, 1 or 2 (``True``/``False`` as 1/0); anything else raises ``ValueError``."""
    if isinstance(verbose, bool):
        return int(verbose)
    if isinstance(verbose, int) and 0 <= verbose <= 2:
        return int(verbose)
    raise ValueError(f"verbose must be 0 (silent), 1 (one live progress bar) or 2 (one line per epoch), "
                     f"got {verbose!r}")


#: the console's names for a fit's per-epoch metrics, in the order shown (train figures
#: are labelled as such; what is not listed is not shown)
SHOWN = (("loss", "train_loss", "{:.4f}"), ("accuracy", "train_acc", "{:.4f}"),
         ("val_loss", "val_loss", "{:.4f}"), ("val_accuracy", "val_acc", "{:.4f}"),
         ("spark_overhead", "spark", "{:.0%}"))


def _shown(logs: dict[str, float]) -> dict[str, str]:
    out = {}
    for key, label, fmt in SHOWN:
        v = logs.get(key)
        if v is not None and v == v:  # not NaN: an epoch inside a round has no validation
            out[label] = fmt.format(v)
    return out


class FitProgress:
    """A fit's console, as Keras does it: ``verbose=0`` nothing; ``1`` one live bar over
    the fit's epochs (its description says the round within the epoch; its postfix the
    running train figures, then the last epoch's validation and Spark's share, each
    labelled), left on screen at the end; ``2`` one line per epoch on stdout.  While the
    bar is live, log records are written above it (tqdm's logging redirect), never
    through it.

    ``rounds(total, desc)`` gives the object a trainer's round loop updates
    (``update(n)``, ``set_postfix(dict)``), the tqdm interface it used per epoch before.
    """

    def __init__(self, epochs: int, verbose: Any = 1, unit: str = "epoch", step_unit: str = "rounds") -> None:
        self.epochs, self.verbose, self.unit = int(epochs), check_verbose(verbose), unit
        self.step_unit = step_unit
        self._bar: Any = None
        self._redirect: Any = None
        self._desc, self._done, self._total = "", 0, 0
        self._last: dict[str, str] = {}

    def __enter__(self) -> "FitProgress":
        if self.verbose == 1:
            try:
                from tqdm.auto import tqdm
                from tqdm.contrib.logging import logging_redirect_tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency
                return self
            self._bar = tqdm(total=self.epochs, unit=self.unit, file=sys.stderr, leave=True, dynamic_ncols=True,
                             mininterval=0.2, bar_format="{desc} |{bar:20}| [{elapsed}<{remaining}{postfix}]")
            self._redirect = logging_redirect_tqdm(tqdm_class=tqdm)
            self._redirect.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(*exc)
            self._redirect = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def skip(self, n: int) -> None:
        """``n`` epochs are done already (a resumed fit)."""
        if self._bar is not None and n > 0:
            self._bar.update(int(n))

    # -- within an epoch ----------------------------------------------------
    def rounds(self, total: int, desc: str) -> "FitProgress":
        """Start the rounds (or batches) of one epoch or span of epochs."""
        self._desc, self._done, self._total = desc, 0, int(total)
        self._show_desc()
        return self

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, n: int) -> None:  # async mode re-estimates an epoch's rounds
        self._total = int(n)
        self._show_desc()

    def update(self, n: int = 1) -> None:
        self._done += int(n)
        self._show_desc()

    def set_postfix(self, post: dict[str, Any] | None = None, refresh: bool = True, **kw: Any) -> None:
        """The running train figures of the epoch so far (``loss``, ``acc``, ...)."""
        if self._bar is None:
            return
        running = {("train_" + k if k in ("loss", "acc") else k): v for k, v in {**(post or {}), **kw}.items()}
        self._bar.set_postfix({**self._last, **running}, refresh=refresh)

    def _show_desc(self) -> None:
        if self._bar is not None:
            step = f" ({self._done}/{self._total} {self.step_unit})" if self._total > 1 else ""
            self._bar.set_description_str(self._desc + step, refresh=False)

    # -- at an epoch's end ----------------------------------------------------
    def epoch_end(self, epoch: int, logs: dict[str, float], n: int = 1) -> None:
        """Epoch ``epoch`` (1-based) ended with ``logs``; ``n`` epochs end at once (the
        last of a round of several epochs)."""
        shown = _shown(logs)
        if self.verbose == 2:
            secs = logs.get("time")
            parts = [f"epoch {epoch}/{self.epochs}"] + ([f"{secs:.2f}s"] if secs is not None else [])
            print(" - ".join(parts + [f"{k} {v}" for k, v in shown.items()]), flush=True)
        if self._bar is not None:
            merged = {**self._last, **shown}  # the last validation stays shown until the next one
            self._last = {label: merged[label] for _, label, _ in SHOWN if label in merged}
            self._bar.set_postfix(self._last, refresh=False)
            self._bar.update(n)

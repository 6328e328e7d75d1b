"""Progress reporting on the driver (tqdm when available, a silent fallback otherwise)."""
from __future__ import annotations

import sys
from typing import Any


def check_verbose(verbose: Any) -> int:
    """``verbose`` as 0, 1 or 2 (``True``/``False`` as 1/0); anything else raises ``ValueError``."""
    if isinstance(verbose, bool):
        return int(verbose)
    if isinstance(verbose, int) and 0 <= verbose <= 2:
        return int(verbose)
    raise ValueError(f"verbose must be 0 (silent), 1 (a live progress bar and a line per epoch) or "
                     f"2 (a line per epoch), got {verbose!r}")


def status(message: str, verbose: Any) -> None:
    """One line on stderr about a fit's set-up (starting Spark, loading the data), shown at
    ``verbose`` 1 and 2, so that the seconds before the first epoch are not silent."""
    if verbose:
        print(message, file=sys.stderr, flush=True)


#: a fit's per-epoch metrics as the console shows them: the history's names, in this order
#: (what is not listed is not shown); ``spark_overhead`` is labelled in words on the lines
SHOWN = (("loss", "loss", "{:.4f}"), ("accuracy", "accuracy", "{:.4f}"),
         ("val_loss", "val_loss", "{:.4f}"), ("val_accuracy", "val_accuracy", "{:.4f}"),
         ("spark_overhead", "spark", "{:.0%}"))

#: the running figures trainers pass to ``set_postfix`` under short names
_RUNNING = {"acc": "accuracy"}


def _shown(logs: dict[str, float]) -> dict[str, str]:
    out = {}
    for key, label, fmt in SHOWN:
        v = logs.get(key)
        if v is not None and v == v:  # not NaN: an epoch inside a round has no validation
            out[label] = fmt.format(v)
    return out


def epoch_line(epoch: int, epochs: int, logs: dict[str, float]) -> str:
    """The line kept for one epoch, Keras's way:
    ``epoch 3/10 - 0.52s - loss: 0.0738 - accuracy: 0.9777 - val_loss: 0.1301 -
    val_accuracy: 0.9622 - spark: 96% of round time`` (the share of each round's wall
    time not spent computing; metrics that are ``NaN`` are left out)."""
    secs = logs.get("time")
    parts = [f"epoch {epoch}/{epochs}"] + ([f"{secs:.2f}s"] if secs is not None else [])
    for label, value in _shown(logs).items():
        parts.append(f"spark: {value} of round time" if label == "spark" else f"{label}: {value}")
    return " - ".join(parts)


class FitProgress:
    """A fit's console, as Keras does it: ``verbose=0`` nothing; ``1`` one live bar over
    the fit's epochs (its description says the round within the epoch; its postfix the
    running figures under the history's names, then the last epoch's validation and
    Spark's share) with one line kept above it per epoch (:func:`epoch_line`), the bar
    left on screen at the end; ``2`` the same line per epoch on stdout, no bar.  While the
    bar is live, log records are written above it (tqdm's logging redirect), never
    through it.  When validation runs only every few epochs (a round of several epochs),
    a line says so once (:meth:`validation_every`) and those epochs show no ``val_*``.

    ``rounds(total, desc)`` gives the object a trainer's round loop updates
    (``update(n)``, ``set_postfix(dict)``), the tqdm interface it used per epoch before.
    """

    def __init__(self, epochs: int, verbose: Any = 1, unit: str = "epoch",
                 step_unit: str = "rounds") -> None:
        self.epochs, self.verbose, self.unit = int(epochs), check_verbose(verbose), unit
        self.step_unit = step_unit
        self._bar: Any = None
        self._redirect: Any = None
        self._desc, self._done, self._total = "", 0, 0
        self._last: dict[str, str] = {}
        self._val_every = 1

    def __enter__(self) -> "FitProgress":
        return self  # the bar appears with the first rounds (no empty bar while Spark starts)

    def _open_bar(self) -> None:
        """Start the live bar (``verbose=1``), showing the current description at once."""
        if self.verbose != 1 or self._bar is not None:
            return
        try:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return
        self._bar = tqdm(total=self.epochs, unit=self.unit, file=sys.stderr, leave=True,
                         dynamic_ncols=True, mininterval=0.2, desc=self._desc,
                         bar_format="{desc} |{bar:20}| [{elapsed}<{remaining}{postfix}]")
        self._redirect = logging_redirect_tqdm(tqdm_class=tqdm)
        self._redirect.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(*exc)
            self._redirect = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def skip(self, n: int) -> None:
        """``n`` epochs are done already (a resumed fit)."""
        if n > 0:
            self._open_bar()
        if self._bar is not None and n > 0:
            self._bar.update(int(n))

    def write(self, line: str) -> None:
        """A line kept on the console: above the live bar (stderr) at ``verbose=1``, on
        stdout at ``verbose=2``, nowhere at 0."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        elif self.verbose == 1:
            print(line, file=sys.stderr, flush=True)
        elif self.verbose == 2:
            print(line, flush=True)

    def validation_every(self, k: int) -> None:
        """Validation runs every ``k`` epochs from now on (rounds of ``k`` epochs): said once
        per change of ``k``; the epochs in between show no ``val_*`` figures."""
        k = int(k)
        if k != self._val_every:
            self._val_every = k
            if k > 1:
                self.write(f"validation every {k} epochs: a round trains {k} epochs, validation "
                           f"runs when it ends")

    # -- within an epoch ----------------------------------------------------
    def rounds(self, total: int, desc: str) -> "FitProgress":
        """Start the rounds (or batches) of one epoch or span of epochs."""
        self._desc, self._done, self._total = desc, 0, int(total)
        self._open_bar()
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

    def set_postfix(self, post: dict[str, Any] | None = None, refresh: bool = True,
                    **kw: Any) -> None:
        """The running train figures of the epoch so far (``loss``, ``accuracy``, ...)."""
        if self._bar is None:
            return
        running = {_RUNNING.get(k, k): v for k, v in {**(post or {}), **kw}.items()}
        self._bar.set_postfix({**self._last, **running}, refresh=refresh)

    def _show_desc(self) -> None:
        if self._bar is not None:
            step = f" ({self._done}/{self._total} {self.step_unit})" if self._total > 1 else ""
            self._bar.set_description_str(self._desc + step, refresh=False)

    # -- at an epoch's end ----------------------------------------------------
    def epoch_end(self, epoch: int, logs: dict[str, float], n: int = 1) -> None:
        """Epoch ``epoch`` (1-based) ended with ``logs``; ``n`` epochs end at once (the
        last of a round of several epochs)."""
        if self.verbose:
            self.write(epoch_line(epoch, self.epochs, logs))
        if self._bar is not None:
            # the last validation stays shown until the next one
            merged = {**self._last, **_shown(logs)}
            self._last = {label: merged[label] for _, label, _ in SHOWN if label in merged}
            self._bar.set_postfix(self._last, refresh=False)
            self._bar.update(n)

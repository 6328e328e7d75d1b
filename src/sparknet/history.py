"""Per-epoch metrics of a fit (:class:`History`), saved and loaded as JSON, and plotted.

Every trainer returns one: :meth:`sparknet.model.Sequential.fit` a :class:`History`,
the data-parallel trainer a :class:`FitHistory` (the same per-epoch metrics, plus its set-up,
checkpoints and, in async mode, one record per delta).  The
JSON form (:meth:`History.save`, :meth:`History.load`) keeps all of it; a metric that is
undefined for an epoch (``NaN``: validation inside a round of several epochs) is written
as ``null``.  ``python -m sparknet plot history.json -o curves.png`` draws a saved one.
"""
from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Mapping

from sparknet._model_file import atomic_write

#: ``"format"`` of a saved history, and the version this module writes and reads
FORMAT, VERSION = "sparknet-history", 1


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite_or_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_or_none(x) for x in v]
    return v


class History:
    """Per-epoch metrics of a fit.

    ``history.history`` maps a metric name (``loss``, ``accuracy``, ``val_loss``,
    ``val_accuracy``, ``time``, ...) to a list with one value per epoch;
    ``history["loss"]`` is a shortcut.
    """

    #: attributes beyond the per-epoch metrics that :meth:`to_dict` keeps (subclasses add theirs)
    extra_fields: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def append(self, epoch: int, **metrics: float) -> None:
        self.epoch.append(epoch)
        for k, v in metrics.items():
            self.history.setdefault(k, []).append(float(v))

    def __getitem__(self, key: str) -> list[float]:
        return self.history[key]

    def __contains__(self, key: str) -> bool:
        return key in self.history

    def to_dict(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.history.items()}

    #: attributes beyond the per-epoch metrics that a checkpoint keeps (subclasses add theirs)
    state_fields: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        """The history for a checkpoint (:mod:`sparknet.stateful`): ``epoch``, ``history``
        and the :attr:`state_fields` (copies)."""
        out: dict[str, Any] = {"epoch": list(self.epoch), "history": self.to_dict()}
        return {**out, **{name: copy.deepcopy(getattr(self, name)) for name in self.state_fields}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave: a resumed fit goes on with this history."""
        self.epoch = [int(e) for e in state.get("epoch", [])]
        saved = state.get("history") or {}
        self.history = {k: [float(v) for v in vals] for k, vals in saved.items()}
        for name in self.state_fields:
            if name in state:
                setattr(self, name, copy.deepcopy(state[name]))

    def __repr__(self) -> str:
        last = {k: round(v[-1], 4) for k, v in self.history.items() if v}
        return f"History(epochs={len(self.epoch)}, last={last})"

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> str:
        """The history as a JSON document (``NaN`` and infinities as ``null``)."""
        doc = {"format": FORMAT, "version": VERSION, "kind": type(self).__name__,
               "epoch": list(self.epoch), "history": self.to_dict(),
               "extra": {name: getattr(self, name) for name in self.extra_fields}}
        return json.dumps(_finite_or_none(doc), allow_nan=False, default=float)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` to ``path`` atomically (a half-written file never replaces it)."""
        with atomic_write(os.fspath(path), "w") as fh:
            fh.write(self.to_json())

    @classmethod
    def from_json(cls, text: str, source: str = "the JSON text") -> "History":
        """A history from :meth:`to_json`'s document (a data-parallel fit's comes back as
        a :class:`FitHistory`).

        Raises:
            ValueError: not JSON, not a sparknet history, a newer version, or metrics
                that are not lists of numbers as long as the epochs.
        """
        try:
            doc = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"{source} is not a sparknet history (no \"format\": {FORMAT!r})")
        if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
            raise ValueError(f"{source} is history version {doc.get('version')!r}; this "
                             f"sparknet reads version {VERSION} and older")
        epochs, metrics = doc.get("epoch"), doc.get("history")
        if not isinstance(epochs, list) or not all(isinstance(e, int) for e in epochs):
            raise ValueError(f"{source}: \"epoch\" must be a list of integers")
        if not isinstance(metrics, dict):
            raise ValueError(f"{source}: \"history\" must map metric names to lists")
        klass: type[History] = FitHistory if doc.get("kind") == "FitHistory" else cls
        out = klass()
        out.epoch = list(epochs)
        for name, values in metrics.items():
            if not isinstance(values, list) or len(values) != len(epochs) or not all(
                    v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                    for v in values):
                raise ValueError(f"{source}: metric {name!r} must be a list of {len(epochs)} "
                                 f"numbers (one per epoch; null for undefined)")
            out.history[str(name)] = [math.nan if v is None else float(v) for v in values]
        extra = doc.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{source}: \"extra\" must be an object")
        for name in klass.extra_fields:
            if name in extra:
                setattr(out, name, extra[name])
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "History":
        """A history saved by :meth:`save`."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read the history {path!r}: {exc.strerror or exc}") from None
        return cls.from_json(text, source=repr(path))

    # ------------------------------------------------------------------ pictures
    def plot(self, path: str | os.PathLike[str] | None = None, title: str | None = None) -> Any:
        """Loss and accuracy per epoch (train and validation), and for a data-parallel fit
        Spark's share of each epoch and, in async mode, the staleness of the applied
        deltas; returns the matplotlib ``Figure`` (written to ``path`` when given).
        Needs matplotlib (``pip install 'sparknet[plot]'``)."""
        from sparknet.plotting import plot_history

        return plot_history(self, path, title=title)


class FitHistory(History):
    """The :class:`History` of a data-parallel fit
    (:meth:`sparknet.cluster.DataParallelTrainer.fit`).

    Attributes:
        setup_time: seconds from the call of ``fit`` to its first training round
            (loading the data onto the executors, checks, calibration).
        setup_breakdown: where ``setup_time`` went, in seconds per step, in order (they
            add up to ``setup_time``): for the training data ``plan (driver)`` (column
            checks, the query), ``worker start, imports`` (the shard job until the
            executors' Python workers ran the builder), ``convert to numpy`` (Arrow
            batches or rows to one array), ``checks (executors)`` (NaN, lengths,
            labels), ``spill`` (writing the shard files), ``shard job: scheduling,
            results`` (the rest of that job, from its last task), ``checks (driver)``;
            or ``reuse lookup`` when the shards of an earlier fit were reused; then
            ``validation data`` (all of its steps; loaded beside the training data, only
            the wait past them), ``calibration`` (sizing the first rounds: a local step
            timed on the driver) and ``other``.
        reused_shards: whether the training shards were reused from an earlier fit on
            the same cached data (no job built them).
        updates: one record per arriving delta (``mode="async"``; empty otherwise).
        checkpoints: ``{"step", "seconds", "collect", "job", "bytes"}`` of every
            checkpoint this fit wrote (``checkpoint_dir``): its seconds in all, those
            spent collecting the partitions' optimizer state, whether that took a job of
            its own (not when it came back with a round's results), its arrays' bytes.  A
            checkpoint at an epoch's end is written after the epoch's ``time`` was taken.
        resumed_from: the folder of the checkpoint the fit resumed from, or ``None``.
        interrupted: whether the fit ended on ``KeyboardInterrupt``.
        precision: what the training tasks' products ran in: ``"bf16"``, or ``"fp32"`` (asked
            for, or some executor had no bfloat16 kernel).
        bytes_out, bytes_in: bytes of the parameters broadcast, of the vectors the training
            tasks sent back
            (:class:`~sparknet.cluster.data_parallel.parameter_server.ParameterServer`).
    """

    extra_fields = ("setup_time", "setup_breakdown", "reused_shards", "updates", "checkpoints",
                    "resumed_from", "interrupted", "precision", "bytes_out", "bytes_in")
    state_fields = ("updates",)

    def __init__(self) -> None:
        super().__init__()
        self.setup_time = 0.0
        self.setup_breakdown: dict[str, float] = {}
        self.reused_shards = False
        self.updates: list[dict[str, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.resumed_from: str | None = None
        self.interrupted = False
        self.precision, self.bytes_out, self.bytes_in = "fp32", 0, 0

"""The errors sparknet raises for a training run that cannot go on.

Bad arguments and bad data raise ``ValueError``/``TypeError`` naming the argument,
column or value; the classes here are for what happens *during* a run:

* :class:`TrainingDiverged` -- a loss, a gradient, a delta or the parameters became NaN
  or infinite; the model keeps its last finite weights.
* :class:`RoundTimeout` -- a round (or a model-parallel step) did not finish within the
  trainer's ``round_timeout``; its Spark jobs were cancelled.
* :class:`CheckpointError` -- a checkpoint or model file that cannot be trusted
  (truncated, tampered, sizes that do not match its content, another network's).
* :class:`CheckpointMismatch` -- ``resume=True`` found a checkpoint of another fit (another
  network, setting, optimizer, or past the epochs asked for).
* :class:`DataError` -- a row that a task on an executor cannot use (a null, a row of
  the wrong length, NaN), found while scoring or loading.
* :class:`TaskError` -- any other failure of sparknet's own code in a task.

One shape error has a class of its own, for the code that explains it in the caller's terms:

* :class:`InputRankError` -- a layer built for per-sample inputs with another number of
  axes: a ``Conv2D`` or a pool given flat vectors, an ``LSTM`` given vectors.

The errors a task raises reach the driver as themselves, not inside Spark's wrappers
(:mod:`sparknet.cluster.engine.task_errors`): they are the types in :data:`TASK_ERRORS`.

Spark-side losses have their own classes where they are raised:
:class:`sparknet.cluster.resident.driver.ResidentStateLost` and
:class:`sparknet.cluster.model_parallel.BlockStateLost`.
"""
from __future__ import annotations

from typing import Any


class TrainingDiverged(FloatingPointError):
    """Training produced a NaN or infinite loss, gradient, delta or parameter.

    The trainer that raises it has put back the last finite parameters (the model the
    user holds is never left all-NaN) and has not written a checkpoint of the diverged
    state.  ``FloatingPointError`` is its base, so ``except FloatingPointError`` catches it.

    Attributes:
        epoch: 1-based epoch where it was seen (``None`` when not known).
        round: 1-based round of that epoch (data-parallel), or ``None``.
        step: 1-based optimizer step (one process, model parallel), or ``None``.
        partition: the partition whose result was not finite, or ``None``.
        what: what was not finite (``"loss"``, ``"gradient"``, ``"delta"``, ``"parameters"``).
    """

    def __init__(self, message: str, *, epoch: int | None = None, round: int | None = None,
                 step: int | None = None, partition: int | None = None, what: str = "loss") -> None:
        super().__init__(message)
        self.epoch, self.round, self.step = epoch, round, step
        self.partition, self.what = partition, what

    @classmethod
    def describe(cls, what: str, value: Any = None, *, lr: float | None = None,
                 **where: Any) -> "TrainingDiverged":
        """A ``TrainingDiverged`` whose message names what diverged and where, e.g.
        ``the loss became nan in epoch 3, round 2, partition 1; ...``."""
        place = ", ".join(f"{k} {v}" for k, v in where.items() if v is not None)
        got = "" if value is None else f" became {value}"
        hint = "" if lr is None else f" (now {lr:g})"
        msg = ("training diverged: the "
               f"{what}{got or ' is not finite'}{' in ' + place if place else ''}; the model keeps "
               f"its last finite weights; lower the learning rate{hint}")
        fields = {k: where.get(k) for k in ("epoch", "round", "step", "partition")}
        return cls(msg, what=what, **fields)


class RoundTimeout(TimeoutError):
    """A round or step ran longer than ``round_timeout`` seconds; its jobs were cancelled."""


class CheckpointError(ValueError):
    """A checkpoint or model file that cannot be read safely: missing or truncated files,
    a checksum that does not match, declared sizes that do not match the content."""


class CheckpointMismatch(ValueError):
    """``resume=True`` found a checkpoint written by another fit: the first of its settings that
    differs from this fit's.  ``ValueError`` is its base (a wrong argument: the folder).

    The message names the option that sets the folder, ``folder_option``: the trainers'
    ``checkpoint_dir`` or the Estimators' ``checkpointDir`` (:meth:`for_option`).

    Attributes:
        path: the checkpoint's folder.
        setting: what differs: ``"layers"``, a trainer setting (``"sync"``, ``"mode"``...),
            ``"optimizer"`` or ``"epochs"``.
        saved: the checkpoint's value of it.
        current: this fit's value.
        folder_option: the name of the option that sets the checkpoint folder.
    """

    def __init__(self, path: str, setting: str, saved: Any, current: Any,
                 folder_option: str = "checkpoint_dir") -> None:
        self.path, self.setting, self.saved, self.current = path, setting, saved, current
        self.folder_option = folder_option
        super().__init__(self._message())

    def for_option(self, folder_option: str) -> "CheckpointMismatch":
        """The same mismatch, its message naming ``folder_option`` as the folder's option."""
        return CheckpointMismatch(self.path, self.setting, self.saved, self.current,
                                  folder_option)

    def _message(self) -> str:
        where, new = f"checkpoint {self.path}", f"a new {self.folder_option}"
        if self.setting == "layers":
            return (f"{where} belongs to another network (its layers differ from the model's); "
                    f"resume with the same architecture or {new}")
        if self.setting == "optimizer":
            return (f"{where} holds {self.saved!r} optimizer state, this trainer's optimizer is "
                    f"{self.current!r}: resume with the same optimizer or {new}")
        if self.setting == "epochs":
            return (f"{where} is at epoch {self.saved}, past epochs={self.current}: epochs is the "
                    "total to reach, pass a larger one")
        return (f"{where} was written with {self.setting}={self.saved!r}, this fit has "
                f"{self.setting}={self.current!r}: resume with the same setting (and data), or "
                f"{new}")

    def __reduce__(self) -> tuple:
        return (CheckpointMismatch, (self.path, self.setting, self.saved, self.current,
                                     self.folder_option))


class WorkerSetupError(RuntimeError):
    """The executors cannot run this sparknet: their Python lacks it (or a package it needs)
    or holds another version than the driver's.  The message says how to ship it."""


class DataError(ValueError):
    """A row that a task on an executor cannot use: a null, a row of another length than the
    network's input, NaN or infinity.  The message names the column, what is wrong and the fix.

    Raised on the driver by the call that ran the job (``fit``, or the action on a DataFrame
    that ``transform`` returned: ``collect``, ``show``, ``write``...), not wrapped in Spark's
    errors.  ``ValueError`` is its base, as for bad data found on the driver."""


class TaskError(RuntimeError):
    """sparknet's own code failed in a task on an executor for another reason than the data;
    the message is the task's (its trace is in the log at debug level, logger
    ``sparknet.tasks``)."""


#: The errors that cross from a task to the driver as themselves, by their class name
#: (``sparknet.errors.<name>`` is what a Python worker's traceback says it raised).
TASK_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (DataError, TaskError, TrainingDiverged, CheckpointError,
                                  WorkerSetupError)
}


class InputRankError(ValueError):
    """A layer was built for per-sample inputs with another number of axes than it reads:
    a ``Conv2D`` or a 2-D pool given vectors, a recurrent layer, ``Conv1D`` or attention
    given anything but sequences.  ``ValueError`` is its base, as for any bad shape.

    Attributes:
        layout: what the layer reads, e.g. ``"images (H, W, C)"``, ``"sequences (T, F)"``.
        rank: the number of axes of one sample the layer reads (3 for images, 2 for
            sequences).
        got: the per-sample shape it was given.
        index: the layer's place in its ``Sequential`` (None when built alone).
    """

    def __init__(self, message: str, *, layout: str, rank: int, got: tuple[int, ...],
                 index: int | None = None) -> None:
        super().__init__(message)
        self.layout = layout
        self.rank = int(rank)
        self.got = tuple(int(d) for d in got)
        self.index = index

    def at(self, index: int, prefix: str) -> "InputRankError":
        """The same error as raised by layer ``index`` of a model, its message after
        ``prefix`` (``Sequential.build`` names the layer)."""
        return InputRankError(f"{prefix}{self}", layout=self.layout, rank=self.rank, got=self.got,
                              index=index)

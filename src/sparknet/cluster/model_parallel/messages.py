"""What crosses between the driver and the slots of a model-parallel network, typed.

A block job (:mod:`~sparknet.cluster.model_parallel.jobs`) carries its small fields itself;
its batch-sized arrays travel apart, as :class:`JobInputs`: the layer input ``x``, the output
delta ``dy``, a summed gradient piece ``g`` and the next batch's input ``x_next`` (a
:class:`~sparknet.cluster.model_parallel.jobs.ChainJob`'s: one :class:`JobInputs` per job, in
``parts``).  On Spark they go in one broadcast per job, encoded by :meth:`JobInputs.encode`
into a plain dict of the same array objects (no copy; a form every engine can size and
ship) and decoded on the slot by :meth:`JobInputs.decode`; the in-process backend passes
them through the same two steps.

Each slot answers with one of the frozen dataclasses below (or a bare array, a tuple of a
gradient piece's rows, ``None``), wrapped by the Spark backend in a :class:`SlotReply`.
:func:`~sparknet.cluster.engine.sizes.nbytes` counts the array bytes of any of them, for the
driver's byte counters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional

import numpy as np

#: the encoded form of :class:`JobInputs`: field name -> array (``"g"``: a tuple of arrays;
#: ``"parts"``: a tuple of encoded inputs)
Wire = dict[str, Any]

_ARRAYS = ("x", "dy", "g", "x_next")


class MissingInput(ValueError):
    """A block job was sent without an input it needs."""


@dataclass(frozen=True)
class JobInputs:
    """The batch-sized arrays of one block job; a field is ``None`` when not sent."""

    #: the stage's input rows (forward)
    x: Optional[np.ndarray] = None
    #: the stage's output delta (backward)
    dy: Optional[np.ndarray] = None
    #: a summed gradient piece, aligned with its segments (the replicas' combine)
    g: Optional[tuple[np.ndarray, ...]] = None
    #: the next batch's input rows (the lookahead forward)
    x_next: Optional[np.ndarray] = None
    #: a chain of jobs: job ``n`` reads ``parts[n]`` (missing at the end: no inputs)
    parts: tuple["JobInputs", ...] = ()

    def need(self, job: object, name: Literal["x", "dy", "x_next"]) -> np.ndarray:
        """The array ``name``, which ``job`` cannot run without.

        Raises:
            MissingInput: it was not sent.
        """
        value = getattr(self, name)
        if value is None:
            raise self._missing(job, name)
        return value

    def need_g(self, job: object) -> tuple[np.ndarray, ...]:
        """The summed gradient piece ``g``, which ``job`` cannot run without.

        Raises:
            MissingInput: it was not sent.
        """
        if self.g is None:
            raise self._missing(job, "g")
        return self.g

    def _missing(self, job: object, name: str) -> MissingInput:
        sent = [f for f in _ARRAYS if getattr(self, f) is not None]
        return MissingInput(f"{type(job).__name__} needs the input {name!r}, which was not sent "
                            f"(sent: {', '.join(sent) or 'nothing'})")

    def part(self, n: int) -> "JobInputs":
        """The inputs of a chain's job ``n``."""
        return self.parts[n] if n < len(self.parts) else NO_INPUTS

    def encode(self) -> Wire:
        """The plain dict that travels: the fields sent, by name (the same array objects),
        and a chain's parts encoded in turn; empty when there is nothing to send."""
        out: Wire = {}
        for name in _ARRAYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.parts:
            out["parts"] = tuple(p.encode() for p in self.parts)
        return out

    @classmethod
    def decode(cls, wire: Mapping[str, Any] | None) -> "JobInputs":
        """Read back what :meth:`encode` made (``None``: nothing was sent).

        Raises:
            ValueError: ``wire`` holds a field :class:`JobInputs` does not have.
        """
        if not wire:
            return NO_INPUTS
        unknown = sorted(set(wire) - set(_ARRAYS) - {"parts"})
        if unknown:
            raise ValueError(f"block job inputs with unknown field(s) {', '.join(unknown)}")
        g = wire.get("g")
        return cls(x=wire.get("x"), dy=wire.get("dy"), g=None if g is None else tuple(g),
                   x_next=wire.get("x_next"),
                   parts=tuple(cls.decode(p) for p in wire.get("parts", ())))


#: a job's inputs when it has none
NO_INPUTS = JobInputs()


# ------------------------------------------------------------------------------ the replies
@dataclass(frozen=True)
class InitResult:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.InitJob`."""

    #: bytes of the blocks and optimizer state the slot allocated
    held: int
    #: the Python worker's process id and its daemon's (the executor's)
    pid: int
    ppid: int


@dataclass(frozen=True)
class SlotStatus:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.StatusJob`."""

    #: per held layer index: its ``[generation, step, busy]`` record (``None``: not found)
    layers: dict[int, Any]
    #: the Python worker's address-space size and limit in bytes (``None``: no limit)
    vm: int
    limit: Optional[int]
    pid: int
    ppid: int

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (:meth:`ModelParallel.status
        <sparknet.cluster.model_parallel.ModelParallel.status>`' form)."""
        return {"layers": dict(self.layers), "vm": self.vm, "limit": self.limit, "pid": self.pid,
                "ppid": self.ppid}


@dataclass(frozen=True)
class SaveResult:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.SaveJob`."""

    #: bytes of parameters and optimizer state written
    nbytes: int
    #: the arrays found not finite (``"layer <i> block <k> <param>"``): then nothing was written
    nonfinite: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackwardResult:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.BackwardJob`."""

    #: this slot's share of the input delta (``None`` unless asked)
    dx: Optional[np.ndarray]
    #: the next batch's forward output (lookahead), or ``None``
    ahead: Optional[np.ndarray]
    #: the slot's partial rows of the first gradient piece (replicas), or ``None``
    piece: Optional[tuple]
    #: whether the block's updated parameters are all finite (one replica; replicas: ``True``)
    finite: bool = True
    #: ``keep``: this slot's share of the squared gradient norm (clamped by value)
    sumsq: float = 0.0


@dataclass(frozen=True)
class ApplyResult:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.ApplyJob`: its partial
    rows of the next piece to combine, or after the last piece the lookahead's output."""

    #: the slot's partial rows of the ``gather`` piece (``None`` for other blocks' segments)
    piece: Optional[tuple] = None
    #: the next batch's forward output (``prefetch`` after the last piece), or ``None``
    ahead: Optional[np.ndarray] = None


@dataclass(frozen=True)
class ScaledResult:
    """A slot's answer to :class:`~sparknet.cluster.model_parallel.jobs.ScaledApplyJob`."""

    #: whether the block's updated parameters are all finite
    finite: bool
    #: the next batch's forward output (``prefetch``), or ``None``
    ahead: Optional[np.ndarray] = None


@dataclass(frozen=True)
class SlotReply:
    """What a Spark task returns: the job's answer and where and how long it ran."""

    #: what :meth:`BlockJob.run <sparknet.cluster.model_parallel.jobs.BlockJob.run>` returned
    result: Any
    #: the Python daemon's parent (the executor process) that ran the task
    ppid: int
    #: seconds reading the job's broadcast, and running the job
    read_s: float
    compute_s: float

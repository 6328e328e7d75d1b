"""Typed block jobs: the messages the driver sends to its executor slots.

Each kind of job is a frozen dataclass whose :meth:`BlockJob.run` runs it on one slot's
resident store; the small fields travel with the task, the batch-sized arrays in one
broadcast per job (its :class:`~sparknet.cluster.model_parallel.messages.JobInputs`), and each
answers with a typed reply of :mod:`~sparknet.cluster.model_parallel.messages`.  Layers travel as
:class:`~sparknet.cluster.model_parallel.block_partition.BlockedLayer` objects and the optimizer as
an
:class:`~sparknet.optim.Optimizer` (its hyper-parameters; blocks keep their state).

Slots are laid out by :class:`Layout`: with ``D`` replicas of ``K`` blocks, slot
``r * K + k`` holds block ``k`` of every blocked layer for replica ``r``.  With replicas,
a backward job keeps each slot's *partial* gradient resident; the driver then combines
the partials over the replicas :class:`Piece` by piece (:func:`plan_pieces`,
:func:`sum_piece`) and :class:`ApplyJob` applies each summed piece.

Clipping by the global norm (``clipnorm``) needs every block's gradient before any block
is updated: the backward job (``keep=True``) keeps each block's gradient resident and
returns its squared norm (with replicas the combine stores the summed pieces instead of
applying them, ``store=True``, and the driver adds up their squares), and after the whole
backward pass one :class:`ScaledApplyJob` per stage, chained in one Spark job, applies the
kept gradients times the factor the driver computed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from sparknet import precision as precision_mod
from sparknet.cluster.model_parallel import executor as ex
from sparknet.cluster.model_parallel.block_partition import BlockedLayer
from sparknet.cluster.model_parallel.files import load_block, save_block
from sparknet.cluster.model_parallel.messages import (
    ApplyResult,
    BackwardResult,
    InitResult,
    JobInputs,
    SaveResult,
    ScaledResult,
    SlotStatus,
)
from sparknet.optim import Optimizer


@dataclass(frozen=True)
class Layout:
    """Slots of ``replicas`` (D) groups of ``blocks`` (K): slot ``r * K + k`` is block ``k`` of
    replica ``r``."""

    blocks: int
    replicas: int = 1

    @property
    def n_slots(self) -> int:
        return self.blocks * self.replicas

    def block(self, slot: int) -> int:
        return slot % self.blocks

    def replica(self, slot: int) -> int:
        return slot // self.blocks

    def slot(self, replica: int, block: int) -> int:
        return replica * self.blocks + block


def shard_rows(n: int, replicas: int) -> tuple[int, ...]:
    """Offsets ``[0, ..., n]`` of ``replicas`` near-equal row shards of a batch of ``n``
    (a shard may be empty when ``n < replicas``)."""
    base, extra = divmod(int(n), int(replicas))
    sizes = [base + (1 if r < extra else 0) for r in range(replicas)]
    return tuple(int(v) for v in np.concatenate([[0], np.cumsum(sizes)]))


# ------------------------------------------------------------------- pieces of gradient
@dataclass(frozen=True)
class Segment:
    """Rows ``r0:r1`` of parameter ``key`` (``"<layer>.kernel"``/``"<layer>.bias"``) of block
    ``block``."""

    block: int
    key: str
    r0: int
    r1: int


Piece = tuple[Segment, ...]


def plan_pieces(layers: Sequence[BlockedLayer], replicas: int, itemsize: int,
                budget: int) -> tuple[Piece, ...]:
    """Cut the gradients of every block of ``layers`` into pieces whose partials, gathered
    from all ``replicas``, take at most ``budget`` bytes (a single row larger than the
    budget makes a piece of its own).  Small nets get one piece holding every block."""
    pieces: list[Piece] = []
    cur: list[Segment] = []
    room = budget
    for layer in layers:
        for k in range(layer.blocks):
            for pname, shape in layer.param_shapes(k).items():
                rows, row_bytes = shape[0], replicas * itemsize * int(np.prod(shape[1:]))
                r0 = 0
                while r0 < rows:
                    fit = room // row_bytes
                    if fit <= 0:
                        if cur:
                            pieces.append(tuple(cur))
                            cur, room = [], budget
                            continue
                        fit = 1
                    r1 = min(rows, r0 + fit)
                    cur.append(Segment(k, f"{layer.index}.{pname}", r0, r1))
                    room -= (r1 - r0) * row_bytes
                    r0 = r1
    if cur:
        pieces.append(tuple(cur))
    return tuple(pieces)


def _gather_piece(store: ex.Store, k: int, piece: Piece) -> tuple[np.ndarray | None, ...]:
    """This slot's partial rows of ``piece`` (``None`` for the segments of other blocks)."""
    return tuple(ex.partial_rows(store, s.key, s.r0, s.r1) if s.block == k else None for s in piece)


def sum_piece(piece: Piece, gathered: Sequence[Any], layout: Layout) -> tuple[np.ndarray, ...]:
    """Driver side: each segment's partials summed over the replicas (``gathered``: per slot,
    the tuple :func:`_gather_piece` returned)."""
    out = []
    for n, seg in enumerate(piece):
        acc = gathered[layout.slot(0, seg.block)][n]
        if not acc.flags.writeable:
            acc = acc.copy()
        for r in range(1, layout.replicas):
            acc += gathered[layout.slot(r, seg.block)][n]
        out.append(acc)
    return tuple(out)


# ------------------------------------------------------------------------------ the jobs
@dataclass(frozen=True)
class BlockJob:
    """A job on every slot; :meth:`run` is what one slot does (``None``: nothing to do).

    A job reads the inputs it needs before it touches its blocks: one sent without them
    fails with :class:`~sparknet.cluster.model_parallel.messages.MissingInput` and changes
    nothing."""

    layout: Layout
    layers: tuple[BlockedLayer, ...]

    def holds(self, slot: int, layer: BlockedLayer | None = None) -> bool:
        """Whether ``slot`` holds a block of ``layer`` (default: the job's first layer)."""
        return self.layout.block(slot) < (layer or self.layers[0]).blocks

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class InitJob(BlockJob):
    """Allocate this slot's blocks of every blocked layer and initialise them (seeded per
    layer and block, so replicas start equal) or stream them from a saved ``load`` folder."""

    dtype: str = "float32"
    seed: int = 0
    opt: Optional[Optimizer] = None
    generation: int = 0
    load: Optional[str] = None

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        assert self.opt is not None
        k, dtype = self.layout.block(slot), np.dtype(self.dtype)
        mine = [layer for layer in self.layers if self.holds(slot, layer)]
        held = ex.held_bytes(mine, k, dtype, self.opt, self.layout.replicas)
        if mine:
            ex.check_fits(slot, held, "its blocks of layer(s) "
                                      f"{', '.join(str(m.index) for m in mine)} (weights and "
                                      "optimizer state)")
        arrays = ex.Arrays(store)
        for layer in mine:
            ex.allocate_block(store, layer, k, dtype, self.opt, self.layout.replicas)
            if self.load is None:
                ex.fill_kernel(arrays[f"{layer.index}.kernel"], layer, self.seed, k)
            else:
                load_block(arrays, layer, k, self.load, self.opt.state_keys())
            ex.write_state(store, layer, self.generation, 0)
        return InitResult(held, os.getpid(), os.getppid())


@dataclass(frozen=True)
class StatusJob(BlockJob):
    """Each held layer's ``[generation, step, busy]`` record and the worker's memory."""

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        return SlotStatus(ex.layer_records(store, self.layers, self.layout.block(slot)),
                          ex.vm_size(), ex.mem_limit(), os.getpid(), os.getppid())


@dataclass(frozen=True)
class PrecisionJob(BlockJob):
    """Whether each slot's executor runs ``precision="bf16"`` on a bfloat16 kernel."""

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        return precision_mod.available()


@dataclass(frozen=True)
class GatherJob(BlockJob):
    """Copies of the blocks' ``keys`` from the slots of one replica (the others return ``None``)."""

    keys: tuple[str, ...] = ("kernel", "bias")
    replica: int = 0

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        if self.layout.replica(slot) != self.replica:
            return None
        return {layer.index: ex.gather(store, layer, self.keys) for layer in self.layers
                if self.holds(slot, layer)}


@dataclass(frozen=True)
class SaveJob(BlockJob):
    """Replica 0's slots stream their blocks into ``folder`` (replicas are identical), after
    checking every array is finite: a slot holding a NaN or an infinity writes nothing and
    names the arrays (so no file of a diverged state is ever written)."""

    folder: str = ""
    opt: Optional[Optimizer] = None
    generation: int = 0
    steps: tuple[int, ...] = ()

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        assert self.opt is not None
        if self.layout.replica(slot) != 0:
            return None
        arrays, k = ex.Arrays(store), self.layout.block(slot)
        mine = [layer for layer, step in zip(self.layers, self.steps) if self.holds(slot, layer)]
        for layer, step in zip(self.layers, self.steps):
            if self.holds(slot, layer):
                ex.check_state(arrays, slot, layer, self.generation, step)
        bad = [name for layer in mine for name in ex.nonfinite(arrays, layer, k,
                                                               self.opt.state_keys())]
        if bad:
            return SaveResult(0, tuple(bad))
        return SaveResult(sum(save_block(arrays, layer, k, self.folder, self.opt.state_keys())
                              for layer in mine))


@dataclass(frozen=True)
class _StageJob(BlockJob):
    """A job on one stage's layers (a blocked layer, or the two of a pair) at one step."""

    generation: int = 0
    step: int = 0
    #: row offsets of the replicas' shards of the batch (``None``: one replica, the whole batch)
    shards: Optional[tuple[int, ...]] = None
    #: ``"bf16"``: the block's products on bfloat16 operands (where this executor has the kernel)
    precision: str = "fp32"

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16" and precision_mod.available()

    def rows(self, slot: int, x: np.ndarray) -> np.ndarray:
        if self.shards is None:
            return x
        r = self.layout.replica(slot)
        return x[self.shards[r]:self.shards[r + 1]]

    def forward(self, store: ex.Store, slot: int, x: np.ndarray, step: int,
                training: bool) -> np.ndarray:
        if len(self.layers) == 1:
            return ex.forward_rows(store, slot, self.layers[0], x, self.generation, step, training,
                                   self.bf16)
        a, b = self.layers
        return ex.forward_pair(store, slot, a, b, x, self.generation, step, training, self.bf16)


@dataclass(frozen=True)
class ForwardJob(_StageJob):
    """Forward of the stage for this slot's block (and its replica's shard of ``data.x``)."""

    training: bool = False

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        if not self.holds(slot):
            return None
        return self.forward(store, slot, self.rows(slot, data.need(self, "x")), self.step,
                            self.training)


def with_precision(job: BlockJob, precision: str) -> BlockJob:
    """``job`` (and the jobs of a :class:`ChainJob`) with the stage jobs' products in
    ``precision``."""
    if isinstance(job, _StageJob) and job.precision != precision:
        return dataclasses.replace(job, precision=precision)
    if isinstance(job, ChainJob):
        return dataclasses.replace(job, jobs=tuple(with_precision(j, precision) for j in job.jobs))
    return job


@dataclass(frozen=True)
class ChainJob(BlockJob):
    """Several jobs as one Spark job: each slot runs ``jobs`` in order, job ``n`` reading
    ``data.part(n)``, and returns their results as a tuple (aligned with ``jobs``)."""

    jobs: tuple[BlockJob, ...] = ()

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        return tuple(job.run(store, slot, data.part(n)) for n, job in enumerate(self.jobs))


@dataclass(frozen=True)
class BackwardJob(_StageJob):
    """Backward of the stage for this slot's block from ``data.dy``.

    One replica: the block is updated in place (``opt.apply`` row chunk by row chunk) and
    ``prefetch`` runs the forward of ``data.x_next`` with the new weights; with ``keep``
    (``clipnorm``) the gradient is kept resident instead, clamped by value, and its squared
    norm returned (the block's record then says busy 1, as with replicas).  Replicas:
    the partial gradient of the replica's shard is kept resident and the first piece to
    combine (``gather``) is returned at once.
    """

    need_dx: bool = True
    opt: Optional[Optimizer] = None
    t: int = 0
    prefetch: bool = False
    gather: Optional[Piece] = None
    keep: bool = False

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        assert self.opt is not None
        if not self.holds(slot):
            return None
        dy = self.rows(slot, data.need(self, "dy"))
        x_next = data.need(self, "x_next") if self.prefetch else None
        alone = self.layout.replicas == 1
        now = ex.ApplyNow(self.opt, self.t)
        kept = ex.KeepForClip(self.opt)
        sink: ex.Sink = (kept if self.keep else now) if alone else ex.keep_partial
        done = (self.step + 1, 0) if alone and not self.keep else (self.step, 1)
        g, step = self.generation, self.step
        if len(self.layers) == 1:
            lo, hi = self.layers[0].span(self.layout.block(slot))
            dx = ex.backward_rows(store, slot, self.layers[0], dy[:, lo:hi], self.need_dx, g, step,
                                  sink, done, self.bf16)
        else:
            a, b = self.layers
            dx = ex.backward_pair(store, slot, a, b, dy, self.need_dx, g, step, sink, done,
                                  self.bf16)
        ahead = None if x_next is None else self.forward(store, slot, x_next, step + 1, True)
        piece = _gather_piece(store, self.layout.block(slot), self.gather) if self.gather else None
        return BackwardResult(dx, ahead, piece, now.finite, kept.sumsq)


@dataclass(frozen=True)
class ApplyJob(_StageJob):
    """Replicas: apply the summed gradient piece ``number`` (``data.g``, aligned with
    ``piece``) to this slot's block, then return its partial rows of the ``gather`` piece --
    or, after the ``last`` piece with ``prefetch``, the forward of its replica's shard of
    ``data.x_next`` with the new weights (lookahead).

    The ``busy`` field of each block's record counts the pieces applied (``1 + number``
    before, ``-1`` while applying), so a piece applied twice or skipped is caught; after
    the ``last`` piece the block is at ``step + 1``.  With ``store`` (``clipnorm``) the
    pieces are stored in the blocks' gradient buffers instead of applied, and after the
    last the block waits (busy ``2 + number``) for :class:`ScaledApplyJob`.
    """

    opt: Optional[Optimizer] = None
    t: int = 0
    piece: Piece = ()
    number: int = 0
    last: bool = True
    gather: Optional[Piece] = None
    prefetch: bool = False
    store: bool = False

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        assert self.opt is not None
        if not self.holds(slot):
            return None
        summed = data.need_g(self)
        x_next = (self.rows(slot, data.need(self, "x_next")) if self.last and self.prefetch
                  else None)
        arrays, k = ex.Arrays(store), self.layout.block(slot)
        records = [ex.check_state(arrays, slot, layer, self.generation, self.step,
                                  busy=1 + self.number)
                   for layer in self.layers]
        for st in records:
            st[2] = -1
        for seg, g in zip(self.piece, summed):
            if seg.block == k and self.store:
                ex.store_summed(store, seg.key, seg.r0, seg.r1, g)
            elif seg.block == k:
                ex.apply_summed(store, seg.key, seg.r0, seg.r1, g, self.opt, self.t)
        for st in records:
            if self.last and not self.store:
                st[1], st[2] = self.step + 1, 0
            else:
                st[2] = 2 + self.number
        if x_next is not None:
            return ApplyResult(ahead=self.forward(store, slot, x_next, self.step + 1, True))
        return ApplyResult(piece=_gather_piece(store, k, self.gather)) if self.gather else None


@dataclass(frozen=True)
class ScaledApplyJob(_StageJob):
    """``clipnorm``: apply each block's kept gradient times ``factor`` (the clip of the norm
    over every block and driver layer), after checking the record says busy ``busy`` (the
    gradient kept: 1, or ``1 + pieces`` after a replicas' combine); the block then is at
    ``step + 1``.  ``prefetch`` runs the forward of the replica's shard of
    ``data.x_next`` with the new weights (lookahead)."""

    opt: Optional[Optimizer] = None
    t: int = 0
    factor: float = 1.0
    busy: int = 1
    prefetch: bool = False

    def run(self, store: ex.Store, slot: int, data: JobInputs) -> Any:
        assert self.opt is not None
        if not self.holds(slot):
            return None
        x_next = self.rows(slot, data.need(self, "x_next")) if self.prefetch else None
        arrays, k = ex.Arrays(store), self.layout.block(slot)
        records = [ex.check_state(arrays, slot, layer, self.generation, self.step, busy=self.busy)
                   for layer in self.layers]
        for st in records:
            st[2] = -1
        finite = True
        for layer in self.layers:
            for pname in layer.param_shapes(k):
                finite = ex.apply_kept(arrays, f"{layer.index}.{pname}", self.opt, self.t,
                                       self.factor) and finite
        for st in records:
            st[1], st[2] = self.step + 1, 0
        ahead = (None if x_next is None
                 else self.forward(store, slot, x_next, self.step + 1, True))
        return ScaledResult(finite, ahead)

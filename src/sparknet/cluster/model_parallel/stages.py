"""The stages of a model-parallel network, in order: runs of layers on the driver, single
blocked layers and Megatron pairs on the executors.  Each is a :class:`Stage`.

With ``D`` replicas a blocked stage's jobs give slot ``(r, k)`` the replica's shard of
the batch; the driver assembles the full-batch activation and input delta, and after
the backward job combines each block's partial gradients over the replicas through the
driver, piece by piece (:func:`combine`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

import sparknet._activations as _activations
from sparknet import optim as optim_mod
from sparknet.cluster.blocks import BlockedLayer
from sparknet.cluster.model_parallel.jobs import ApplyJob, BackwardJob, ForwardJob, sum_piece
from sparknet.layers.base import Layer

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel import ModelParallel


class Stage(Protocol):
    """One step of the network's forward and backward pass."""

    kind: str

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        """The stage's output for ``x``; with ``training`` it keeps what backward needs."""
        ...

    def backward(self, g: np.ndarray, need_dx: bool, next_x: np.ndarray | None = None) -> np.ndarray | None:
        """Backpropagate the output delta ``g``, update the stage's weights, and return the
        input delta (``None`` unless ``need_dx``).  A blocked stage may run the forward of
        ``next_x`` in the same job (lookahead)."""
        ...


def nbytes(a: Any) -> int:
    """Bytes of the arrays in ``a`` (nested tuples and lists; anything else counts 0)."""
    if isinstance(a, (tuple, list)):
        return sum(nbytes(v) for v in a)
    return int(a.nbytes) if isinstance(a, np.ndarray) else 0


class DriverStage:
    """A run of unblocked layers on the driver: a Sequential segment and its optimizer."""

    kind = "driver"

    def __init__(self, owner: "ModelParallel", first: int, layers: list[Layer], in_shape: Sequence[int]) -> None:
        from sparknet.model import Sequential

        self.owner, self.first = owner, first
        self.seq = Sequential(layers, input_shape=tuple(in_shape), dtype=owner.dtype, seed=owner.seed)
        self.is_head = first + len(layers) == len(owner.layers)
        last = layers[-1]
        if not self.is_head and hasattr(last, "emit_logits"):
            last.emit_logits = False
        # initialise like a full single-process model of the same seed would
        for j, layer in enumerate(layers):
            views = {name: self.seq.params[a:b].reshape(shape)
                     for name, (a, b, shape) in self.seq.param_slices()[j].items()}
            layer.init_params(views, np.random.default_rng([owner.seed, first + j]))
            layer.rng = np.random.default_rng([owner.seed, first + j, 1])
        self.opt = owner.new_optimizer()

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        return self.seq.forward(x, training=training)

    def backward(self, g: np.ndarray, need_dx: bool, next_x: np.ndarray | None = None) -> np.ndarray | None:
        dx = self.seq.backward(g, input_grad=need_dx)
        if self.seq.n_params:
            self.opt.step(self.seq.params, self.seq.grads)
        return dx


def _per_replica(owner: "ModelParallel", parts: list, blocks: int,
                 join: Callable[[list], np.ndarray]) -> np.ndarray:
    """Join each replica's block results (``join``: concatenate or sum over the blocks), then
    stack the replicas' row shards."""
    lay = owner.layout
    rows = [join([parts[lay.slot(r, k)] for k in range(blocks)]) for r in range(lay.replicas)]
    return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)


def _concat(parts: list) -> np.ndarray:
    return np.concatenate(parts, axis=1)


def _sum(parts: list) -> np.ndarray:
    acc = parts[0]
    for p in parts[1:]:
        acc += p
    return acc


def combine(owner: "ModelParallel", layers: tuple[BlockedLayer, ...], step: int, gathered: list) -> None:
    """Sum each block's partial gradients over the replicas and apply them, piece by piece.

    ``gathered`` holds the slots' partial rows of the first piece (from the backward job)
    and is emptied as soon as they are summed, so the driver holds about two pieces of
    gradient at a time: the summed piece it broadcasts and the next piece it collects in
    the same job.
    """
    o = owner
    pieces = o.pieces(layers)
    readers = layers[0].blocks * o.layout.replicas
    for n, piece in enumerate(pieces):
        summed = sum_piece(piece, gathered, o.layout)
        o.count_combined(nbytes(gathered))
        gathered.clear()
        nxt = pieces[n + 1] if n + 1 < len(pieces) else None
        job = ApplyJob(o.layout, layers, generation=o.generation, step=step, opt=o.job_optimizer, t=o.t,
                       piece=piece, number=n, last=nxt is None, gather=nxt)
        o.count_combined(nbytes(summed))
        gathered.extend(o.run_job(job, {"g": summed}, readers))
        del summed


class _Blocked:
    """What a single blocked layer and a pair share: the jobs and the replicas' combine."""

    kind = "blocked"
    layers: tuple[BlockedLayer, ...]

    def __init__(self, owner: "ModelParallel") -> None:
        self.owner = owner
        #: (input object, output) of a forward pass computed ahead, in the previous backward job
        self._pre: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def blocks(self) -> int:
        return self.layers[0].blocks

    def _take_ahead(self, x: np.ndarray, training: bool) -> np.ndarray | None:
        pre, self._pre = self._pre, None
        return pre[1] if (pre is not None and pre[0] is x and training) else None

    def _forward_job(self, x2: np.ndarray, training: bool) -> list:
        o = self.owner
        job = ForwardJob(o.layout, self.layers, generation=o.generation, step=o.step_of(self.layers[0]),
                         shards=o.shards(x2.shape[0]), training=bool(training))
        return o.run_job(job, {"x": x2}, self.blocks * o.layout.replicas)

    def _backward_job(self, dy: np.ndarray, need_dx: bool, next_x: np.ndarray | None) -> list:
        """Run the backward job (and, with replicas, the combine); returns the slots'
        :class:`~sparknet.cluster.model_parallel.jobs.BackwardResult`\\ s without their pieces."""
        o = self.owner
        step = o.step_of(self.layers[0])
        hybrid = o.layout.replicas > 1
        data = {"dy": dy}
        if next_x is not None:
            data["x_next"] = np.ascontiguousarray(next_x.reshape(-1, self.layers[0].in_features), dtype=o.dtype)
        job = BackwardJob(o.layout, self.layers, generation=o.generation, step=step,
                          shards=o.shards(dy.shape[0]), need_dx=bool(need_dx), opt=o.job_optimizer, t=o.t,
                          prefetch=next_x is not None, gather=o.pieces(self.layers)[0] if hybrid else None)
        out = o.run_job(job, data, self.blocks * o.layout.replicas)
        if hybrid:
            gathered = [None if r is None else r.piece for r in out]
            out = [None if r is None else r._replace(piece=None) for r in out]
            combine(o, self.layers, step, gathered)
        for layer in self.layers:
            o.advance(layer)
        return out

    def _input_delta(self, out: list, lead: tuple, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        dx = _per_replica(self.owner, [None if r is None else r.dx for r in out], self.blocks, _sum)
        return dx.reshape(lead + (self.layers[0].in_features,))


class BlockStage(_Blocked):
    """One blocked dense layer cut by output neurons."""

    kind = "block"

    def __init__(self, owner: "ModelParallel", spec: BlockedLayer) -> None:
        super().__init__(owner)
        self.spec = spec
        self.layers = (spec,)

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        s = self.spec
        lead = x.shape[:-1]
        ahead = self._take_ahead(x, training)
        if ahead is not None:
            return ahead
        x2 = np.ascontiguousarray(x.reshape(-1, s.in_features), dtype=self.owner.dtype)
        y = _per_replica(self.owner, self._forward_job(x2, training), s.blocks, _concat)
        return y.reshape(lead + (s.units,))

    def backward(self, g: np.ndarray, need_dx: bool, next_x: np.ndarray | None = None) -> np.ndarray | None:
        s = self.spec
        lead = g.shape[:-1]
        g2 = np.ascontiguousarray(g.reshape(-1, s.units), dtype=self.owner.dtype)
        out = self._backward_job(g2, need_dx, next_x)
        if next_x is not None:
            y = _per_replica(self.owner, [None if r is None else r.ahead for r in out], s.blocks, _concat)
            self._pre = (next_x, y.reshape(next_x.shape[:-1] + (s.units,)))
        return self._input_delta(out, lead, need_dx)


class PairStage(_Blocked):
    """Two blocked dense layers: the first cut by output, the second by input neurons;
    the second layer's bias lives here, on the driver."""

    kind = "pair"

    def __init__(self, owner: "ModelParallel", a: BlockedLayer, b: BlockedLayer) -> None:
        super().__init__(owner)
        self.a, self.b = a, b
        self.layers = (a, b)
        self.bias = np.zeros(b.units, dtype=owner.dtype) if b.use_bias else None
        self.opt: optim_mod.Optimizer = owner.new_optimizer()
        self._y: np.ndarray | None = None

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        a, b = self.a, self.b
        lead = x.shape[:-1]
        z = self._take_ahead(x, training)
        if z is None:
            x2 = np.ascontiguousarray(x.reshape(-1, a.in_features), dtype=self.owner.dtype)
            z = _per_replica(self.owner, self._forward_job(x2, training), a.blocks, _sum)
        if self.bias is not None:
            z += self.bias
        if b.kernel_activation:
            _activations.forward(b.kernel_activation, z)
        self._y = z
        return z.reshape(lead + (b.units,))

    def backward(self, g: np.ndarray, need_dx: bool, next_x: np.ndarray | None = None) -> np.ndarray | None:
        b = self.b
        lead = g.shape[:-1]
        dz = np.array(g.reshape(-1, b.units), dtype=self.owner.dtype, order="C")
        if b.kernel_activation:
            assert self._y is not None
            _activations.backward(b.kernel_activation, self._y, dz)
        out = self._backward_job(dz, need_dx, next_x)
        if self.bias is not None:
            self.opt.step(self.bias, dz.sum(axis=0, dtype=self.owner.dtype))
        if next_x is not None:      # bias and activation are added when it is used
            self._pre = (next_x, _per_replica(self.owner, [None if r is None else r.ahead for r in out],
                                              b.blocks, _sum))
        return self._input_delta(out, lead, need_dx)

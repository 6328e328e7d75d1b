"""The stages of a model-parallel network, in order: runs of layers on the driver, single
blocked layers and Megatron pairs on the executors.  Each is a :class:`Stage`.

With ``D`` replicas a blocked stage's jobs give slot ``(r, k)`` the replica's shard of
the batch; the driver assembles the full-batch activation and input delta, and after
the backward job combines each block's partial gradients over the replicas through the
driver, piece by piece (:func:`combine`).

With ``clipnorm`` the norm spans every stage, so no stage updates during the backward pass:
each records its gradient's squared norm with :class:`NormClip` (driver layers keep their
gradient buffers, blocks keep theirs resident), and when the first stage's backward ends,
:meth:`NormClip.finish` scales and steps the driver layers and runs one Spark job in which
every block applies its kept gradient times the factor (the first stage's lookahead forward
rides in it).  That is one Spark job more per step.  ``clipvalue`` alone is elementwise and
changes nothing here.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

import sparknet._activations as _activations
from sparknet import optim as optim_mod
from sparknet.cluster.engine.sizes import nbytes
from sparknet.cluster.model_parallel.block_partition import BlockedLayer
from sparknet.cluster.model_parallel.jobs import (
    ApplyJob,
    BackwardJob,
    BlockJob,
    ChainJob,
    ForwardJob,
    ScaledApplyJob,
    sum_piece,
)
from sparknet.cluster.model_parallel.messages import (
    ApplyResult,
    BackwardResult,
    JobInputs,
    ScaledResult,
)
from sparknet.cluster.model_parallel.stage_protocols import Stage, StageOwner
from sparknet.errors import TrainingDiverged
from sparknet.layers.base import Layer
from sparknet.optim import Optimizer


class NonFinite(ArithmeticError):
    """A stage met a NaN or an infinity (``what``: ``"gradient"``, ``"delta"``) before
    updating its weights; :class:`~sparknet.cluster.model_parallel.ModelParallel` turns
    it into :class:`~sparknet.errors.TrainingDiverged`."""

    def __init__(self, what: str, where: str) -> None:
        super().__init__(f"{what} of {where} is not finite")
        self.what, self.where = what, where


class HalfStep(TrainingDiverged):
    """Training diverged *after* some weights of the step were updated (non-finite blocked
    parameters, or a delta that overflowed between stages): the model no longer holds the
    previous step's weights; :meth:`ModelParallel.fit` restores them from its checkpoints."""


def check_finite(a: np.ndarray, what: str, where: str) -> None:
    """Raise :class:`NonFinite` when ``a`` holds a NaN or an infinity."""
    if not np.isfinite(a).all():
        raise NonFinite(what, where)


class NormClip:
    """Clipping by the norm of the step's whole gradient, over every stage (``clipnorm``).

    During the backward pass each stage adds its gradient's squared norm (after the clamp
    by value) and says what to update: driver parameters with their gradient buffer
    (:meth:`add_driver`), blocked stages whose blocks keep their gradient resident
    (:meth:`add_blocked`).  :meth:`finish`, at the end of the first stage's backward,
    computes the factor (``torch.nn.utils.clip_grad_norm_``'s) and applies everything.
    """

    def __init__(self, owner: StageOwner) -> None:
        self.owner = owner
        self.reset()

    def reset(self) -> None:
        """Forget the step so far (the last stage's backward starts a step)."""
        self.sumsq = 0.0
        self.driver: list[tuple[Optimizer, np.ndarray, np.ndarray]] = []
        self.blocked: list[tuple[_Blocked, int, int]] = []

    def add_driver(self, opt: Optimizer, params: np.ndarray, grads: np.ndarray) -> None:
        """Driver parameters and their gradient (clamped here by value, in place)."""
        self.sumsq += opt.clip_part(grads)
        self.driver.append((opt, params, grads))

    def add_blocked(self, stage: "_Blocked", step: int, busy: int, sumsq: float) -> None:
        """A blocked stage whose blocks keep their gradient at record ``(step, busy)``."""
        self.sumsq += sumsq
        self.blocked.append((stage, step, busy))

    def finish(self, first: "_Blocked | None", next_x: np.ndarray | None) -> list:
        """Scale and apply every gradient of the step; with ``next_x``, the ``first``
        stage's forward of it runs in the same job (its per-slot outputs are returned)."""
        o = self.owner
        factor = o.job_optimizer.clip_scale(self.sumsq)
        for opt, params, grads in self.driver:
            optim_mod.scale(grads, factor)
            opt.step(params, grads, clipped=True)
        jobs: list[BlockJob] = []
        parts: tuple[JobInputs, ...] = ()
        at = -1
        for stage, step, busy in self.blocked:
            ahead = stage is first and next_x is not None
            shards = None
            if ahead and first is not None and next_x is not None:
                x2 = np.ascontiguousarray(next_x.reshape(-1, first.layers[0].in_features),
                                          dtype=o.dtype)
                at, shards = len(jobs), o.shards(x2.shape[0])
                parts = (JobInputs(),) * at + (JobInputs(x_next=x2),)
            jobs.append(ScaledApplyJob(o.layout, stage.layers, generation=o.generation, step=step,
                                       shards=shards, opt=o.job_optimizer, t=o.t, factor=factor,
                                       busy=busy, prefetch=ahead))
        self.reset()
        if not jobs:
            return []
        # per slot, per job
        out = o.run_job(ChainJob(o.layout, (), jobs=tuple(jobs)), JobInputs(parts=parts), o.n_slots)
        replies: list[tuple[ScaledResult | None, ...]] = out
        if not all(r is None or r.finite for per_job in replies for r in per_job):
            raise NonFinite("parameters", "blocked layers (clipped step)")
        if at < 0:
            return []
        firsts = [per_job[at] for per_job in replies]
        return [None if r is None else r.ahead for r in firsts]


def _starts_step(stage: Any) -> None:
    """The last stage's backward begins a step: forget what a failed one left in the clip."""
    if stage.clip is not None and stage.owner.stages[-1] is stage:
        stage.clip.reset()


def _is_first(stage: Any) -> bool:
    return bool(stage.owner.stages[0] is stage)


class DriverStage:
    """A run of unblocked layers on the driver: a Sequential segment and its optimizer.

    Layers that keep untrained state (BatchNormalization's running statistics) keep it
    here, in the segment's ``seq.state``: updated by each training forward pass, saved and
    checkpointed with the stage's parameters (:func:`driver_arrays`), and put back as of
    the step's start when the step diverges before any weight changed (:func:`rewind_state`).
    """

    kind = "driver"
    #: the network's clip by global norm (``None``: the optimizer has no ``clipnorm``)
    clip: NormClip | None = None

    def __init__(self, owner: StageOwner, first: int, layers: list[Layer],
                 in_shape: Sequence[int]) -> None:
        from sparknet.model import Sequential

        self.owner, self.first = owner, first
        self.seq = Sequential(layers, input_shape=tuple(in_shape), dtype=owner.dtype,
                              seed=owner.seed)
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
        #: the layer state as of the last training forward pass's start (``None``: no state)
        self.state_before: np.ndarray | None = None

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        if training and self.seq.n_state:
            self.state_before = self.seq.state.copy()
        return self.seq.forward(x, training=training)

    def backward(self, g: np.ndarray, need_dx: bool,
                 next_x: np.ndarray | None = None) -> np.ndarray | None:
        _starts_step(self)
        dx = self.seq.backward(g, input_grad=need_dx)
        if self.seq.n_params:
            check_finite(self.seq.grads, "gradient",
                         f"driver layers {self.first}..{self.first + len(self.seq.layers) - 1}")
            if self.clip is not None:
                self.clip.add_driver(self.opt, self.seq.params, self.seq.grads)
            else:
                self.opt.step(self.seq.params, self.seq.grads)
        if self.clip is not None and _is_first(self):
            self.clip.finish(None, None)
        return dx


def _per_replica(owner: StageOwner, parts: list, blocks: int,
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


def combine(owner: StageOwner, layers: tuple[BlockedLayer, ...], step: int, gathered: list,
            x_next: np.ndarray | None = None, clip: NormClip | None = None) -> list | None:
    """Sum each block's partial gradients over the replicas and apply them, piece by piece.

    ``gathered`` holds the slots' partial rows of the first piece (from the backward job)
    and is emptied as soon as they are summed, so the driver holds about two pieces of
    gradient at a time: the summed piece it broadcasts and the next piece it collects in
    the same job.  With ``x_next`` the last apply job also runs the stage's forward of the
    next batch (returned per slot), with the new weights; without, the last apply is
    deferred into the step's next job (the next stage's backward job, or a job of its own
    at the end of the step).  With ``clip`` the summed pieces are clamped by value, their
    squares added to the clip's norm, and stored in the blocks (applied by
    :meth:`NormClip.finish`).
    """
    o = owner
    pieces = o.pieces(layers)
    readers = layers[0].blocks * o.layout.replicas
    for n, piece in enumerate(pieces):
        summed = sum_piece(piece, gathered, o.layout)
        if clip is not None:
            clip.sumsq += sum(o.job_optimizer.clip_part(g.reshape(-1)) for g in summed)
        o.count_combined(nbytes(gathered))
        gathered.clear()
        nxt = pieces[n + 1] if n + 1 < len(pieces) else None
        shards = None
        ahead = nxt is None and x_next is not None
        if ahead and x_next is not None:
            shards = o.shards(x_next.shape[0])
        data = JobInputs(g=summed, x_next=x_next if ahead else None)
        job = ApplyJob(o.layout, layers, generation=o.generation, step=step, shards=shards,
                       opt=o.job_optimizer, t=o.t, piece=piece, number=n, last=nxt is None,
                       gather=nxt, prefetch=ahead, store=clip is not None)
        o.count_combined(nbytes(summed))
        out: list[ApplyResult | None] = o.run_job(job, data, readers,
                                                  defer=nxt is None and not ahead)
        del summed, data
        if ahead:
            return [None if r is None else r.ahead for r in out]
        gathered.extend(None if r is None else r.piece for r in out)
    return None


class _Blocked:
    """What a single blocked layer and a pair share: the jobs and the replicas' combine."""

    kind = "blocked"
    layers: tuple[BlockedLayer, ...]
    #: the network's clip by global norm (``None``: the optimizer has no ``clipnorm``)
    clip: NormClip | None = None

    def __init__(self, owner: StageOwner) -> None:
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
        job = ForwardJob(o.layout, self.layers, generation=o.generation,
                         step=o.step_of(self.layers[0]),
                         shards=o.shards(x2.shape[0]), training=bool(training))
        return o.run_job(job, JobInputs(x=x2), self.blocks * o.layout.replicas)

    def _backward_job(self, dy: np.ndarray, need_dx: bool,
                      next_x: np.ndarray | None) -> tuple[list, list]:
        """Run the backward job (and, with replicas, the combine); returns the slots'
        input-delta shares and, for ``next_x``, their forward outputs of it (lookahead: in
        the backward job with one replica, in the combine's last job with replicas)."""
        o = self.owner
        step = o.step_of(self.layers[0])
        hybrid = o.layout.replicas > 1
        clip = self.clip
        x_next = (None if next_x is None or clip is not None else
                  np.ascontiguousarray(next_x.reshape(-1, self.layers[0].in_features),
                                       dtype=o.dtype))
        data = JobInputs(dy=dy, x_next=None if hybrid else x_next)
        job = BackwardJob(o.layout, self.layers, generation=o.generation, step=step,
                          shards=o.shards(dy.shape[0]), need_dx=bool(need_dx), opt=o.job_optimizer,
                          t=o.t, prefetch=x_next is not None and not hybrid,
                          gather=o.pieces(self.layers)[0] if hybrid else None, keep=clip is not None
                          and not hybrid)
        out: list[BackwardResult | None] = o.run_job(job, data, self.blocks * o.layout.replicas)
        dxs = [None if r is None else r.dx for r in out]
        finite = all(r is None or r.finite for r in out)
        ahead: list | None = [None if r is None else r.ahead for r in out]
        sumsq = sum(r.sumsq for r in out if r is not None)
        if hybrid:
            gathered = [None if r is None else r.piece for r in out]
            del out
            ahead = combine(o, self.layers, step, gathered, x_next, clip)
        # the blocks wait for the factor, busy 1 (1 + pieces after a combine)
        if clip is not None:
            clip.add_blocked(self, step, 1 + (len(o.pieces(self.layers)) if hybrid else 0), sumsq)
        for layer in self.layers:
            o.advance(layer)
        if not finite:
            raise NonFinite("parameters",
                            f"blocked layer(s) {', '.join(str(s.index) for s in self.layers)}")
        return dxs, ahead or []

    def _end_backward(self, next_x: np.ndarray | None, ahead: list) -> list:
        """With a clip, the first stage's backward ends the step (:meth:`NormClip.finish`)
        and the lookahead's outputs come from there."""
        if self.clip is not None and _is_first(self):
            return self.clip.finish(self, next_x)
        return ahead

    def _input_delta(self, dxs: list, lead: tuple, need_dx: bool) -> np.ndarray | None:
        if not need_dx:
            return None
        dx = _per_replica(self.owner, dxs, self.blocks, _sum)
        return dx.reshape(lead + (self.layers[0].in_features,))


class BlockStage(_Blocked):
    """One blocked dense layer cut by output neurons."""

    kind = "block"

    def __init__(self, owner: StageOwner, spec: BlockedLayer) -> None:
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

    def backward(self, g: np.ndarray, need_dx: bool,
                 next_x: np.ndarray | None = None) -> np.ndarray | None:
        s = self.spec
        lead = g.shape[:-1]
        _starts_step(self)
        g2 = np.ascontiguousarray(g.reshape(-1, s.units), dtype=self.owner.dtype)
        dxs, ahead = self._backward_job(g2, need_dx, next_x)
        ahead = self._end_backward(next_x, ahead)
        if next_x is not None:
            y = _per_replica(self.owner, ahead, s.blocks, _concat)
            self._pre = (next_x, y.reshape(next_x.shape[:-1] + (s.units,)))
        return self._input_delta(dxs, lead, need_dx)


class PairStage(_Blocked):
    """Two blocked dense layers: the first cut by output, the second by input neurons;
    the second layer's bias lives here, on the driver."""

    kind = "pair"

    def __init__(self, owner: StageOwner, a: BlockedLayer, b: BlockedLayer) -> None:
        super().__init__(owner)
        self.a, self.b = a, b
        self.layers = (a, b)
        self.bias = np.zeros(b.units, dtype=owner.dtype) if b.use_bias else None
        self.opt: Optimizer = owner.new_optimizer()
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

    def backward(self, g: np.ndarray, need_dx: bool,
                 next_x: np.ndarray | None = None) -> np.ndarray | None:
        b = self.b
        lead = g.shape[:-1]
        _starts_step(self)
        dz = np.array(g.reshape(-1, b.units), dtype=self.owner.dtype, order="C")
        if b.kernel_activation:
            assert self._y is not None
            _activations.backward(b.kernel_activation, self._y, dz)
        dxs, ahead = self._backward_job(dz, need_dx, next_x)
        if self.bias is not None and self.clip is not None:
            self.clip.add_driver(self.opt, self.bias, dz.sum(axis=0, dtype=self.owner.dtype))
        elif self.bias is not None:
            self.opt.step(self.bias, dz.sum(axis=0, dtype=self.owner.dtype))
        ahead = self._end_backward(next_x, ahead)
        if next_x is not None:      # bias and activation are added when it is used
            self._pre = (next_x, _per_replica(self.owner, ahead, b.blocks, _sum))
        return self._input_delta(dxs, lead, need_dx)


def build_stages(owner: StageOwner, shapes: Sequence[Sequence[int]]) -> list[Stage]:
    """The stages of ``owner``'s layers in order: runs of driver layers, blocked layers and
    pairs (``shapes``: each layer's per-sample input shape)."""
    from sparknet.layers.core import Dense

    layers = owner.layers
    by_idx = {s.index: s for s in owner.blocked}
    stages: list[DriverStage | BlockStage | PairStage] = []
    i, n = 0, len(layers)
    while i < n:
        if i in by_idx:
            s = by_idx[i]
            if s.partner is not None and s.cut == "rows":
                stages.append(PairStage(owner, s, by_idx[s.partner]))
                i += 2
            else:
                stages.append(BlockStage(owner, s))
                i += 1
        else:
            j = i
            while j < n and j not in by_idx:
                j += 1
            stages.append(DriverStage(owner, i, layers[i:j], shapes[i]))
            i = j
    head = layers[-1]
    if n - 1 in by_idx and isinstance(head, Dense) and head.activation == "softmax":
        head.emit_logits = True          # the softmax is fused with the loss on the driver
    if owner.job_optimizer.clipnorm is not None:
        clip = NormClip(owner)
        for st in stages:
            st.clip = clip
    out: list[Stage] = list(stages)
    return out


def driver_arrays(stages: Sequence[Stage]) -> dict[str, np.ndarray]:
    """The parameters, layer state and optimizer state the stages keep on the driver, for
    ``driver.npz`` (``stage<j>.params`` or ``stage<j>.bias``, ``stage<j>.state`` when the
    stage's layers keep any, and ``stage<j>.opt_*``)."""
    out: dict[str, np.ndarray] = {}
    for j, st in enumerate(stages):
        if isinstance(st, DriverStage):
            out[f"stage{j}.params"] = st.seq.params
            if st.seq.n_state:
                out[f"stage{j}.state"] = st.seq.state
            out.update(st.opt.state_arrays(f"stage{j}.opt_"))
        elif isinstance(st, PairStage) and st.bias is not None:
            out[f"stage{j}.bias"] = st.bias
            out.update(st.opt.state_arrays(f"stage{j}.opt_"))
    return out


def set_driver_arrays(stages: Sequence[Stage], data: Mapping[str, np.ndarray]) -> None:
    """Read back what :func:`driver_arrays` wrote."""
    for j, st in enumerate(stages):
        if isinstance(st, DriverStage):
            st.seq.set_params(data[f"stage{j}.params"])
            if st.seq.n_state:
                if f"stage{j}.state" not in data:
                    raise ValueError(f"the saved driver arrays hold no stage{j}.state: the layers "
                                     f"{st.first}.. of that stage keep running statistics")
                st.seq.set_state(data[f"stage{j}.state"])
            st.opt.load_state_arrays(data, f"stage{j}.opt_")
        elif isinstance(st, PairStage) and st.bias is not None:
            st.bias[...] = data[f"stage{j}.bias"]
            st.opt.load_state_arrays(data, f"stage{j}.opt_")


def rewind_state(stages: Sequence[Stage]) -> None:
    """Put the driver stages' layer state back as of the start of the step that just failed
    (its forward pass had updated the running statistics)."""
    for st in stages:
        if isinstance(st, DriverStage) and st.state_before is not None:
            st.seq.state[...] = st.state_before


def state_into(stages: Sequence[Stage], model: Any) -> None:
    """Copy the driver stages' layer state into ``model``, a single-process Sequential of
    the same layers (:meth:`ModelParallel.to_sequential`)."""
    slices = model.state_slices()
    for st in stages:
        if isinstance(st, DriverStage):
            for n, sl in enumerate(st.seq.state_slices()):
                for name, (a, b, _shape) in sl.items():
                    c, d, _ = slices[st.first + n][name]
                    model.state[c:d] = st.seq.state[a:b]


def assemble(owner: StageOwner, index: int, by_idx: Mapping[int, BlockedLayer],
             parts_all: list, replica: int) -> dict[str, np.ndarray]:
    """The whole ``kernel``/``bias`` of layer ``index``: concatenated from its blocks'
    copies (``parts_all``: per slot, what a gather job returned) or read from its driver
    stage."""
    if index in by_idx:
        s = by_idx[index]
        parts = [parts_all[owner.layout.slot(replica, k)][index] for k in range(s.blocks)]
        axis = 0 if s.cut == "rows" else 1
        out = {"kernel": np.concatenate([p["kernel"] for p in parts], axis=axis)}
        if s.use_bias:
            if s.cut == "rows":
                out["bias"] = np.concatenate([p["bias"] for p in parts])
            else:
                pair = next(st for st in owner.stages if isinstance(st, PairStage) and st.b is s)
                assert pair.bias is not None
                out["bias"] = pair.bias.copy()
        return out
    for st in owner.stages:
        if isinstance(st, DriverStage) and st.first <= index < st.first + len(st.seq.layers):
            sl = st.seq.param_slices()[index - st.first]
            return {k: st.seq.params[a:b].reshape(shape).copy() for k, (a, b, shape) in sl.items()}
    raise ValueError(f"layer index {index} is out of range")

"""Executor side of model parallelism: a slot's resident store and the block maths.

A slot's arrays live in a dict-like *store* (a resident
:class:`~sparknet.cluster.resident.driver.Shard`, or a :class:`MemStore` for the in-process backend)
under the names

* ``"<layer>.kernel"``, ``"<layer>.bias"``: the block's parameters;
* ``"<layer>.<param>.<key>"``: its optimizer state, one array per
  :meth:`~sparknet.optim.Optimizer.state_keys` entry, shaped like the parameter;
* ``"grad.<layer>.<param>"``: with replicas, the partial gradient of the replica's shard,
  kept until the driver has combined it over the replicas; with ``clipnorm``, the gradient
  (combined, clamped by value) kept until the driver knows the norm over all blocks;
* ``"<layer>.state"``: int64 ``[generation, step, busy]``;
* ``"cache.<layer>.x.<rows>"``, ``"cache.<layer>.y.<rows>"``: the forward activations the
  backward pass needs.

With ``bf16`` (a fit under ``precision="bf16"``, :mod:`sparknet.precision`) the block's products
take bfloat16 operands and accumulate in float32 (:mod:`sparknet._bf16`: the weights packed once
per job, the gradients' operands rounded as the kernel reads them); the parameters, their
gradients and the optimizer state stay float32.

Parameters are updated through the optimizer's functional step
(:meth:`~sparknet.optim.Optimizer.apply`) row chunk by row chunk, so a block never needs a
gradient buffer of its own size, and the replicas' combined gradient can arrive in pieces.
Clipping by value is elementwise and happens in every row chunk; clipping by the global norm
keeps the block's gradient resident (:class:`KeepForClip`) until the driver sends the
factor (:func:`apply_kept`), so it costs one gradient buffer per block.
"""
from __future__ import annotations

import resource
from typing import Any, Callable, Protocol, Sequence

import numpy as np

import sparknet._activations as _activations
import sparknet._bf16 as _bf16
import sparknet._blas as _blas
import sparknet._dense as _dense
from sparknet import initializers
from sparknet.cluster.model_parallel.block_partition import BlockedLayer
from sparknet.cluster.resident.driver import LOST_TAG
from sparknet.optim import Optimizer

#: tag of executor-side errors meaning "this block does not fit the Python worker's memory limit"
MEMORY_TAG = "SPARKNET_BLOCK_MEMORY"
#: elements of a weight gradient produced at once (one row chunk of dW)
CHUNK_ELEMS = 1 << 22

#: ``grad_rows(r0, r1, out)`` writes the gradient of a parameter's rows ``r0:r1`` into ``out``
GradRows = Callable[[int, int, np.ndarray], None]


class Store(Protocol):
    """What a slot's store offers: a resident shard's arrays, or :class:`MemStore`."""

    def get(self, name: str) -> np.ndarray | None: ...

    def allocate(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray: ...


class MemStore(dict):
    """In-process stand-in for a resident shard's arrays (the reference backend)."""

    def allocate(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        arr = np.zeros(tuple(shape), dtype=dtype)
        self[name] = arr
        return arr


class Arrays:
    """Name -> array lookups on a slot's store that see arrays other Python workers created."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, name: str) -> np.ndarray | None:
        return self.store.get(name)

    def __getitem__(self, name: str) -> np.ndarray:
        v = self.store.get(name)
        if v is None:
            raise KeyError(name)
        return v

    def __contains__(self, name: str) -> bool:
        return self.store.get(name) is not None


# ------------------------------------------------------------------------ memory and state
def lost(slot: int, layer: int, why: str) -> RuntimeError:
    return RuntimeError(f"{LOST_TAG}: weight block {slot} of layer {layer} {why}")


def mem_limit() -> int | None:
    """This process's address-space limit in bytes (``None``: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def vm_size() -> int:
    """This process's address-space size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def check_fits(slot: int, need: int, what: str) -> None:
    """Fail early, with a clear message, when ``need`` more bytes cannot be mapped."""
    limit = mem_limit()
    if limit is None:
        return
    used = vm_size()
    if used + need > limit:
        raise MemoryError(
            f"{MEMORY_TAG}: slot {slot} needs {need / 2**20:.0f} MiB for {what}, but its Python "
            f"worker may map only {limit / 2**20:.0f} MiB (spark.executor.pyspark.memory) and "
            f"already uses {used / 2**20:.0f} MiB; cut the layer into more blocks or raise the "
            "limit")


def check_state(arrays: Arrays, slot: int, layer: BlockedLayer, gen: int, step: int,
                busy: int = 0) -> np.ndarray:
    """The block's ``[generation, step, busy]`` record, after checking it is the one the
    driver expects (``busy``: 0 between steps; with replicas, the combine's progress)."""
    i = layer.index
    st = arrays.get(f"{i}.state")
    if st is None or f"{i}.kernel" not in arrays:
        raise lost(slot, i, "is missing on this executor")
    if int(st[0]) != gen:
        raise lost(slot, i, f"belongs to generation {int(st[0])}, the driver expects {gen} (stale)")
    if int(st[2]) != busy:
        raise lost(slot, i, "was left half-updated by an interrupted task (stale)")
    if int(st[1]) != step:
        raise lost(slot, i, f"is at step {int(st[1])}, the driver expects step {step} (stale)")
    return st


# ------------------------------------------------------------------------------- init
def fill_kernel(out: np.ndarray, layer: BlockedLayer, seed: int, k: int) -> None:
    """Seeded init of block ``k``'s kernel in row chunks (one generator per layer and block,
    so every replica of a block starts from the same weights)."""
    init = layer.kernel_initializer
    rng = np.random.default_rng([seed, layer.index, k])
    fan_in, fan_out = layer.in_features, layer.units
    if init == "orthogonal" or out.ndim != 2:
        tmp = np.empty(out.shape, dtype=np.float64)
        initializers.fill(tmp, init, fan_in, fan_out, rng)
        out[...] = tmp
        return
    rows, cols = out.shape
    step = max(1, CHUNK_ELEMS // max(cols, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        tmp = np.empty((r1 - r0, cols), dtype=np.float64)
        initializers.fill(tmp, init, fan_in, fan_out, rng)
        out[r0:r1] = tmp


def keeps_grad(opt: Optimizer, replicas: int) -> bool:
    """Whether blocks keep a resident gradient buffer: replicas' partials, or the gradient
    waiting for the global norm (``clipnorm``)."""
    return replicas > 1 or opt.clipnorm is not None


def held_bytes(layers: Sequence[BlockedLayer], k: int, dtype: np.dtype, opt: Optimizer,
               replicas: int) -> int:
    """Bytes block ``k`` of ``layers`` keeps resident: parameters, optimizer state and (with
    replicas or ``clipnorm``) the gradient."""
    copies = 1 + len(opt.state_keys()) + (1 if keeps_grad(opt, replicas) else 0)
    return sum(int(np.prod(s)) for layer in layers if k < layer.blocks
               for s in layer.param_shapes(k).values()) * dtype.itemsize * copies


def allocate_block(store: Store, layer: BlockedLayer, k: int, dtype: np.dtype, opt: Optimizer,
                   replicas: int) -> None:
    """Zero-filled parameters, optimizer state and (with replicas or ``clipnorm``) gradients
    of block ``k``, created directly as mapped files (no in-memory copy)."""
    i = layer.index
    for pname, shape in layer.param_shapes(k).items():
        store.allocate(f"{i}.{pname}", shape, dtype)
        for key in opt.state_keys():
            store.allocate(f"{i}.{pname}.{key}", shape, dtype)
        if keeps_grad(opt, replicas):
            store.allocate(f"grad.{i}.{pname}", shape, dtype)


def write_state(store: Store, layer: BlockedLayer, gen: int, step: int) -> None:
    st = store.allocate(f"{layer.index}.state", (3,), np.int64)
    st[0], st[1], st[2] = gen, step, 0
    if hasattr(st, "flush"):
        st.flush()


# --------------------------------------------------------------------------- optimizer
def apply_rows(arrays: Arrays, key: str, r0: int, r1: int, g: np.ndarray, opt: Optimizer, t: int,
               clipped: bool = False) -> None:
    """``opt.apply`` to rows ``r0:r1`` of parameter ``key`` (2-D, or 1-D seen as a column)
    with the matching rows of its resident optimizer state; ``g`` holds those rows' gradient,
    clamped here by ``opt.clipvalue`` (in place) unless ``clipped``.  The optimizers and the
    clamp are elementwise, so updating row chunk by row chunk equals one update."""
    p = arrays[key]
    p2 = p.reshape(p.shape[0], -1)
    state = {s: arrays[f"{key}.{s}"].reshape(p2.shape)[r0:r1].reshape(-1) for s in opt.state_keys()}
    flat = np.ascontiguousarray(g).reshape(-1)
    if not clipped and opt.clipvalue is not None:
        if not flat.flags.writeable:
            flat = flat.copy()
        opt.clip_part(flat)
    opt.apply(p2[r0:r1].reshape(-1), flat, state, t)


def update_in_chunks(arrays: Arrays, key: str, grad_rows: GradRows, opt: Optimizer, t: int) -> bool:
    """Update parameter ``key`` in place, producing and applying its gradient row chunk by row
    chunk; returns whether every updated row is finite."""
    p = arrays[key]
    rows, cols = p.shape[0], int(np.prod(p.shape[1:]))
    step = max(1, CHUNK_ELEMS // max(cols, 1))
    buf = np.empty((min(step, rows), cols), dtype=p.dtype)
    finite = True
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        g = buf[:r1 - r0]
        grad_rows(r0, r1, g)
        apply_rows(arrays, key, r0, r1, g, opt, t)
        finite = finite and bool(np.isfinite(p.reshape(rows, cols)[r0:r1]).all())
    return finite


class Sink(Protocol):
    """Where a block's gradient goes: applied at once, or kept for the replicas' combine."""

    def __call__(self, arrays: Arrays, key: str, grad_rows: GradRows) -> None: ...


class ApplyNow:
    """One replica: update the block in place (the gradient never exists whole);
    :attr:`finite` turns false when an updated parameter holds a NaN or an infinity."""

    def __init__(self, opt: Optimizer, t: int) -> None:
        self.opt, self.t = opt, t
        self.finite = True

    def __call__(self, arrays: Arrays, key: str, grad_rows: GradRows) -> None:
        self.finite = update_in_chunks(arrays, key, grad_rows, self.opt, self.t) and self.finite


def keep_partial(arrays: Arrays, key: str, grad_rows: GradRows) -> None:
    """Replicas: write this shard's gradient into the resident ``grad.<key>`` buffer."""
    g = arrays[f"grad.{key}"]
    grad_rows(0, g.shape[0], g.reshape(g.shape[0], -1))


class KeepForClip:
    """``clipnorm`` with one replica: keep the block's gradient resident, clamped by value,
    and add up its squares (:attr:`sumsq`, this block's share of the squared global norm);
    :func:`apply_kept` applies it once the driver knows the factor."""

    def __init__(self, opt: Optimizer) -> None:
        self.opt = opt
        self.sumsq = 0.0

    def __call__(self, arrays: Arrays, key: str, grad_rows: GradRows) -> None:
        keep_partial(arrays, key, grad_rows)
        self.sumsq += self.opt.clip_part(arrays[f"grad.{key}"].reshape(-1))


def apply_kept(arrays: Arrays, key: str, opt: Optimizer, t: int, factor: float) -> bool:
    """Apply the kept gradient ``grad.<key>`` times ``factor`` (the global norm's clip) to
    parameter ``key``, row chunk by row chunk; returns whether the updated rows are finite."""
    from sparknet.optim import scale

    p, g = arrays[key], arrays[f"grad.{key}"]
    rows = p.shape[0]
    g2 = g.reshape(rows, -1)
    step = max(1, CHUNK_ELEMS // max(g2.shape[1], 1))
    finite = True
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        chunk = g2[r0:r1].reshape(-1)
        scale(chunk, factor)
        apply_rows(arrays, key, r0, r1, chunk, opt, t, clipped=True)
        finite = finite and bool(np.isfinite(p.reshape(rows, -1)[r0:r1]).all())
    return finite


# ------------------------------------------------------------------------- block maths
def cache(store: Store, name: str, src: np.ndarray) -> np.ndarray:
    """Keep ``src`` for the backward pass in a resident file named after its row count
    (a file is never replaced by one of another shape, so no worker maps a stale copy)."""
    name = f"{name}.{src.shape[0]}"
    cur = store.get(name)
    if cur is None or cur.shape != src.shape or cur.dtype != src.dtype:
        cur = store.allocate(name, src.shape, src.dtype)
    cur[...] = src
    return cur


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, bf16: bool) -> None:
    """``out[...] = a @ b``: float32/float64 BLAS, or bfloat16 operands with float32 sums."""
    if bf16:
        _bf16.py_gemm(a, b, out)
    else:
        _blas.py_gemm(False, False, 1.0, a, b, 0.0, out)


def _packed_t(W: np.ndarray, bf16: bool) -> "_bf16.PackedB | None":
    """``W.T`` packed for the bfloat16 kernel (``None`` in full precision)."""
    return _bf16.pack(np.ascontiguousarray(W), True) if bf16 else None


def forward_rows(store: Store, slot: int, layer: BlockedLayer, x: np.ndarray, gen: int, step: int,
                 training: bool, bf16: bool = False) -> np.ndarray:
    """``A_k = f(x W_k^T + b_k)`` for this slot's row block (x: N x in -> N x rows_k)."""
    arrays = Arrays(store)
    check_state(arrays, slot, layer, gen, step)
    i = layer.index
    W = arrays[f"{i}.kernel"]
    y = np.empty((x.shape[0], W.shape[0]), dtype=W.dtype)
    _dense.forward(x, W, arrays.get(f"{i}.bias"), y, layer.kernel_activation, None,
                   _packed_t(W, bf16))
    if training:
        cache(store, f"cache.{i}.x", x)
        cache(store, f"cache.{i}.y", y)
    return y


def forward_pair(store: Store, slot: int, a: BlockedLayer, b: BlockedLayer, x: np.ndarray, gen: int,
                 step: int, training: bool, bf16: bool = False) -> np.ndarray:
    """``H_k W2_k^T`` with ``H_k = f(x W1_k^T + b1_k)``: this slot's partial pair output."""
    arrays = Arrays(store)
    check_state(arrays, slot, b, gen, step)
    h = forward_rows(store, slot, a, x, gen, step, training, bf16)
    W2 = arrays[f"{b.index}.kernel"]                         # (out2, rows_k)
    part = np.empty((x.shape[0], W2.shape[0]), dtype=W2.dtype)
    _dense.forward(h, W2, None, part, 0, None, _packed_t(W2, bf16))
    return part


def _mark(st: np.ndarray, busy: int, step: int | None = None) -> None:
    if step is not None:
        st[1] = step
    st[2] = busy


def backward_rows(store: Store, slot: int, layer: BlockedLayer, dy: np.ndarray, need_dx: bool,
                  gen: int, step: int, sink: Sink, done: tuple[int, int],
                  bf16: bool = False) -> np.ndarray | None:
    """Backward of this slot's row block; ``dy`` holds the delta of the block's own neurons.

    ``dx = dz W_k`` uses the weights before the update; ``dW_k = dz^T x`` and
    ``db_k = sum(dz)`` go to ``sink``; the state record ends as ``done`` = (step, busy).
    """
    arrays = Arrays(store)
    st = check_state(arrays, slot, layer, gen, step)
    i = layer.index
    n = dy.shape[0]
    x, y = arrays.get(f"cache.{i}.x.{n}"), arrays.get(f"cache.{i}.y.{n}")
    if x is None or y is None or y.shape != dy.shape:
        raise lost(slot, i, "has no forward activations for this batch")
    dz = np.array(dy, dtype=y.dtype, order="C")
    if layer.kernel_activation:
        _activations.backward(layer.kernel_activation, y, dz)
    W = arrays[f"{i}.kernel"]
    dx = None
    if need_dx:
        dx = np.empty(x.shape, dtype=W.dtype)
        _matmul(dz, W, dx, bf16)                             # dx = dz @ W_k (old weights)
    dzt = np.ascontiguousarray(dz.T)
    _mark(st, 1)

    def kernel_rows(r0: int, r1: int, out: np.ndarray) -> None:
        _matmul(dzt[r0:r1], x, out, bf16)                              # dW rows = dz^T x
    sink(arrays, f"{i}.kernel", kernel_rows)
    if f"{i}.bias" in arrays:
        db = dzt.sum(axis=1, dtype=W.dtype)

        def bias_rows(r0: int, r1: int, out: np.ndarray) -> None:
            out[:, 0] = db[r0:r1]
        sink(arrays, f"{i}.bias", bias_rows)
    _mark(st, done[1], done[0])
    return dx


def backward_pair(store: Store, slot: int, a: BlockedLayer, b: BlockedLayer, dz2: np.ndarray,
                  need_dx: bool, gen: int, step: int, sink: Sink, done: tuple[int, int],
                  bf16: bool = False) -> np.ndarray | None:
    """Backward of this slot's share of a pair: ``dh = dz2 W2_k`` (old weights),
    ``dW2_k = dz2^T h`` to ``sink``, then the first layer's row block with delta ``dh``."""
    arrays = Arrays(store)
    st_b = check_state(arrays, slot, b, gen, step)
    h = arrays.get(f"cache.{a.index}.y.{dz2.shape[0]}")
    if h is None or h.shape[0] != dz2.shape[0]:
        raise lost(slot, b.index, "has no forward activations for this batch")
    W2 = arrays[f"{b.index}.kernel"]                          # (out2, rows_k)
    dh = np.empty(h.shape, dtype=W2.dtype)
    _matmul(dz2, W2, dh, bf16)                              # dh = dz2 @ W2_k (old weights)
    dz2t = np.ascontiguousarray(dz2.T)
    _mark(st_b, 1)

    def kernel_rows(r0: int, r1: int, out: np.ndarray) -> None:
        _matmul(dz2t[r0:r1], h, out, bf16)                             # dW2_k = dz2^T h
    sink(arrays, f"{b.index}.kernel", kernel_rows)
    _mark(st_b, done[1], done[0])
    # the first layer of the pair: dh is the delta of exactly this slot's neurons
    return backward_rows(store, slot, a, dh, need_dx, gen, step, sink, done, bf16)


# ---------------------------------------------------------- replicas: combining gradients
def partial_rows(store: Store, key: str, r0: int, r1: int) -> np.ndarray:
    """A copy of rows ``r0:r1`` of the partial gradient of parameter ``key``."""
    g = Arrays(store)[f"grad.{key}"]
    return np.array(g.reshape(g.shape[0], -1)[r0:r1])


def apply_summed(store: Store, key: str, r0: int, r1: int, g: np.ndarray, opt: Optimizer,
                 t: int) -> None:
    """Apply the replicas' summed gradient of rows ``r0:r1`` of parameter ``key``."""
    apply_rows(Arrays(store), key, r0, r1, g, opt, t)


def store_summed(store: Store, key: str, r0: int, r1: int, g: np.ndarray) -> None:
    """``clipnorm`` with replicas: keep the replicas' summed (clamped) gradient of rows
    ``r0:r1`` of parameter ``key`` in ``grad.<key>``, for :func:`apply_kept`."""
    buf = Arrays(store)[f"grad.{key}"]
    buf.reshape(buf.shape[0], -1)[r0:r1] = np.asarray(g).reshape(r1 - r0, -1)


def all_finite(arr: np.ndarray) -> bool:
    """Whether every element of ``arr`` is finite, checked row chunk by row chunk (a block
    may be close to the worker's memory limit: no temporary of its size)."""
    flat = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
    step = max(1, CHUNK_ELEMS // max(flat.shape[1], 1))
    return all(bool(np.isfinite(flat[r0:r0 + step]).all()) for r0 in range(0, flat.shape[0], step))


def nonfinite(arrays: Arrays, layer: BlockedLayer, k: int, state_keys: Sequence[str]) -> list[str]:
    """The parameters (and optimizer state) of block ``k`` of ``layer`` holding a NaN or an
    infinity, named ``"layer <i> block <k> <param>"``."""
    i = layer.index
    bad = []
    for pname in layer.param_shapes(k):
        for suffix in [""] + [f".{s}" for s in state_keys]:
            if not all_finite(arrays[f"{i}.{pname}{suffix}"]):
                bad.append(f"layer {i} block {k} {pname}{suffix}")
    return bad


def gather(store: Store, layer: BlockedLayer, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Copies of the named parameters (``kernel``, ``bias``) this slot holds for ``layer``."""
    arrays = Arrays(store)
    i = layer.index
    return {k: np.array(arrays[f"{i}.{k}"]) for k in keys if f"{i}.{k}" in arrays}


def layer_records(store: Store, layers: Sequence[BlockedLayer], k: int) -> dict[int, Any]:
    """Each held layer's ``[generation, step, busy]`` record (``None``: not found)."""
    arrays = Arrays(store)
    return {layer.index: (np.array(arrays[f"{layer.index}.state"]).tolist()
                          if f"{layer.index}.state" in arrays
                          else None)
            for layer in layers if k < layer.blocks}

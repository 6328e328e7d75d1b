"""Model parallelism by neuron blocks: the paper's distributed backpropagation.

A dense layer too large for one machine is cut into ``K`` blocks of neurons (see
:mod:`sparknet.cluster.blocks`); block ``k`` of every blocked layer lives on executor
*slot* ``k``, resident across Spark jobs (weights *and* optimizer state), and only
activations and deltas cross the network:

* **forward** of a blocked layer: the driver broadcasts the layer's input ``A``
  (batch x in); slot ``k`` computes its neurons ``A_k = f(A W_k^T + b_k)`` with the
  fused :mod:`sparknet._dense` kernel, keeps ``A`` and ``A_k`` for its backward, and the
  driver gathers ``[A_1 ... A_K]``;
* **backward**: the driver broadcasts the output delta; slot ``k`` computes
  ``dW_k`` and ``db_k``, **updates its own weights and optimizer state in place**
  (RMSprop or SGD through :mod:`sparknet._optim`, the formulas of
  :mod:`sparknet.optim`), and returns its share ``dZ_k W_k`` of the input delta, which
  the driver sums.  ``dW_k`` is produced and applied in row chunks, so a block never
  needs a gradient buffer of its own size.
* **paired layers** (Megatron-style): the first layer of a pair is cut by output
  neurons, the second by input neurons; slot ``k`` computes ``H_k = f(A W1_k^T + b1_k)``
  and the partial product ``H_k W2_k^T``; the driver sums the partials and adds the
  second bias.  The pair costs one exchange each way instead of two.

* **lookahead**: when the model starts with a blocked layer or pair and the next
  batch is known (:meth:`ModelParallel.fit`, or ``train_on_batch(..., next_x=...)``),
  the first stage's backward job also runs its forward pass for the next batch, with
  the weights it has just updated: a model made of one pair and driver layers needs
  **one** Spark job per step.

Unblocked layers (conv, recurrent, small dense) run on the driver between the
blocked ones, in :class:`~sparknet.model.Sequential` segments.  The result equals
single-process backpropagation up to float rounding.

Per step the trainer counts the bytes it broadcasts and collects
(:attr:`ModelParallel.last_step_bytes`): they grow with batch x layer width, never
with the blocked weights, which do not move during training.

Where the blocks live
---------------------
Blocks are kept by :class:`sparknet.cluster.resident.Resident`: a persisted anchor
RDD with one partition per slot (which pins slot -> executor), the arrays held
memory-mapped from ``.npy`` files in ``/dev/shm`` (or the executor's local
directory), so every Python worker of the host sees the same bytes and in-place
updates survive worker restarts.  Weights are initialised *on the executors* from a
seed per block (``default_rng([seed, layer, k])``), written straight into the
mapped files: the driver never holds a blocked layer.  Every block carries a
``[generation, step, busy]`` record; a job checks it, so a block that went missing
or stale (its worker or files were lost, a task was retried after a partial update)
stops training with :class:`BlockStateLost` -- or, when checkpoints exist, training
restores the newest checkpoint and carries on from there.  Nothing ever trains on
with missing or stale weights.

Example::

    from sparknet import Dense
    from sparknet.cluster.blocks import BlockPlan
    from sparknet.cluster.model_parallel import ModelParallel

    mp = ModelParallel([Dense(16384, activation="relu"), Dense(16384, activation="relu"),
                        Dense(10, activation="softmax")],
                       BlockPlan({0: 2, 1: 2}, pair=True), input_shape=(4096,), spark=spark)
    mp.fit(X, y, epochs=1, batch_size=256)
    mp.last_step_bytes     # {'broadcast': ..., 'collected': ..., 'jobs': ...}
    mp.save("model-dir")   # streamed block by block, by the executors
    mp.close()
"""
from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import time
import zipfile
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from sparknet import _activations, _blas, _dense, _optim, initializers
from sparknet import losses as losses_mod
from sparknet import optim as optim_mod
from sparknet.activations import activation_id
from sparknet.cluster.blocks import BlockedLayer, BlockPlan, as_plan
from sparknet.cluster.resident import LOST_TAG, lost_reason
from sparknet.io import _atomic_savez, atomic_write
from sparknet.layers.base import REGISTRY, Layer

log = logging.getLogger(__name__)

FORMAT = "sparknet-model-parallel"
VERSION = 1
#: tag of executor-side errors meaning "this block does not fit the Python worker's memory limit"
MEMORY_TAG = "SPARKNET_BLOCK_MEMORY"
#: elements of a weight gradient produced at once (one row chunk of dW)
_CHUNK_ELEMS = 1 << 22


class BlockStateLost(RuntimeError):
    """A weight block's resident state is missing or stale and no checkpoint could restore it."""


class BlockMemoryError(MemoryError):
    """A weight block does not fit the executor's Python memory (``spark.executor.pyspark.memory``)."""


# =============================================================================== executor side
# A slot's arrays live in a dict-like ``store`` (a resident Shard's ``arrays``, or a plain
# dict for the in-process backend) under the names "<layer>.kernel", "<layer>.bias",
# "<layer>.kernel.square_avg", ..., "<layer>.state" = int64 [generation, step, busy];
# the forward cache (the layer input and output of the last batch) under "cache.<layer>.*".

def _lost(slot: int, layer: int, why: str) -> RuntimeError:
    return RuntimeError(f"{LOST_TAG}: weight block {slot} of layer {layer} {why}")


def _mem_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def _check_fits(slot: int, need: int, what: str) -> None:
    """Fail early, with a clear message, when ``need`` more bytes cannot be mapped."""
    limit = _mem_limit()
    if limit is None:
        return
    used = _vm_size()
    if used + need > limit:
        raise MemoryError(
            f"{MEMORY_TAG}: slot {slot} needs {need / 2**20:.0f} MiB for {what}, but its Python worker "
            f"may map only {limit / 2**20:.0f} MiB (spark.executor.pyspark.memory) and already uses "
            f"{used / 2**20:.0f} MiB; cut the layer into more blocks or raise the limit")


class _MemStore(dict):
    """In-process stand-in for a resident shard's arrays (the reference backend)."""

    def allocate(self, name: str, shape, dtype) -> np.ndarray:
        arr = np.zeros(tuple(shape), dtype=dtype)
        self[name] = arr
        return arr


def _allocate(store, name: str, shape, dtype) -> np.ndarray:
    """A new zero-filled resident array, created directly as a mapped file (no in-memory copy)."""
    return store.allocate(name, shape, dtype)


class _Arrays:
    """Name -> array lookups on a slot's store that see arrays other Python workers created."""

    def __init__(self, store) -> None:
        self.store = store

    def get(self, name: str, default=None):
        v = self.store.get(name)
        return default if v is None else v

    def __getitem__(self, name: str) -> np.ndarray:
        v = self.store.get(name)
        if v is None:
            raise KeyError(name)
        return v

    def __contains__(self, name: str) -> bool:
        return self.store.get(name) is not None


def _arrays(store) -> _Arrays:
    return _Arrays(store)


def _opt_keys(opt: dict) -> tuple[str, ...]:
    name, cfg = opt["name"], opt["config"]
    if name == "rmsprop":
        keys = ["square_avg"]
        if cfg.get("centered"):
            keys.append("grad_avg")
        if cfg.get("momentum", 0) > 0:
            keys.append("momentum_buffer")
        return tuple(keys)
    if name == "sgd":
        return ("momentum_buffer",) if cfg.get("momentum", 0) != 0 else ()
    raise ValueError(f"model-parallel training supports the rmsprop and sgd optimizers, got {name!r}")


def _param_names(spec: dict) -> list[tuple[str, str]]:
    """``[(store suffix, kind)]`` of the parameters a slot holds for one blocked layer."""
    out = [("kernel", "kernel")]
    if spec["use_bias"] and spec["cut"] == "rows":
        out.append(("bias", "bias"))
    return out


def _block_shapes(spec: dict, k: int) -> dict[str, tuple[int, ...]]:
    lo, hi = spec["offsets"][k], spec["offsets"][k + 1]
    if spec["cut"] == "rows":
        shapes = {"kernel": (hi - lo, spec["in_features"])}
        if spec["use_bias"]:
            shapes["bias"] = (hi - lo,)
        return shapes
    return {"kernel": (spec["units"], hi - lo)}


def _fill_kernel(out: np.ndarray, spec: dict, seed: int, k: int) -> None:
    """Seeded init of block ``k``'s kernel in row chunks (a generator per block)."""
    init = spec["kernel_initializer"]
    rng = np.random.default_rng([seed, spec["index"], k])
    fan_in, fan_out = spec["in_features"], spec["units"]
    if init == "orthogonal" or out.ndim != 2:
        tmp = np.empty(out.shape, dtype=np.float64)
        initializers.fill(tmp, init, fan_in, fan_out, rng)
        out[...] = tmp
        return
    rows, cols = out.shape
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        tmp = np.empty((r1 - r0, cols), dtype=np.float64)
        initializers.fill(tmp, init, fan_in, fan_out, rng)
        out[r0:r1] = tmp


def _init_slot(store, slot: int, meta: dict) -> dict:
    """Allocate and initialise this slot's blocks of every blocked layer (or load them)."""
    arrays = _arrays(store)
    dtype = np.dtype(meta["dtype"])
    okeys = _opt_keys(meta["optimizer"])
    held, mine = 0, []
    for spec in meta["layers"]:
        if slot >= spec["blocks"]:
            continue
        shapes = _block_shapes(spec, slot)
        held += sum(int(np.prod(s)) for s in shapes.values()) * dtype.itemsize * (1 + len(okeys))
        mine.append(str(spec["index"]))
    if mine:
        _check_fits(slot, held, f"its blocks of layer(s) {', '.join(mine)} (weights and optimizer state)")
    for spec in meta["layers"]:
        if slot >= spec["blocks"]:
            continue
        i = spec["index"]
        shapes = _block_shapes(spec, slot)
        for pname, shape in shapes.items():
            p = _allocate(store, f"{i}.{pname}", shape, dtype)
            if pname == "kernel" and meta.get("load") is None:
                _fill_kernel(p, spec, meta["seed"], slot)
            for ok in okeys:
                _allocate(store, f"{i}.{pname}.{ok}", shape, dtype)
        if meta.get("load") is not None:
            _load_block(arrays, spec, slot, meta["load"], okeys)
        st = _allocate(store, f"{i}.state", (3,), np.int64)
        st[0], st[1], st[2] = meta["generation"], meta.get("step", 0), 0
        if hasattr(st, "flush"):
            st.flush()
    return {"held": held, "pid": os.getpid(), "ppid": os.getppid()}


def _check_state(arrays: dict, slot: int, spec: dict, gen: int, step: int) -> np.ndarray:
    i = spec["index"]
    st = arrays.get(f"{i}.state")
    if st is None or f"{i}.kernel" not in arrays:
        raise _lost(slot, i, "is missing on this executor")
    if int(st[0]) != gen:
        raise _lost(slot, i, f"belongs to generation {int(st[0])}, the driver expects {gen} (stale)")
    if int(st[2]) != 0:
        raise _lost(slot, i, "was left half-updated by an interrupted task (stale)")
    if int(st[1]) != step:
        raise _lost(slot, i, f"is at step {int(st[1])}, the driver expects step {step} (stale)")
    return st


def _cache(store, name: str, src: np.ndarray) -> np.ndarray:
    """Keep ``src`` for the backward pass in a resident file named after its row count
    (a file is never replaced by one of another shape, so no worker maps a stale copy)."""
    name = f"{name}.{src.shape[0]}"
    cur = store.get(name)
    if cur is None or cur.shape != src.shape or cur.dtype != src.dtype:
        cur = _allocate(store, name, src.shape, src.dtype)
    cur[...] = src
    return cur


def _forward_rows(store, slot: int, spec: dict, x: np.ndarray, act: int, gen: int, step: int,
                  training: bool) -> np.ndarray:
    arrays = _arrays(store)
    _check_state(arrays, slot, spec, gen, step)
    i = spec["index"]
    W = arrays[f"{i}.kernel"]
    b = arrays.get(f"{i}.bias")
    y = np.empty((x.shape[0], W.shape[0]), dtype=W.dtype)
    _dense.forward(x, W, b, y, act)
    if training:
        _cache(store, f"cache.{i}.x", x)
        _cache(store, f"cache.{i}.y", y)
    return y


def _opt_update(arrays: dict, key: str, p: np.ndarray, grad_rows: Callable[[int, int, np.ndarray], None],
                opt: dict, t: int) -> None:
    """Update parameter ``p`` (2-D or 1-D) in place, row chunk by row chunk.

    ``grad_rows(r0, r1, out)`` writes the gradient of rows ``r0:r1`` into ``out``.
    """
    cfg = opt["config"]
    p2 = p.reshape(p.shape[0], -1)
    rows, cols = p2.shape
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    buf = np.empty((min(step, rows), cols), dtype=p.dtype)
    states = {k: arrays[f"{key}.{k}"].reshape(rows, cols) for k in _opt_keys(opt)}
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        g = buf[:r1 - r0]
        grad_rows(r0, r1, g)
        pf, gf = p2[r0:r1].reshape(-1), g.reshape(-1)
        sv = {k: v[r0:r1].reshape(-1) for k, v in states.items()}
        if opt["name"] == "rmsprop":
            _optim.rmsprop(pf, gf, sv["square_avg"], sv.get("grad_avg"), sv.get("momentum_buffer"),
                           cfg["lr"], cfg["alpha"], cfg["eps"], cfg["weight_decay"], cfg["momentum"])
        else:
            _optim.sgd(pf, gf, sv.get("momentum_buffer"), cfg["lr"], cfg["momentum"], cfg["dampening"],
                       cfg["weight_decay"], cfg["nesterov"], t == 1)


def _update_rows_layer(arrays: dict, spec: dict, dz: np.ndarray, x: np.ndarray, opt: dict, t: int) -> None:
    """dW = dz^T x and db = sum(dz), applied in place (dz: N x rows_k, x: N x in)."""
    i = spec["index"]
    W = arrays[f"{i}.kernel"]
    dzt = np.ascontiguousarray(dz.T)

    def kernel_rows(r0, r1, out):
        _blas.py_gemm(False, False, 1.0, dzt[r0:r1], x, 0.0, out)
    _opt_update(arrays, f"{i}.kernel", W, kernel_rows, opt, t)
    if f"{i}.bias" in arrays:
        b = arrays[f"{i}.bias"]
        db = dzt.sum(axis=1, dtype=b.dtype)

        def bias_rows(r0, r1, out):
            out[:, 0] = db[r0:r1]
        _opt_update(arrays, f"{i}.bias", b.reshape(-1, 1), bias_rows, opt, t)


def _backward_rows(store, slot: int, spec: dict, dy: np.ndarray, act: int, need_dx: bool,
                   gen: int, step: int, opt: dict, t: int) -> np.ndarray | None:
    """Backward of this slot's row block; ``dy`` holds the delta of the block's own neurons."""
    arrays = _arrays(store)
    st = _check_state(arrays, slot, spec, gen, step)
    i = spec["index"]
    n = dy.shape[0]
    x, y = arrays.get(f"cache.{i}.x.{n}"), arrays.get(f"cache.{i}.y.{n}")
    if x is None or y is None or y.shape != dy.shape:
        raise _lost(slot, i, "has no forward activations for this batch")
    dz = np.array(dy, dtype=y.dtype, order="C")
    if act:
        _activations.backward(act, y, dz)
    W = arrays[f"{i}.kernel"]
    dx = None
    if need_dx:
        dx = np.empty(x.shape, dtype=W.dtype)
        _blas.py_gemm(False, False, 1.0, dz, W, 0.0, dx)     # dx = dz @ W_k (old weights)
    st[2] = 1
    _update_rows_layer(arrays, spec, dz, x, opt, t)
    st[1], st[2] = step + 1, 0
    return dx


def _forward_pair(store, slot: int, a: dict, b: dict, x: np.ndarray, gen: int, step: int,
                  training: bool) -> np.ndarray:
    arrays = _arrays(store)
    _check_state(arrays, slot, b, gen, step)
    h = _forward_rows(store, slot, a, x, activation_id(a["activation"]), gen, step, training)
    W2 = arrays[f"{b['index']}.kernel"]                     # (out2, rows_k)
    part = np.empty((x.shape[0], W2.shape[0]), dtype=W2.dtype)
    _dense.forward(h, W2, None, part, 0)
    return part


def _backward_pair(store, slot: int, a: dict, b: dict, dz2: np.ndarray, need_dx: bool,
                   gen: int, step: int, opt: dict, t: int) -> np.ndarray | None:
    arrays = _arrays(store)
    st_b = _check_state(arrays, slot, b, gen, step)
    ia, ib = a["index"], b["index"]
    h = arrays.get(f"cache.{ia}.y.{dz2.shape[0]}")
    if h is None or h.shape[0] != dz2.shape[0]:
        raise _lost(slot, ib, "has no forward activations for this batch")
    W2 = arrays[f"{ib}.kernel"]                               # (out2, rows_k)
    dh = np.empty(h.shape, dtype=W2.dtype)
    _blas.py_gemm(False, False, 1.0, dz2, W2, 0.0, dh)      # dh = dz2 @ W2_k (old weights)
    dz2t = np.ascontiguousarray(dz2.T)
    st_b[2] = 1

    def kernel_rows(r0, r1, out):                              # dW2_k = dz2^T h
        _blas.py_gemm(False, False, 1.0, dz2t[r0:r1], h, 0.0, out)
    _opt_update(arrays, f"{ib}.kernel", W2, kernel_rows, opt, t)
    st_b[1], st_b[2] = step + 1, 0
    # the first layer of the pair: dh is the delta of exactly this slot's neurons
    return _backward_rows(store, slot, a, dh, activation_id(a["activation"]), need_dx, gen, step, opt, t)


def _gather(store, slot: int, spec: dict, keys: Sequence[str]) -> dict:
    arrays = _arrays(store)
    i = spec["index"]
    return {k: np.array(arrays[f"{i}.{k}"]) for k in keys if f"{i}.{k}" in arrays}


# -- block files: streamed to and from the mapped arrays, never a whole extra copy ---------
def _block_file(folder: str, layer: int, k: int) -> str:
    return os.path.join(folder, f"layer{layer:03d}_block{k:03d}.npz")


def _save_block(arrays: dict, spec: dict, slot: int, folder: str, okeys: Sequence[str]) -> int:
    """Write this slot's block of a layer (params + optimizer state) as one ``.npz``, atomically."""
    i = spec["index"]
    path = _block_file(folder, i, slot)
    total = 0
    with atomic_write(path) as out, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for pname in [n for n, _ in _param_names(spec)]:
            for suffix in [""] + [f".{k}" for k in okeys]:
                arr = arrays[f"{i}.{pname}{suffix}"]
                with zf.open(f"{pname}{suffix}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)
                total += arr.nbytes
        st = np.array(arrays[f"{i}.state"])
        with zf.open("state.npy", "w") as fh:
            np.lib.format.write_array(fh, st, allow_pickle=False)
    return total


def _read_into(zf: zipfile.ZipFile, name: str, out: np.ndarray, path: str) -> None:
    """Stream one ``.npy`` member of a zip into ``out`` (checked shape and dtype)."""
    try:
        fh = zf.open(name + ".npy")
    except KeyError:
        raise ValueError(f"block file {path!r} lacks {name!r}") from None
    with fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        if tuple(shape) != out.shape or np.dtype(dtype) != out.dtype or fortran:
            raise ValueError(f"block file {path!r}: {name!r} is {tuple(shape)} {np.dtype(dtype)}, "
                             f"expected {out.shape} {out.dtype}")
        view = memoryview(out.reshape(-1).view(np.uint8))
        pos, n = 0, out.nbytes
        while pos < n:
            got = fh.readinto(view[pos:min(n, pos + (16 << 20))])
            if not got:
                raise ValueError(f"block file {path!r}: {name!r} is truncated")
            pos += got


def _load_block(arrays: dict, spec: dict, slot: int, folder: str, okeys: Sequence[str]) -> None:
    i = spec["index"]
    path = _block_file(folder, i, slot)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"block file {path!r} is missing (layer {i}, block {slot})")
    with zipfile.ZipFile(path) as zf:
        for pname in [n for n, _ in _param_names(spec)]:
            _read_into(zf, pname, arrays[f"{i}.{pname}"], path)
            for k in okeys:
                _read_into(zf, f"{pname}.{k}", arrays[f"{i}.{pname}.{k}"], path)


def run_op(store, slot: int, op: str, meta: dict, data: dict) -> Any:
    """Executor side: run one block operation for ``slot`` on its resident ``store``.

    ``op`` is one of ``init``, ``forward``, ``forward_pair``, ``backward``,
    ``backward_pair``, ``gather``, ``save``, ``status``.  Returns the slot's result
    (``None`` when the slot holds no block of the layer).
    """
    specs = meta.get("specs", ())
    if op == "init":
        return _init_slot(store, slot, meta)
    if op == "status":
        arrays = _arrays(store)
        layers = {int(s["index"]): (np.array(arrays[f"{s['index']}.state"]).tolist()
                                    if f"{s['index']}.state" in arrays else None)
                  for s in meta["layers"] if slot < s["blocks"]}
        return {"layers": layers, "vm": _vm_size(), "limit": _mem_limit(), "pid": os.getpid(),
                "ppid": os.getppid()}
    if specs and slot >= specs[0]["blocks"]:
        return None
    gen, step = meta.get("generation"), meta.get("step")
    if op == "forward":
        return _forward_rows(store, slot, specs[0], data["x"], meta["act"], gen, step, meta["training"])
    if op == "forward_pair":
        return _forward_pair(store, slot, specs[0], specs[1], data["x"], gen, step, meta["training"])
    if op == "backward":
        lo, hi = specs[0]["offsets"][slot], specs[0]["offsets"][slot + 1]
        dx = _backward_rows(store, slot, specs[0], data["dy"][:, lo:hi], meta["act"], meta["need_dx"], gen,
                            step, meta["optimizer"], meta["t"])
        if meta.get("prefetch"):   # the next step's forward, with the weights just updated
            return dx, _forward_rows(store, slot, specs[0], data["x_next"], meta["act"], gen, step + 1, True)
        return dx
    if op == "backward_pair":
        dx = _backward_pair(store, slot, specs[0], specs[1], data["dy"], meta["need_dx"], gen, step,
                            meta["optimizer"], meta["t"])
        if meta.get("prefetch"):
            return dx, _forward_pair(store, slot, specs[0], specs[1], data["x_next"], gen, step + 1, True)
        return dx
    if op == "gather":
        return {int(sp["index"]): _gather(store, slot, sp, meta["keys"]) for sp in meta["layers"]
                if slot < sp["blocks"]}
    if op == "save":
        arrays = _arrays(store)
        okeys = _opt_keys(meta["optimizer"])
        total = 0
        for spec in meta["layers"]:
            if slot < spec["blocks"]:
                _check_state(arrays, slot, spec, gen, spec_step(meta, spec))
                total += _save_block(arrays, spec, slot, meta["folder"], okeys)
        return total
    raise ValueError(f"unknown block operation {op!r}")


def spec_step(meta: dict, spec: dict) -> int:
    return int(meta["steps"][str(spec["index"])])


class _SlotTask:
    """The picklable job function shipped to the executors: read the broadcasts, run the op."""

    def __init__(self, op: str, meta: dict, broadcast) -> None:
        self.op, self.meta, self.broadcast = op, meta, broadcast

    def __call__(self, index: int, shard) -> Any:
        t0 = time.perf_counter()
        data = self.broadcast.value if self.broadcast is not None else {}
        t1 = time.perf_counter()
        try:
            out = run_op(shard, index, self.op, self.meta, data)
        except MemoryError as exc:
            msg = str(exc)
            if MEMORY_TAG not in msg:
                msg = (f"{MEMORY_TAG}: slot {index} ran out of memory in {self.op!r} "
                       f"(limit {(_mem_limit() or 0) / 2**20:.0f} MiB): {msg or type(exc).__name__}")
            raise MemoryError(msg) from None
        except OSError as exc:
            if exc.errno == 12:  # ENOMEM from mmap
                raise MemoryError(f"{MEMORY_TAG}: slot {index} could not map its block in {self.op!r} "
                                  f"(limit {(_mem_limit() or 0) / 2**20:.0f} MiB): {exc}") from None
            raise
        return (out, os.getppid(), t1 - t0, time.perf_counter() - t1)


def _build_slot(index: int, iterator) -> tuple[dict, dict]:
    """Resident build: a tiny marker array (so the slot's folder exists) and where it lives."""
    for _ in iterator:
        pass
    return {"slot": np.array([index], dtype=np.int64)}, {"pid": os.getpid(), "ppid": os.getppid()}


# ================================================================================ backends
class LocalBlocks:
    """In-process block executor: every slot's arrays in this process (the reference backend).

    Runs exactly the executor code of :class:`SparkBlocks`; useful to check the
    maths without Spark and as the single-machine fallback.
    """

    def __init__(self, n_slots: int) -> None:
        self.n_slots = int(n_slots)
        self.stores = [_MemStore() for _ in range(self.n_slots)]
        self.jobs = 0
        self.last_read_s = self.last_compute_s = 0.0

    def run(self, op: str, meta: dict, data: dict | None = None) -> list:
        self.jobs += 1
        t0 = time.perf_counter()
        try:
            return [run_op(self.stores[k], k, op, meta, data or {}) for k in range(self.n_slots)]
        except RuntimeError as exc:
            reason = lost_reason(exc)
            if reason is not None:
                raise BlockStateLost(reason) from None
            raise
        finally:
            self.last_compute_s = time.perf_counter() - t0

    def placement(self) -> list:
        return [os.getppid()] * self.n_slots

    def close(self) -> None:
        self.stores = [_MemStore() for _ in range(self.n_slots)]


class SparkBlocks:
    """Block executor on Spark: one resident partition per slot (see :mod:`sparknet.cluster.resident`).

    Big inputs (layer inputs, deltas) travel as one broadcast per job, destroyed after it;
    results come back with ``collect``.  ``home`` records the executor process
    (the Python daemon's parent id) that built each slot, and :attr:`moves` counts
    the tasks that ran anywhere else (their arrays were re-attached from the
    mapped files).
    """

    def __init__(self, spark, n_slots: int, name: str = "blocks") -> None:
        from sparknet.cluster.resident import Resident

        sc = getattr(spark, "sparkContext", spark)
        self.sc = sc
        self.n_slots = int(n_slots)
        # the source is just the slot numbers: keep its lineage, so that a slot whose anchor
        # block went with its executor is rebuilt by Spark and re-attaches its mapped files
        self.res = Resident(sc.parallelize(range(self.n_slots), self.n_slots), _build_slot, name=name,
                            cut_lineage=False)
        self.home = [info.meta.get("ppid") for info in self.res.infos]
        self.jobs = 0
        self.tasks = 0
        self.moves = 0
        self.last_read_s = self.last_compute_s = 0.0

    def run(self, op: str, meta: dict, data: dict | None = None) -> list:
        from sparknet.cluster.resident import ResidentStateLost

        # one broadcast for all of the job's arrays: one fetch per executor, not one per array
        bc = self.sc.broadcast(dict(data)) if data else None
        try:
            out = self.res.map(_SlotTask(op, meta, bc))
        except ResidentStateLost as exc:
            raise BlockStateLost(str(exc)) from None
        except Exception as exc:
            msg = str(exc)
            if MEMORY_TAG in msg:
                line = next((ln for ln in msg.splitlines() if MEMORY_TAG in ln), msg)
                raise BlockMemoryError(line.strip().split(f"{MEMORY_TAG}: ", 1)[-1]) from None
            raise
        finally:
            if bc is not None:
                try:
                    bc.destroy()
                except Exception:  # pragma: no cover - context stopped
                    pass
        self.jobs += 1
        results = []
        for k, (res, ppid, t_read, t_op) in enumerate(out):
            self.tasks += 1
            if ppid != self.home[k]:
                self.moves += 1
            results.append(res)
        # the slowest slot's time reading its broadcasts and computing: the job's critical path
        self.last_read_s = max(o[2] for o in out)
        self.last_compute_s = max(o[3] for o in out)
        return results

    def placement(self) -> list:
        return list(self.home)

    def close(self) -> None:
        self.res.close()


# ================================================================================ the model
def _nbytes(a) -> int:
    if isinstance(a, (tuple, list)):
        return sum(_nbytes(v) for v in a)
    return int(a.nbytes) if isinstance(a, np.ndarray) else 0


class _DriverStage:
    """A run of unblocked layers on the driver: a Sequential segment and its optimizer."""

    kind = "driver"

    def __init__(self, owner: "ModelParallel", first: int, layers: list[Layer], in_shape) -> None:
        from sparknet.model import Sequential

        self.owner, self.first = owner, first
        self.seq = Sequential(layers, input_shape=in_shape, dtype=owner.dtype, seed=owner.seed)
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
        self.opt = optim_mod.from_config(owner.opt_meta["name"], owner.opt_meta["config"])

    def forward(self, x, training):
        return self.seq.forward(x, training=training)

    def backward(self, g, need_dx):
        dx = self.seq.backward(g)
        if self.seq.n_params:
            self.opt.step(self.seq.params, self.seq.grads)
        return dx


class _BlockStage:
    """One blocked dense layer cut by output neurons."""

    kind = "block"

    def __init__(self, owner: "ModelParallel", spec: BlockedLayer) -> None:
        self.owner, self.spec = owner, spec
        self.d = spec.to_dict()
        act = spec.activation
        self.act = 0 if (spec.emit_logits and act == "softmax") else activation_id(act)
        #: (input object, output) of a forward pass computed ahead, in the previous backward job
        self._pre = None

    def forward(self, x, training):
        o, s = self.owner, self.spec
        lead = x.shape[:-1]
        pre, self._pre = self._pre, None
        if pre is not None and pre[0] is x and training:
            return pre[1]
        x2 = np.ascontiguousarray(x.reshape(-1, s.in_features), dtype=o.dtype)
        meta = o._meta([self.d], act=self.act, training=bool(training))
        parts = o._run("forward", meta, {"x": x2})
        y = np.concatenate(parts[:s.blocks], axis=1)
        return y.reshape(lead + (s.units,))

    def backward(self, g, need_dx, next_x=None):
        o, s = self.owner, self.spec
        lead = g.shape[:-1]
        g2 = np.ascontiguousarray(g.reshape(-1, s.units), dtype=o.dtype)
        data = {"dy": g2}
        if next_x is not None:
            data["x_next"] = np.ascontiguousarray(next_x.reshape(-1, s.in_features), dtype=o.dtype)
        meta = o._meta([self.d], act=self.act, need_dx=bool(need_dx), backward=True,
                       prefetch=next_x is not None)
        parts = o._run("backward", meta, data)
        o._steps[s.index] += 1
        if next_x is not None:
            y = np.concatenate([p[1] for p in parts[:s.blocks]], axis=1)
            self._pre = (next_x, y.reshape(next_x.shape[:-1] + (s.units,)))
            parts = [p[0] for p in parts]
        if not need_dx:
            return None
        dx = parts[0]
        for p in parts[1:s.blocks]:
            dx += p
        return dx.reshape(lead + (s.in_features,))


class _PairStage:
    """Two blocked dense layers: the first cut by output, the second by input neurons."""

    kind = "pair"

    def __init__(self, owner: "ModelParallel", a: BlockedLayer, b: BlockedLayer) -> None:
        self.owner, self.a, self.b = owner, a, b
        self.da, self.db = a.to_dict(), b.to_dict()
        self.act_b = 0 if (b.emit_logits and b.activation == "softmax") else activation_id(b.activation)
        self.bias = np.zeros(b.units, dtype=owner.dtype) if b.use_bias else None
        self.opt = optim_mod.from_config(owner.opt_meta["name"], owner.opt_meta["config"])
        self._pre = None

    def forward(self, x, training):
        o, a, b = self.owner, self.a, self.b
        lead = x.shape[:-1]
        pre, self._pre = self._pre, None
        if pre is not None and pre[0] is x and training:
            z = pre[1]
        else:
            x2 = np.ascontiguousarray(x.reshape(-1, a.in_features), dtype=o.dtype)
            meta = o._meta([self.da, self.db], training=bool(training))
            parts = o._run("forward_pair", meta, {"x": x2})
            z = parts[0]
            for p in parts[1:a.blocks]:
                z += p
        if self.bias is not None:
            z += self.bias
        if self.act_b:
            _activations.forward(self.act_b, z)
        self._y = z
        return z.reshape(lead + (b.units,))

    def backward(self, g, need_dx, next_x=None):
        o, a, b = self.owner, self.a, self.b
        lead = g.shape[:-1]
        dz = np.array(g.reshape(-1, b.units), dtype=o.dtype, order="C")
        if self.act_b:
            _activations.backward(self.act_b, self._y, dz)
        data = {"dy": dz}
        if next_x is not None:
            data["x_next"] = np.ascontiguousarray(next_x.reshape(-1, a.in_features), dtype=o.dtype)
        meta = o._meta([self.da, self.db], need_dx=bool(need_dx), backward=True, prefetch=next_x is not None)
        parts = o._run("backward_pair", meta, data)
        o._steps[a.index] += 1
        o._steps[b.index] += 1
        if self.bias is not None:
            self.opt.step(self.bias, dz.sum(axis=0, dtype=o.dtype))
        if next_x is not None:
            z = parts[0][1]
            for p in parts[1:a.blocks]:
                z += p[1]
            self._pre = (next_x, z)          # bias and activation are added when it is used
            parts = [p[0] for p in parts]
        if not need_dx:
            return None
        dx = parts[0]
        for p in parts[1:a.blocks]:
            dx += p
        return dx.reshape(lead + (a.in_features,))


class ModelParallel:
    """A layer stack whose large dense layers are cut into neuron blocks living on executors.

    Args:
        layers: the model's layers (a list, or an *unbuilt*
            :class:`~sparknet.model.Sequential` whose layers, dtype, seed and loss are used).
        plan: a :class:`~sparknet.cluster.blocks.BlockPlan` or a ``{layer_index: K}`` dict.
        input_shape: per-sample input shape.
        spark: a ``SparkSession`` or ``SparkContext``; ``None`` runs the blocks in this
            process (:class:`LocalBlocks`, the reference).
        dtype: ``"float32"`` (default) or ``"float64"``.
        seed: seeds every initialisation (driver layers as in ``Sequential``, block ``k``
            of layer ``i`` from ``default_rng([seed, i, k])``).
        optimizer: an :class:`~sparknet.optim.RMSprop` or :class:`~sparknet.optim.SGD`
            (or its name); default RMSprop.  Blocks keep their own share of its state.
        loss: ``"cross_entropy"``, ``"mse"`` or a Loss; default as ``Sequential``.
        checkpoint_dir: folder of checkpoints (:meth:`checkpoint`); when a block's state
            is lost, :meth:`fit` restores the newest checkpoint from here and goes on.
        name: a readable prefix of the executors' resident state.

    Raises:
        ValueError: a bad plan (see :meth:`BlockPlan.resolve`), dtype or optimizer.
        BlockMemoryError: a block does not fit its executor's Python memory limit.
    """

    def __init__(self, layers, plan: "BlockPlan | dict", input_shape: Sequence[int], spark=None,
                 dtype: Any = "float32", seed: int = 0,
                 optimizer: "optim_mod.Optimizer | str | None" = None,
                 loss: "losses_mod.Loss | str | None" = None, checkpoint_dir: str | None = None,
                 name: str = "blocks", _load: dict | None = None) -> None:
        from sparknet.model import Sequential

        if isinstance(layers, Sequential):
            if layers.built:
                raise ValueError("pass the layers or an unbuilt Sequential: a built model already holds "
                                 "every weight on the driver")
            dtype, seed = layers.dtype, layers.seed
            loss = loss if loss is not None else layers._loss
            layers = layers.layers
        layers = list(layers)
        if not layers or not all(isinstance(l, Layer) for l in layers):
            raise ValueError("ModelParallel needs a non-empty list of Layer instances")
        self.layers = layers
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        self.seed = int(seed)
        opt = optim_mod.get(optimizer)
        if opt.name not in ("rmsprop", "sgd"):
            raise ValueError(f"model-parallel training supports RMSprop and SGD, got {opt!r}")
        self.opt_meta = {"name": opt.name, "config": opt.get_config()}
        self.plan = as_plan(plan)
        self.input_shape = tuple(int(d) for d in input_shape)
        if not self.input_shape or any(d <= 0 for d in self.input_shape):
            raise ValueError(f"input_shape must have positive sizes, got {input_shape!r}")
        self.checkpoint_dir = checkpoint_dir
        self.name = name
        self._loss = None if loss is None else losses_mod.get(loss)

        # shapes, without allocating any blocked weight
        last = layers[-1]
        self._softmax_head = getattr(last, "activation", None) == "softmax" and hasattr(last, "emit_logits")
        shapes, shape = [], self.input_shape
        blocked_idx = {i + len(layers) if i < 0 else i for i in self.plan.blocks}
        for i, layer in enumerate(layers):
            shapes.append(shape)
            if i in blocked_idx and hasattr(layer, "units"):
                shape = tuple(shape[:-1]) + (int(layer.units),)
            else:
                try:
                    shape = layer.build(shape, self.dtype)
                except ValueError as exc:
                    raise ValueError(f"layer {i} ({type(layer).__name__}): {exc}") from exc
        self.output_shape = shape
        self.blocked = self.plan.resolve(layers, shapes, self._softmax_head)
        self.n_slots = self.plan.max_blocks
        by_idx = {s.index: s for s in self.blocked}

        # stages in order
        self.stages: list = []
        i, n = 0, len(layers)
        while i < n:
            if i in by_idx:
                s = by_idx[i]
                if s.partner is not None and s.cut == "rows":
                    self.stages.append(_PairStage(self, s, by_idx[s.partner]))
                    i += 2
                else:
                    self.stages.append(_BlockStage(self, s))
                    i += 1
            else:
                j = i
                while j < n and j not in by_idx:
                    j += 1
                self.stages.append(_DriverStage(self, i, layers[i:j], shapes[i]))
                i = j
        if self._softmax_head and n - 1 in by_idx:
            layers[-1].emit_logits = True

        self._steps = {s.index: 0 for s in self.blocked}
        self.t = 0
        self.generation = int(np.random.default_rng().integers(1, 2**62))
        self.last_step_bytes: dict[str, int] = {}
        self._bytes = {"broadcast": 0, "collected": 0, "moved": 0, "jobs": 0}
        self._times = {"executor_read_s": 0.0, "executor_compute_s": 0.0}
        #: per step: the critical path's broadcast reading and block compute time (slowest slot per job)
        self.last_step_times: dict[str, float] = {}
        self.step_times: list[float] = []
        #: how many times lost blocks were restored from a checkpoint
        self.restores = 0
        self._next_raw = self._next_checked = None
        if spark is None:
            self.backend = LocalBlocks(self.n_slots)
        else:
            self.backend = SparkBlocks(spark, self.n_slots, name=name)
        self._spark = spark
        try:
            self._init_blocks(_load)
        except BaseException:
            self.backend.close()
            raise

    # ---------------------------------------------------------------- plumbing
    def _layer_specs(self) -> list[dict]:
        return [s.to_dict() for s in self.blocked]

    def _init_blocks(self, load: dict | None) -> None:
        meta = {"layers": self._layer_specs(), "dtype": self.dtype.name, "seed": self.seed,
                "optimizer": self.opt_meta, "generation": self.generation, "step": 0}
        if load is not None:
            meta["load"] = load["folder"]
            meta["step"] = 0
        self.backend.run("init", meta)

    def _meta(self, specs: list[dict], backward: bool = False, **kw) -> dict:
        step = self._steps[specs[0]["index"]]
        meta = {"specs": specs, "generation": self.generation, "step": step, **kw}
        if backward:
            cfg = dict(self.opt_meta)
            meta["optimizer"] = cfg
            meta["t"] = self.t
        return meta

    def _run(self, op: str, meta: dict, data: dict) -> list:
        out = self.backend.run(op, meta, data)
        sent = sum(_nbytes(v) for v in data.values())
        self._bytes["broadcast"] += sent
        self._bytes["moved"] += sent * meta["specs"][0]["blocks"] + sum(_nbytes(v) for v in out)
        self._bytes["collected"] += sum(_nbytes(v) for v in out)
        self._bytes["jobs"] += 1
        self._times["executor_read_s"] += self.backend.last_read_s
        self._times["executor_compute_s"] += self.backend.last_compute_s
        return out

    @property
    def loss(self) -> losses_mod.Loss:
        return losses_mod.or_default(self._loss, self._softmax_head)

    @property
    def n_blocked_params(self) -> int:
        """Parameters held on the executors (all blocked layers)."""
        return sum(s.n_params - (s.units if s.cut == "cols" and s.use_bias else 0) for s in self.blocked)

    @property
    def exchanges_per_step(self) -> int:
        """Spark jobs per training step (forward + backward), one per blocked layer or pair and direction."""
        return 2 * sum(1 for st in self.stages if st.kind != "driver")

    # --------------------------------------------------------------- training
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        """The network's output (logits for a softmax head) for a batch ``x``."""
        for st in self.stages:
            x = st.forward(x, training)
        return x

    def _prepare_x(self, X) -> np.ndarray:
        from sparknet._validation import check_array
        return check_array(X, name="X", sample_shape=self.input_shape, dtype=self.dtype)

    def _prepare_y(self, y, n: int, lo) -> np.ndarray:
        from sparknet._validation import check_labels, check_targets
        if lo.is_classification:
            return check_labels(y, n, self.output_shape[-1], name="y", lead_shape=self.output_shape[:-1])
        return check_targets(y, n, self.output_shape, self.dtype, name="y")

    def _train_step(self, xb: np.ndarray, yb: np.ndarray, lo,
                    next_x: np.ndarray | None = None) -> tuple[float, float, float]:
        from sparknet.activations import grad as act_grad, softmax

        before = dict(self._bytes)
        before_t = dict(self._times)
        t0 = time.perf_counter()
        self.t += 1
        out = self.forward(xb, training=True)
        pred = softmax(out) if (self._softmax_head and not lo.is_classification) else out
        s, w, g = lo.value_and_grad(pred, yb)
        if not np.isfinite(s):
            self.t -= 1
            raise FloatingPointError(f"loss became {s} at step {self.t + 1}; lower the learning rate")
        if pred is not out:
            g = act_grad("softmax", pred, g)
        for j in range(len(self.stages) - 1, -1, -1):
            st = self.stages[j]
            if j == 0 and next_x is not None and st.kind != "driver":
                g = st.backward(g, need_dx=False, next_x=next_x)
            else:
                g = st.backward(g, need_dx=j > 0)
        correct = float("nan")
        if lo.is_classification:
            correct = float((out.argmax(axis=-1) == yb).sum())
        self.step_times.append(time.perf_counter() - t0)
        self.last_step_bytes = {k: self._bytes[k] - before[k] for k in self._bytes}
        self.last_step_times = {k: self._times[k] - before_t[k] for k in self._times}
        self.last_step_times["step_s"] = self.step_times[-1]
        return float(s), float(w), correct

    def train_on_batch(self, x, y, next_x=None) -> tuple[float, float]:
        """One optimizer step on a batch; returns ``(mean loss, accuracy)``.

        Args:
            x: the batch's inputs.
            y: its labels or targets.
            next_x: optionally the *next* step's inputs: when the model starts with a
                blocked layer (or pair), that layer's forward pass for ``next_x`` runs in
                the same Spark job as this step's backward pass (with the weights just
                updated, so the result is unchanged), saving one exchange per step.  Pass
                the same array object to the next call.

        Returns:
            The batch's mean loss and accuracy (NaN for regression).
        """
        lo = self.loss
        if x is not self._next_raw:
            x = self._prepare_x(x)
        else:
            x = self._next_checked
        y = self._prepare_y(y, x.shape[0], lo)
        nx = None
        if next_x is not None:
            nx = self._prepare_x(next_x)
            self._next_raw, self._next_checked = next_x, nx
        s, w, c = self._guarded(lambda: self._train_step(x, y, lo, nx))
        return (s / w if w else 0.0), (c / w if w else float("nan"))

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BlockStateLost as exc:
            ckpt = self.latest_checkpoint()
            if ckpt is None:
                raise BlockStateLost(
                    f"{exc}; no checkpoint to restore from (set checkpoint_dir and call checkpoint()), "
                    f"training stopped rather than going on with missing or stale weights") from None
            log.warning("block state lost (%s); restoring checkpoint %s and redoing the step", exc, ckpt)
            self.restore(ckpt)
            self.restores += 1
            return fn()

    def fit(self, X, y, epochs: int = 1, batch_size: int = 256, shuffle: bool = True,
            checkpoint_every: int = 0, verbose: int = 0, max_steps: int | None = None,
            lookahead: bool = True) -> dict:
        """Minibatch training with distributed backpropagation.

        Args:
            X: inputs ``(N, *input_shape)``.
            y: class ids (cross-entropy) or targets shaped like the output (MSE).
            epochs: passes over the data.
            batch_size: samples per step.
            shuffle: reshuffle every epoch (seeded by the model's seed).
            checkpoint_every: write a checkpoint to ``checkpoint_dir`` every this many
                steps (0: never).
            verbose: 1 prints one line per epoch.
            max_steps: stop after this many steps in this call.
            lookahead: run the first blocked stage's forward pass for the next batch in the
                same Spark job as its backward pass for this one (same results, one
                exchange fewer per step).

        Returns:
            ``{"loss": [...], "accuracy": [...], "step_time": [...], "bytes_per_step": {...}}``.

        Raises:
            ValueError: bad input shapes or labels.
            BlockStateLost: a block's state is gone and there is no checkpoint.
        """
        from sparknet.model import _positive

        epochs, batch_size = _positive(epochs, "epochs"), _positive(batch_size, "batch_size")
        if checkpoint_every and not self.checkpoint_dir:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
        lo = self.loss
        X = self._prepare_x(X)
        y = self._prepare_y(y, X.shape[0], lo)
        rng = np.random.default_rng([self.seed, 7])
        hist: dict[str, list] = {"loss": [], "accuracy": [], "step_time": []}
        n = X.shape[0]
        done = 0
        for epoch in range(epochs):
            order = rng.permutation(n) if shuffle else np.arange(n)
            tot = np.zeros(3)
            starts = list(range(0, n, batch_size))
            xb = X[order[:batch_size]]
            for bi, b0 in enumerate(starts):
                if max_steps is not None and done >= max_steps:
                    break
                idx = order[b0:b0 + batch_size]
                last = bi + 1 == len(starts) or (max_steps is not None and done + 1 >= max_steps)
                nx = None if (last or not lookahead) else X[order[starts[bi + 1]:starts[bi + 1] + batch_size]]
                s, w, c = self._guarded(lambda: self._train_step(xb, y[idx], lo, nx))
                xb = nx if nx is not None else (X[order[starts[bi + 1]:starts[bi + 1] + batch_size]]
                                                if not last else None)
                tot += (s, w, c)
                done += 1
                hist["step_time"].append(self.step_times[-1])
                if checkpoint_every and self.t % checkpoint_every == 0:
                    self.checkpoint()
            hist["loss"].append(tot[0] / max(tot[1], 1e-12))
            hist["accuracy"].append(tot[2] / max(tot[1], 1e-12) if lo.is_classification else float("nan"))
            if verbose:
                print(f"epoch {epoch + 1}/{epochs}: loss={hist['loss'][-1]:.4f} "
                      f"acc={hist['accuracy'][-1]:.4f} bytes/step={self.last_step_bytes}", flush=True)
        hist["bytes_per_step"] = dict(self.last_step_bytes)
        return hist

    # -------------------------------------------------------------- inference
    def predict_output(self, X, batch_size: int = 512) -> np.ndarray:
        """Network output for ``X`` (probabilities for a softmax head)."""
        from sparknet.activations import softmax
        X = self._prepare_x(X)
        outs = [np.array(self.forward(X[i:i + batch_size], training=False))
                for i in range(0, X.shape[0], batch_size)]
        out = np.concatenate(outs, axis=0)
        return softmax(out) if self._softmax_head else out

    def predict(self, X, batch_size: int = 512) -> np.ndarray:
        """Class ids for a classifier, raw outputs otherwise."""
        out = self.predict_output(X, batch_size)
        return out.argmax(axis=-1) if self.loss.is_classification else out

    def evaluate(self, X, y, batch_size: int = 512) -> dict[str, float]:
        """Mean loss (and accuracy for classifiers) on ``(X, y)``."""
        from sparknet.activations import softmax
        lo = self.loss
        X = self._prepare_x(X)
        y = self._prepare_y(y, X.shape[0], lo)
        tot = np.zeros(3)
        for i in range(0, X.shape[0], batch_size):
            out = self.forward(X[i:i + batch_size], training=False)
            pred = softmax(out) if (self._softmax_head and not lo.is_classification) else out
            s, w, _ = lo.value_and_grad(pred, y[i:i + batch_size], need_grad=False)
            c = float((out.argmax(axis=-1) == y[i:i + batch_size]).sum()) if lo.is_classification else 0.0
            tot += (s, w, c)
        res = {"loss": tot[0] / max(tot[1], 1e-12)}
        if lo.is_classification:
            res["accuracy"] = tot[2] / max(tot[1], 1e-12)
        return res

    # ------------------------------------------------------ weights & files
    def get_layer_weights(self, index: int) -> dict[str, np.ndarray]:
        """The whole ``kernel``/``bias`` of layer ``index``, gathered from its blocks.

        This assembles a blocked layer on the driver: meant for small models, checks and export.
        """
        return self._gather_layers([index])[index]

    def _gather_layers(self, indices: Sequence[int]) -> dict[int, dict[str, np.ndarray]]:
        by_idx = {s.index: s for s in self.blocked}
        wanted = [by_idx[i] for i in indices if i in by_idx]
        parts_all = (self.backend.run("gather", {"layers": [s.to_dict() for s in wanted],
                                                 "keys": ["kernel", "bias"]}) if wanted else [])
        return {i: self._assemble(i, by_idx, parts_all) for i in indices}

    def _assemble(self, index: int, by_idx: dict, parts_all: list) -> dict[str, np.ndarray]:
        if index in by_idx:
            s = by_idx[index]
            parts = [parts_all[k][index] for k in range(s.blocks)]
            axis = 0 if s.cut == "rows" else 1
            out = {"kernel": np.concatenate([p["kernel"] for p in parts], axis=axis)}
            if s.use_bias:
                if s.cut == "rows":
                    out["bias"] = np.concatenate([p["bias"] for p in parts])
                else:
                    out["bias"] = next(st for st in self.stages if st.kind == "pair" and st.b is s).bias.copy()
            return out
        for st in self.stages:
            if st.kind == "driver" and st.first <= index < st.first + len(st.seq.layers):
                sl = st.seq.param_slices()[index - st.first]
                return {k: st.seq.params[a:b].reshape(shape).copy() for k, (a, b, shape) in sl.items()}
        raise ValueError(f"layer index {index} is out of range")

    def status(self) -> list[dict]:
        """Per slot: each layer's ``[generation, step, busy]`` record, and the address space
        (``vm``) and limit of the Python worker that answered (and its ``ppid``)."""
        return self.backend.run("status", {"layers": self._layer_specs()})

    def to_sequential(self):
        """A single-process :class:`~sparknet.model.Sequential` with these weights (small models only)."""
        from sparknet.model import Sequential

        cfg = {"name": "sequential", "dtype": self.dtype.name, "seed": self.seed,
               "input_shape": list(self.input_shape),
               "loss": self._loss.name if self._loss is not None else None,
               "layers": [{"class": type(l).__name__, "config": l.get_config()} for l in self.layers]}
        model = Sequential.from_config(cfg)
        weights = self._gather_layers([i for i, sl in enumerate(model.param_slices()) if sl])
        for i, sl in enumerate(model.param_slices()):
            if not sl:
                continue
            w = weights[i]
            for k, (a, b, shape) in sl.items():
                model.params[a:b] = w[k].reshape(-1)
        return model

    def _driver_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for j, st in enumerate(self.stages):
            if st.kind == "driver":
                out[f"stage{j}.params"] = st.seq.params
                for k, v in st.opt.state_dict().items():
                    if k != "t":
                        out[f"stage{j}.opt.{k}"] = v
                out[f"stage{j}.opt_t"] = np.array(st.opt.t)
            elif st.kind == "pair" and st.bias is not None:
                out[f"stage{j}.bias"] = st.bias
                for k, v in st.opt.state_dict().items():
                    if k != "t":
                        out[f"stage{j}.opt.{k}"] = v
                out[f"stage{j}.opt_t"] = np.array(st.opt.t)
        return out

    def _set_driver_arrays(self, data: dict) -> None:
        for j, st in enumerate(self.stages):
            if st.kind == "driver":
                st.seq.set_params(data[f"stage{j}.params"])
            elif st.kind == "pair" and st.bias is not None:
                st.bias[...] = data[f"stage{j}.bias"]
            else:
                continue
            state = {k.split(".opt.", 1)[1]: v for k, v in data.items() if k.startswith(f"stage{j}.opt.")}
            state["t"] = int(data.get(f"stage{j}.opt_t", 0))
            st.opt.load_state_dict(state)

    def _architecture(self) -> dict:
        return {"dtype": self.dtype.name, "seed": self.seed, "input_shape": list(self.input_shape),
                "loss": self._loss.name if self._loss is not None else None,
                "layers": [{"class": type(l).__name__, "config": l.get_config()} for l in self.layers]}

    def save(self, folder: str) -> str:
        """Write the model, its optimizer state and step count to ``folder``.

        Each executor streams its own blocks into ``layerIII_blockKKK.npz`` files
        (params and optimizer state, written atomically); the driver writes its own
        layers to ``driver.npz`` and ``manifest.json`` last, so a folder with a
        manifest is complete.  On a multi-host cluster ``folder`` must be on a
        filesystem every executor and the driver can reach.

        Returns:
            The folder path.
        """
        folder = os.path.abspath(os.fspath(folder))
        os.makedirs(folder, exist_ok=True)
        man = os.path.join(folder, "manifest.json")
        if os.path.exists(man):
            os.unlink(man)
        meta = {"layers": self._layer_specs(), "folder": folder, "optimizer": self.opt_meta,
                "generation": self.generation,
                "steps": {str(k): v for k, v in self._steps.items()}}
        self.backend.run("save", meta)
        _atomic_savez(os.path.join(folder, "driver.npz"), self._driver_arrays())
        manifest = {"format": FORMAT, "version": VERSION, "architecture": self._architecture(),
                    "plan": self.plan.to_dict(), "optimizer": self.opt_meta, "t": self.t,
                    "steps": {str(k): v for k, v in self._steps.items()}}
        with atomic_write(man, "w") as fh:
            json.dump(manifest, fh)
        return folder

    @staticmethod
    def _read_manifest(folder: str) -> dict:
        man = os.path.join(folder, "manifest.json")
        if not os.path.isfile(man):
            raise FileNotFoundError(f"{folder!r} holds no complete model-parallel model (no manifest.json)")
        with open(man) as fh:
            m = json.load(fh)
        if m.get("format") != FORMAT or m.get("version") != VERSION:
            raise ValueError(f"{folder!r} is not a {FORMAT} version {VERSION} folder")
        return m

    @classmethod
    def load(cls, folder: str, spark=None, checkpoint_dir: str | None = None,
             name: str = "blocks") -> "ModelParallel":
        """Rebuild a model saved by :meth:`save`; each executor streams its blocks from the files."""
        folder = os.path.abspath(os.fspath(folder))
        m = cls._read_manifest(folder)
        arch = m["architecture"]
        layers = []
        for spec in arch["layers"]:
            klass = REGISTRY.get(spec["class"])
            if klass is None:
                raise ValueError(f"unknown layer class {spec['class']!r} in {folder!r}")
            layers.append(klass.from_config(dict(spec["config"])))
        opt = optim_mod.from_config(m["optimizer"]["name"], m["optimizer"]["config"])
        mp = cls(layers, BlockPlan.from_dict(m["plan"]), arch["input_shape"], spark=spark,
                 dtype=arch["dtype"], seed=arch["seed"], optimizer=opt, loss=arch.get("loss"),
                 checkpoint_dir=checkpoint_dir, name=name, _load={"folder": folder})
        mp._after_load(folder, m)
        return mp

    def _after_load(self, folder: str, m: dict) -> None:
        with np.load(os.path.join(folder, "driver.npz"), allow_pickle=False) as data:
            self._set_driver_arrays({k: data[k] for k in data.files})
        self.t = int(m["t"])
        # the executors' step records restart at 0 under this model's own generation
        self._steps = {s.index: 0 for s in self.blocked}

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self) -> str:
        """Save to ``checkpoint_dir/step-<t>`` and return the folder."""
        if not self.checkpoint_dir:
            raise ValueError("checkpoint() needs a checkpoint_dir")
        return self.save(os.path.join(self.checkpoint_dir, f"step-{self.t:09d}"))

    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint folder, or ``None``."""
        d = self.checkpoint_dir
        if not d or not os.path.isdir(d):
            return None
        done = sorted(f for f in os.listdir(d)
                      if f.startswith("step-") and os.path.isfile(os.path.join(d, f, "manifest.json")))
        return os.path.join(d, done[-1]) if done else None

    def restore(self, folder: str) -> None:
        """Replace every block, driver layer and the step count by the checkpoint in ``folder``."""
        m = self._read_manifest(folder)
        self.backend.close()
        self.generation = int(np.random.default_rng().integers(1, 2**62))
        self.backend = (LocalBlocks(self.n_slots) if self._spark is None
                        else SparkBlocks(self._spark, self.n_slots, name=self.name))
        self._init_blocks({"folder": os.path.abspath(folder)})
        self._after_load(folder, m)
        for st in self.stages:
            if hasattr(st, "_pre"):
                st._pre = None

    def close(self) -> None:
        """Drop the resident blocks on the executors (and their files)."""
        self.backend.close()

    def __enter__(self) -> "ModelParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


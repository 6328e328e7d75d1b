"""Mixed precision: bfloat16 matrix products with float32 accumulation.

How it works.  ``Sequential.fit(..., precision="bf16")`` runs its steps inside
:func:`autocast`.  While it is active, the matrix products of :class:`~sparknet.Dense`,
:class:`~sparknet.Conv2D`, :class:`~sparknet.LSTM` and :class:`~sparknet.GRU` (forward,
input gradient and weight gradient) take bfloat16 operands, rounded to nearest even as the
kernel packs them, and accumulate in float32 on AMX tiles or the AVX512-BF16 kernel of
:mod:`sparknet._bf16`.  Everything else stays float32: the master weights and the flat
gradient buffer, the optimizer and its state, biases, activations between layers, the loss
and softmax, normalisation statistics.  Products of two bfloat16 values are exact in float32,
so a product's only error beyond float32's is the rounding of its operands (a relative
2**-8 at most, each).

Weights are cast once per step, not once per product: :func:`packed` keeps a layer's packed
bfloat16 weights keyed on a step token that :func:`next_step` renews (``fit`` calls it before
each step's forward pass; entering and leaving :func:`autocast` renew it too), so a weight
changed by the optimizer, a callback or ``set_params`` is never read stale.  The recurrent
kernels pack their weights once per call (one forward and one backward per step), never per
time step.

On a CPU without AVX512-BF16 (or with ``SPARKNET_BF16=fallback`` set, see
:mod:`sparknet._bf16`) ``precision="bf16"`` trains in float32 and warns once per process.
The trainers on Spark take the same ``precision=``: each executor task decides with
:func:`task_precision` (no warning there), reports a fallback in its result, and the driver
warns once per fit (:func:`warn_executor_fallback`).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from typing import Any, Iterator, NamedTuple

import numpy as np

import sparknet._bf16 as _bf16
import sparknet._recurrent as _recurrent

#: the values ``precision=`` takes
PRECISIONS = ("fp32", "bf16")

_tokens = itertools.count(1)
_warned = False


class _Scope(threading.local):
    """Per thread: whether bfloat16 products are on, and the current step's token."""

    active = False
    token = 0


_scope = _Scope()


class _Packed(NamedTuple):
    """A layer's packed weight: the step token it was packed at, the packing, its source."""

    token: int
    pb: _bf16.PackedB
    src: np.ndarray


class PrecisionFallbackWarning(UserWarning):
    """``precision="bf16"`` was asked for where the bfloat16 kernel is unavailable: float32
    is used."""


def check_precision(value: Any, what: str = "precision") -> str:
    """``value`` when it is ``"fp32"`` or ``"bf16"``; else ``ValueError`` naming ``what``."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ValueError(f"{what} must be 'fp32' or 'bf16', got {value!r}")
    return value


def check_model_precision(model: Any, value: Any, what: str = "precision") -> str:
    """``value`` checked by :func:`check_precision`, and ``"bf16"`` refused for a model that
    is not float32 (naming its dtype and the fix)."""
    value = check_precision(value, what)
    dtype = getattr(model, "dtype", np.dtype(np.float32))
    if value == "bf16" and dtype != np.float32:
        raise ValueError(f"{what}='bf16' trains float32 models; this model is "
                         f"{np.dtype(dtype).name} (build it with dtype='float32')")
    return value


def available() -> bool:
    """True when bfloat16 products run on a bfloat16 kernel here (AMX tiles or AVX512-BF16: this
    CPU, not switched off with ``sparknet._bf16.set_backend("fallback")`` or
    ``SPARKNET_BF16=fallback``)."""
    return bool(_bf16.backend() != "fallback")


def resolve(precision: Any, what: str = "precision") -> str:
    """The precision training will use: ``precision`` itself, or ``"fp32"`` (with one warning
    per process) for ``"bf16"`` where :func:`available` is false."""
    global _warned
    value = check_precision(precision, what)
    if value == "bf16" and not available():
        if not _warned:
            _warned = True
            cpu = _bf16.cpu_features()
            why = ("its bfloat16 kernel is switched off (sparknet._bf16.set_backend or "
                   "SPARKNET_BF16=fallback)" if cpu["avx512_bf16"]
                   else "this CPU has no AVX512-BF16 instructions")
            warnings.warn(f"{what}='bf16' trains in float32 here: {why}. {_NEEDS}",
                          PrecisionFallbackWarning, stacklevel=3)
        return "fp32"
    return value


_NEEDS = ("bfloat16 needs a CPU with AVX512-BF16 (Intel Cooper Lake / Sapphire Rapids or later, "
          "AMD Zen 4 or later); see `python -m sparknet info`.")


def task_precision(precision: str) -> tuple[str, bool]:
    """Executor side: ``(the precision a task runs its products in here, whether that is a
    fallback from "bf16")``; no warning (the driver gives it, see
    :func:`warn_executor_fallback`)."""
    if precision == "bf16" and not available():
        return "fp32", True
    return precision, False


def warn_executor_fallback(what: str = "precision", where: str = "some executors") -> None:
    """Driver side: the one warning of a fit whose executor tasks ran ``"bf16"`` in float32."""
    warnings.warn(f"{what}='bf16' trained in float32 on {where}: their CPU has no AVX512-BF16 "
                  f"instructions or their bfloat16 kernel is switched off (SPARKNET_BF16=fallback "
                  f"in the executors' environment). {_NEEDS}", PrecisionFallbackWarning,
                  stacklevel=2)


def active() -> bool:
    """True inside :func:`autocast` with bfloat16 in effect (in this thread)."""
    return _scope.active


def next_step() -> None:
    """Mark that weights may have changed: the next :func:`packed` call packs them again."""
    _scope.token = next(_tokens)


@contextlib.contextmanager
def autocast(precision: str = "bf16", what: str = "precision") -> Iterator[str]:
    """Within the block, the layers' matrix products run in ``precision`` (resolved by
    :func:`resolve`; yields the precision in effect).  Nests; per thread."""
    value = resolve(precision, what)
    before = _scope.active
    _scope.active = value == "bf16"
    next_step()
    try:
        yield value
    finally:
        _scope.active = before
        next_step()


def packed(layer: Any, key: str, w: np.ndarray, trans: bool) -> _bf16.PackedB:
    """The matrix ``w`` (``trans=False``) or ``w.T`` (``trans=True``) packed for the bfloat16
    kernel, at most once per step: kept on ``layer`` under ``key`` with the step token (and refilled
    in place at the next step)."""
    cache: dict[str, _Packed] = layer.__dict__.setdefault("_bf16_packed", {})
    token = _scope.token
    hit = cache.get(key)
    if hit is not None and hit.token == token:
        return hit.pb
    w2 = np.ascontiguousarray(w, dtype=np.float32)
    if w2.ndim != 2:
        raise ValueError(f"packed: {key!r} must be a matrix, got shape {w2.shape}")
    K, N = (w2.shape[1], w2.shape[0]) if trans else w2.shape
    if hit is not None and (hit.pb.K, hit.pb.N, hit.pb.trans) == (K, N, trans):
        pb = hit.pb
        pb.refill(w2)
    else:
        pb = _bf16.pack(w2, trans)
    cache[key] = _Packed(token, pb, w2)
    return pb


def optimizer_step(model: Any, opt: Any) -> bool:
    """``opt.step(model.params, model.grads)``; inside :func:`autocast` with bfloat16 on, the
    packed weights of the model's layers are also refilled from the new values (by the
    optimizer in its own pass where it can, :meth:`sparknet.optim.Optimizer.step`, else just
    after) and stamped with a new step token.  Returns True when so: the next step's forward
    and backward may then run without :func:`next_step` (which would pack them again), as long
    as nothing else changes the weights in between."""
    if not _scope.active:
        opt.step(model.params, model.grads)
        return False
    next_step()
    entries, targets = _pack_targets(model)
    if not opt.step(model.params, model.grads, pack=targets):
        for offset, rows, cols, packs in targets:
            w = model.params[offset:offset + rows * cols].reshape(rows, cols)
            for pb in packs:
                pb.refill(w)
    for cache, key in entries:
        cache[key] = cache[key]._replace(token=_scope.token)
    return True


def _pack_targets(model: Any) -> tuple[list[tuple[dict[str, _Packed], str]],
                                       list[tuple[int, int, int, tuple[Any, ...]]]]:
    """The layers' packed weights that are views of ``model.params``: the cache entries, and
    per weight ``(offset, rows, cols, packs)`` for :func:`sparknet._optim.rmsprop_pack`."""
    params = model.params
    base, end = params.ctypes.data, params.ctypes.data + params.nbytes
    entries = []
    by_offset: dict[int, tuple[int, int, list[_bf16.PackedB]]] = {}
    for layer in model.layers:
        cache = layer.__dict__.get("_bf16_packed")
        for key, hit in (cache or {}).items():
            src = hit.src
            if not base <= src.ctypes.data < end or src.dtype != params.dtype:
                continue                  # a copy, not the weight itself: packed when used
            offset = (src.ctypes.data - base) // params.itemsize
            rows, cols, packs = by_offset.setdefault(offset, (src.shape[0], src.shape[1], []))
            if (rows, cols) != src.shape:
                continue
            packs.append(hit.pb)
            entries.append((cache, key))
    targets = [(off, rows, cols, tuple(packs)) for off, (rows, cols, packs) in by_offset.items()]
    return entries, targets


def capabilities() -> dict[str, Any]:
    """The paths sparknet's matrix products take here (see :func:`sparknet._bf16.capabilities`),
    and ``"fp32_recurrent"``: the float32 recurrent steps' products on the built-in
    ``"avx512"`` or ``"avx2"`` kernel, or on the ``"blas"``
    (:func:`sparknet._recurrent.step_kernel_isa`)."""
    caps = dict(_bf16.capabilities())
    caps["fp32_recurrent"] = _recurrent.step_kernel_isa() or "blas"
    return caps


def describe() -> str:
    """One line per path, for ``python -m sparknet info`` and benchmark headers."""
    caps = capabilities()
    cpu = caps["cpu"]
    kernel = {"avx512": "AVX-512 kernel", "avx2": "AVX2 kernel", "blas": "BLAS"}
    fp32 = (f"dense and conv {kernel[caps['fp32']]}, "
            f"recurrent steps {kernel[caps['fp32_recurrent']]}")
    if caps["bf16"] == "amx":
        bf16 = "AMX tiles (tdpbf16ps) and AVX512-BF16 kernel: precision='bf16' available"
    elif caps["bf16"]:
        bf16 = "AVX512-BF16 kernel (vdpbf16ps): precision='bf16' available"
    elif cpu["avx512_bf16"]:
        bf16 = "CPU has AVX512-BF16, kernel switched off: precision='bf16' trains in float32"
    else:
        bf16 = "no AVX512-BF16 on this CPU: precision='bf16' trains in float32"
    amx = caps["amx"]
    return f"fp32 products: {fp32}\nbf16 products: {bf16}\nAMX: {amx}"

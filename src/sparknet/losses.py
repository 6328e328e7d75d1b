"""Losses: softmax cross-entropy (from logits) and mean squared error.

A loss reads the model's output ``out`` of shape ``(N, ..., C)`` and targets of
shape ``(N, ...)`` (class ids, cross-entropy) or ``(N, ..., C)`` (MSE), with an
optional weight of shape ``(N, ...)`` (0 drops a row: masked time steps).
:meth:`Loss.value_and_grad` returns the weighted loss *sum* and the weight
total, and writes ``scale * d(sum)/d(out)`` where ``scale`` defaults to
``1 / weight total``, the gradient of the mean.
"""
from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

import sparknet._losses as _losses


class Loss:
    """A loss: :meth:`value_and_grad` of the model's output against its targets."""

    name = "loss"
    #: True when targets are class ids and accuracy is meaningful
    is_classification = False

    @overload
    def value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None = None,
                       scale: float | None = None, need_grad: Literal[True] = True
                       ) -> tuple[float, float, np.ndarray]: ...
    @overload
    def value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None = None,
                       scale: float | None = None, *, need_grad: bool
                       ) -> tuple[float, float, np.ndarray | None]: ...

    def value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None = None,
                       scale: float | None = None, need_grad: bool = True
                       ) -> tuple[float, float, np.ndarray | None]:
        """``(weighted loss sum, weight total, gradient)``: the gradient, of ``out``'s shape,
        is ``scale * d(sum)/d(out)`` (``scale`` defaults to ``1 / weight total``), or None
        when not ``need_grad``."""
        return self._value_and_grad(out, target, weight, scale, need_grad)

    def _value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None,
                        scale: float | None,
                        need_grad: bool) -> tuple[float, float, np.ndarray | None]:
        """What a loss implements: :meth:`value_and_grad` with every argument given."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _row_weights(weight: np.ndarray | None, rows: int, dtype: np.dtype,
                 scale: float | None) -> tuple[np.ndarray | None, float, float]:
    """``(flat weight or None, weight total, scale)``; ``scale`` defaults to ``1 / total``
    (0 when the total is 0), the gradient of the mean."""
    w = None
    if weight is not None:
        w = np.ascontiguousarray(np.asarray(weight, dtype=dtype).reshape(-1))
        if w.shape[0] != rows:
            raise ValueError(f"loss weight has {w.shape[0]} entries for {rows} output rows")
    total_w = float(rows if w is None else w.sum(dtype=np.float64))
    if scale is None:
        scale = 1.0 / total_w if total_w > 0 else 0.0
    return w, total_w, float(scale)


class SoftmaxCrossEntropy(Loss):
    """Cross-entropy of integer class ids against ``softmax(logits)``, computed with a
    stable log-sum-exp.  Mean over (weighted) rows by default."""

    name = "cross_entropy"
    is_classification = True

    def _value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None,
                        scale: float | None,
                        need_grad: bool) -> tuple[float, float, np.ndarray | None]:
        C = out.shape[-1]
        z = np.ascontiguousarray(out.reshape(-1, C))
        t = np.ascontiguousarray(np.asarray(target).reshape(-1), dtype=np.int64)
        if t.shape[0] != z.shape[0]:
            raise ValueError(f"cross-entropy: {t.shape[0]} labels for {z.shape[0]} output rows")
        w, total_w, scale = _row_weights(weight, z.shape[0], z.dtype, scale)
        grad = np.empty_like(z) if need_grad else None
        s = _losses.softmax_cross_entropy(z, t, w, grad, scale)
        return s, total_w, (None if grad is None else grad.reshape(out.shape))


class MeanSquaredError(Loss):
    """Squared error, averaged over the last axis, then over (weighted) rows."""

    name = "mse"

    def _value_and_grad(self, out: np.ndarray, target: Any, weight: np.ndarray | None,
                        scale: float | None,
                        need_grad: bool) -> tuple[float, float, np.ndarray | None]:
        D = out.shape[-1]
        o = np.ascontiguousarray(out.reshape(-1, D))
        t = np.ascontiguousarray(np.asarray(target, dtype=o.dtype).reshape(-1, D))
        if t.shape[0] != o.shape[0]:
            raise ValueError(f"mse: {t.shape[0]} target rows for {o.shape[0]} output rows")
        w, total_w, scale = _row_weights(weight, o.shape[0], o.dtype, scale)
        grad = np.empty_like(o) if need_grad else None
        s = _losses.mean_squared_error(o, t, w, grad, scale)
        return s, total_w, (None if grad is None else grad.reshape(out.shape))


_ALIASES = {
    "cross_entropy": SoftmaxCrossEntropy, "crossentropy": SoftmaxCrossEntropy,
    "softmax_cross_entropy": SoftmaxCrossEntropy, "categorical_crossentropy": SoftmaxCrossEntropy,
    "sparse_categorical_crossentropy": SoftmaxCrossEntropy, "ce": SoftmaxCrossEntropy,
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError,
}


def get(loss: "str | Loss") -> Loss:
    """A :class:`Loss` from a name (``"cross_entropy"``, ``"mse"``, aliases) or an instance."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str) and loss.lower() in _ALIASES:
        return _ALIASES[loss.lower()]()
    raise ValueError(f"unknown loss {loss!r}; use 'cross_entropy' or 'mse' (or a Loss instance)")


def or_default(loss: "Loss | None", softmax_head: bool) -> Loss:
    """``loss``, or the default of a network without one: cross-entropy when it ends in a
    softmax, mean squared error otherwise."""
    if loss is not None:
        return loss
    return SoftmaxCrossEntropy() if softmax_head else MeanSquaredError()

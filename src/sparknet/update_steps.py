"""The functional optimizer steps and the gradient clipping they share.

Each step takes its state explicitly (as PyTorch's ``torch.optim._functional`` does) and is
one fused, GIL-free Cython pass (:mod:`sparknet._optim`): :func:`rmsprop`, :func:`sgd` and
:func:`adam` serve a :class:`~sparknet.model.Sequential` (state held by its optimizer), a
data-parallel partition (state resident on its executor) and a model-parallel block (state
beside the block).  The optimizer classes (:mod:`sparknet.optim`) call them with their
hyper-parameters; both modules export them.
"""
from __future__ import annotations

import numpy as np

import sparknet._optim as _optim

#: added to the gradient's norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does
CLIP_EPS = 1e-6


# --------------------------------------------------------------------------- functional steps
def rmsprop(params: np.ndarray, grads: np.ndarray, square_avg: np.ndarray,
            grad_avg: np.ndarray | None = None, momentum_buffer: np.ndarray | None = None, *,
            lr: float, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
            momentum: float = 0.0) -> None:
    """One RMSprop step in place (``torch.optim.RMSprop``'s formulas); all arrays flat, one
    length and dtype.  ``grad_avg`` given means centered; ``momentum > 0`` needs
    ``momentum_buffer``."""
    _optim.rmsprop(params, grads, square_avg, grad_avg, momentum_buffer, lr, alpha, eps,
                   weight_decay, momentum)


def sgd(params: np.ndarray, grads: np.ndarray, momentum_buffer: np.ndarray | None = None, *,
        lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, first_step: bool) -> None:
    """One SGD step in place (``torch.optim.SGD``'s formulas); ``first_step`` seeds the
    momentum buffer with the gradient, as PyTorch does on its first step."""
    _optim.sgd(params, grads, momentum_buffer, lr, momentum, dampening, weight_decay,
               nesterov, first_step)


def adam(params: np.ndarray, grads: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
         max_exp_avg_sq: np.ndarray | None = None, *, lr: float, beta1: float = 0.9,
         beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
         decoupled: bool = False, step: int) -> None:
    """One Adam step number ``step`` (1-based) in place (``torch.optim.Adam``'s formulas;
    ``decoupled``: ``torch.optim.AdamW``'s decoupled weight decay); ``max_exp_avg_sq``
    given means amsgrad."""
    _optim.adam(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, beta1, beta2, eps,
                weight_decay, decoupled, step)


# --------------------------------------------------------------------------- clipping
def clip_by_value(grads: np.ndarray, clipvalue: float) -> None:
    """Clamp the flat ``grads`` to ``[-clipvalue, clipvalue]`` in place (a NaN stays NaN)."""
    _optim.clamp(grads, float(clipvalue))


def sum_of_squares(grads: np.ndarray) -> float:
    """``sum(grads ** 2)`` of a flat buffer, accumulated in float64 (for float32 too)."""
    return float(_optim.sumsq(grads))


def norm_scale(sumsq: float, clipnorm: float) -> float:
    """The factor ``torch.nn.utils.clip_grad_norm_`` multiplies by, for a gradient of squared
    2-norm ``sumsq``: ``clipnorm / (norm + 1e-6)`` when below 1, else 1 (a non-finite norm
    gives 0 or NaN, as in PyTorch)."""
    coef = float(clipnorm) / (float(np.sqrt(sumsq)) + CLIP_EPS)
    return coef if not coef >= 1.0 else 1.0


def scale(grads: np.ndarray, factor: float) -> None:
    """Multiply the flat ``grads`` by ``factor`` in place (nothing to do for 1)."""
    if factor != 1.0:
        _optim.scale(grads, float(factor))

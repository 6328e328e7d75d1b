"""Finite-difference gradient checks shared by the layer tests.

``model_gradcheck`` compares the analytic gradients of a float64 model (w.r.t.
every parameter, or a random subset, and w.r.t. its float input) with central
differences of the scalar ``L = sum(R * forward(x))`` for a fixed random ``R``.
The relative error is ``max(||a - n|| - noise, 0) / max(||a|| + ||n||, tiny)``, where
``noise`` is what central differences cannot resolve: the rounding of one evaluation of
``L`` (``machine eps * sum|R * forward(x)|``) divided by the step, over the compared entries.
It only matters where a gradient is itself near that level (a saturated tanh, say); for
gradients of ordinary size it is orders of magnitude below ``1e-6 * ||a||``.
"""
from __future__ import annotations

import numpy as np

from sparknet.activations import is_softmax_head


def rel_error(a: np.ndarray, n: np.ndarray, noise: float = 0.0) -> float:
    a, n = np.ravel(a), np.ravel(n)
    denom = max(np.linalg.norm(a) + np.linalg.norm(n), 1e-300)
    return float(max(np.linalg.norm(a - n) - noise, 0.0) / denom)


def model_gradcheck(model, x, mask=None, eps: float = 1e-6, seed: int = 0,
                    max_params: int = 400, max_inputs: int = 200, keep_softmax: bool = True,
                    randomize: bool = True):
    """Return ``(param_rel_error, input_rel_error)`` for a built float64 model.

    ``randomize`` first replaces the parameters by seeded N(0, 0.5^2) draws, so that no
    bias sits exactly at a kink (zero-initialised biases behind a relu would).
    ``keep_softmax`` makes a trailing softmax part of the checked function (instead of
    being fused into a loss; the model is then fit for this check only).
    ``input_rel_error`` is None for integer inputs.
    """
    assert model.dtype == np.float64, "gradient checks run in float64"
    if keep_softmax:
        last = model.layers[-1]
        if is_softmax_head(last):  # the softmax the loss took over computed again
            last.emit_logits = False
    rng = np.random.default_rng(seed)
    if randomize and model.params.size:
        model.params[...] = 0.5 * rng.standard_normal(model.params.shape)
    out = model.forward(x, training=False, mask=mask)
    R = rng.standard_normal(out.shape)
    # rounding of one evaluation of f, divided by the central-difference step, per entry
    fd_noise = np.finfo(np.float64).eps * float(np.abs(out * R).sum()) / eps

    def f() -> float:
        return float((model.forward(x, training=False, mask=mask) * R).sum())

    model.forward(x, training=False, mask=mask)
    dx = model.backward(R.copy())
    ga = model.grads.copy()

    n = model.params.shape[0]
    idx = np.arange(n) if n <= max_params else rng.choice(n, max_params, replace=False)
    num = np.empty(len(idx))
    for k, i in enumerate(idx):
        old = model.params[i]
        model.params[i] = old + eps
        fp = f()
        model.params[i] = old - eps
        fm = f()
        model.params[i] = old
        num[k] = (fp - fm) / (2 * eps)
    p_err = rel_error(ga[idx], num, fd_noise * np.sqrt(len(idx))) if n else 0.0

    x_err = None
    if np.issubdtype(np.asarray(x).dtype, np.floating):
        xf = x.reshape(-1)
        m = xf.shape[0]
        jdx = np.arange(m) if m <= max_inputs else rng.choice(m, max_inputs, replace=False)
        numx = np.empty(len(jdx))
        for k, j in enumerate(jdx):
            old = xf[j]
            xf[j] = old + eps
            fp = f()
            xf[j] = old - eps
            fm = f()
            xf[j] = old
            numx[k] = (fp - fm) / (2 * eps)
        x_err = rel_error(np.asarray(dx).reshape(-1)[jdx], numx, fd_noise * np.sqrt(len(jdx)))
    return p_err, x_err

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Loss kernels: value and gradient in one pass, GIL released.

Both kernels take an optional per-row weight (0 masks a row out, as padded
time steps are) and a ``scale`` applied to the gradient, so that a caller can
turn a sum over rows into a mean over any normaliser (a local batch, or a
global batch split across Spark partitions).  They return the weighted *sum*
of per-row losses, accumulated in double precision.
"""
from cython cimport floating
from libc.math cimport exp, log, expf, logf
from libc.stdint cimport int64_t


def softmax_cross_entropy(const floating[:, ::1] logits, const int64_t[::1] labels,
                          const floating[::1] weight, floating[:, ::1] grad, double scale):
    """Softmax cross-entropy from logits (log-sum-exp, stable).

    loss_i = w_i * (logsumexp(z_i) - z_i[y_i]); grad_i = scale * w_i * (softmax(z_i) - onehot(y_i)).
    ``grad`` may be None (value only). Labels must already be validated in [0, C).
    """
    cdef Py_ssize_t N = logits.shape[0], C = logits.shape[1]
    cdef Py_ssize_t i, j
    cdef bint has_w = weight is not None
    cdef bint has_g = grad is not None
    cdef double total = 0, m, s, lse, w
    cdef const floating* z
    cdef floating* g
    cdef floating gs
    if labels.shape[0] != N or (has_w and weight.shape[0] != N) or (
            has_g and (grad.shape[0] != N or grad.shape[1] != C)):
        raise ValueError("softmax_cross_entropy: shape mismatch")
    if C == 0:
        return 0.0
    with nogil:
        for i in range(N):
            z = &logits[i, 0]
            w = weight[i] if has_w else 1.0
            m = z[0]
            for j in range(1, C):
                if z[j] > m:
                    m = z[j]
            s = 0
            for j in range(C):
                s = s + exp(z[j] - m)
            lse = m + log(s)
            total = total + w * (lse - z[labels[i]])
            if has_g:
                g = &grad[i, 0]
                gs = <floating>(scale * w)
                if gs == 0:
                    for j in range(C):
                        g[j] = 0
                else:
                    for j in range(C):
                        if floating is float:
                            g[j] = gs * expf(<float>(z[j] - lse))
                        else:
                            g[j] = gs * exp(z[j] - lse)
                    g[labels[i]] = g[labels[i]] - gs
    return total


def mean_squared_error(const floating[:, ::1] out, const floating[:, ::1] target,
                       const floating[::1] weight, floating[:, ::1] grad, double scale):
    """Squared error averaged over the D outputs of each row.

    loss_i = w_i * sum_j (o_ij - t_ij)^2 / D; grad_ij = scale * w_i * 2 (o_ij - t_ij) / D.
    """
    cdef Py_ssize_t N = out.shape[0], D = out.shape[1]
    cdef Py_ssize_t i, j
    cdef bint has_w = weight is not None
    cdef bint has_g = grad is not None
    cdef double total = 0, row, w, diff
    cdef floating gs
    if (target.shape[0] != N or target.shape[1] != D or (has_w and weight.shape[0] != N)
            or (has_g and (grad.shape[0] != N or grad.shape[1] != D))):
        raise ValueError("mean_squared_error: shape mismatch")
    if D == 0:
        return 0.0
    with nogil:
        for i in range(N):
            w = weight[i] if has_w else 1.0
            row = 0
            for j in range(D):
                diff = <double>out[i, j] - <double>target[i, j]
                row = row + diff * diff
            total = total + w * row / D
            if has_g:
                gs = <floating>(scale * w * 2.0 / D)
                for j in range(D):
                    grad[i, j] = gs * (out[i, j] - target[i, j])
    return total

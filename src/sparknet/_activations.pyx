# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Activation kernels: forward and backward, in place, GIL released.

Backward passes are written in terms of the forward *output* ``y`` so that a
layer only keeps its output: relu' = [y > 0], tanh' = 1 - y^2,
sigmoid' = y (1 - y), softmax: dz = y * (dy - <dy, y>) per row.
"""
from cython cimport floating
from libc.math cimport exp, tanh, expf, tanhf

cdef inline floating _exp(floating x) noexcept nogil:
    if floating is float:
        return expf(x)
    else:
        return exp(x)

cdef inline floating _tanh(floating x) noexcept nogil:
    if floating is float:
        return tanhf(x)
    else:
        return tanh(x)

cdef inline floating _sigmoid(floating x) noexcept nogil:
    cdef floating e
    if x >= 0:
        return 1 / (1 + _exp(-x))
    e = _exp(x)
    return e / (1 + e)


cdef void act_forward_row(int act, floating* z, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating m, s
    if act == ACT_RELU:
        for j in range(n):
            if z[j] < 0:
                z[j] = 0
    elif act == ACT_TANH:
        for j in range(n):
            z[j] = _tanh(z[j])
    elif act == ACT_SIGMOID:
        for j in range(n):
            z[j] = _sigmoid(z[j])
    elif act == ACT_SOFTMAX:
        if n == 0:
            return
        m = z[0]
        for j in range(1, n):
            if z[j] > m:
                m = z[j]
        s = 0
        for j in range(n):
            z[j] = _exp(z[j] - m)
            s = s + z[j]
        s = 1 / s
        for j in range(n):
            z[j] = z[j] * s


cdef void act_backward_row(int act, const floating* y, floating* dy, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating s
    if act == ACT_RELU:
        for j in range(n):
            if y[j] <= 0:
                dy[j] = 0
    elif act == ACT_TANH:
        for j in range(n):
            dy[j] = dy[j] * (1 - y[j] * y[j])
    elif act == ACT_SIGMOID:
        for j in range(n):
            dy[j] = dy[j] * y[j] * (1 - y[j])
    elif act == ACT_SOFTMAX:
        s = 0
        for j in range(n):
            s = s + dy[j] * y[j]
        for j in range(n):
            dy[j] = y[j] * (dy[j] - s)


def forward(int act, floating[:, ::1] z):
    """Apply activation ``act`` to ``z`` (rows, cols) in place; softmax is per row."""
    cdef Py_ssize_t i, rows = z.shape[0], cols = z.shape[1]
    if act == ACT_IDENTITY or rows == 0 or cols == 0:
        return
    with nogil:
        if act == ACT_SOFTMAX:
            for i in range(rows):
                act_forward_row(act, &z[i, 0], cols)
        else:
            # elementwise: treat the whole buffer as one row
            act_forward_row(act, &z[0, 0], rows * cols)


def backward(int act, const floating[:, ::1] y, floating[:, ::1] dy):
    """``dy <- dy * f'(z)`` in place, written through the forward output ``y``."""
    cdef Py_ssize_t i, rows = y.shape[0], cols = y.shape[1]
    if dy.shape[0] != rows or dy.shape[1] != cols:
        raise ValueError(f"activation backward: y is ({rows}, {cols}), dy is ({dy.shape[0]}, {dy.shape[1]})")
    if act == ACT_IDENTITY or rows == 0 or cols == 0:
        return
    with nogil:
        if act == ACT_SOFTMAX:
            for i in range(rows):
                act_backward_row(act, &y[i, 0], &dy[i, 0], cols)
        else:
            act_backward_row(act, &y[0, 0], &dy[0, 0], rows * cols)

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Activation kernels: forward and backward, in place, GIL released.

Backward passes are written in terms of the forward *output* ``y`` so that a
layer only keeps its output: relu' = [y > 0], tanh' = 1 - y^2,
sigmoid' = y (1 - y), softmax: dz = y * (dy - <dy, y>) per row.

GELU is not invertible, so its derivative is written through the *input* ``z``
(``act_needs_input``; a layer keeps ``z`` and calls ``act_backward_input_row``):

- exact: gelu(z) = z Phi(z) = 0.5 z (1 + erf(z / sqrt 2)),
  gelu'(z) = Phi(z) + z phi(z), phi(z) = exp(-z^2 / 2) / sqrt(2 pi);
- tanh form (``torch.nn.functional.gelu(approximate="tanh")``):
  gelu(z) = 0.5 z (1 + t), t = tanh(u), u = sqrt(2 / pi) (z + 0.044715 z^3),
  gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 z^2).

In float32 the gelus run as vectorised C loops over branch-free ``sn_expf`` and
``sn_phif`` (``_activations.pxd``), the tanh form as ``0.5 (1 + tanh u) = s =
sigmoid(2 u)``: gelu(z) = z s, gelu'(z) = s + 2 z s (1 - s) u'(z).  float64 calls libm.
"""
from cython cimport floating
from libc.math cimport erf, exp, tanh, expf, tanhf
from sparknet._activations cimport (sn_gelu_f, sn_gelu_back_f, sn_gelu_tanh_f,
                                    sn_gelu_tanh_back_f, sn_silu_f, sn_silu_back_f,
                                    sn_self, sn_seld)

cdef double _SQRT1_2 = 0.70710678118654752440        # 1 / sqrt(2)
cdef double _INV_SQRT_2PI = 0.39894228040143267794   # 1 / sqrt(2 pi)
cdef double _SQRT_2_PI = 0.79788456080286535588      # sqrt(2 / pi)
cdef double _GELU_C = 0.044715

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
            # a select, not a branch: vectorised, no mispredictions on mixed signs
            z[j] = 0 if z[j] < 0 else z[j]
    elif act == ACT_TANH:
        for j in range(n):
            z[j] = _tanh(z[j])
    elif act == ACT_SIGMOID:
        for j in range(n):
            z[j] = _sigmoid(z[j])
    elif act == ACT_GELU:
        if floating is float:
            sn_gelu_f(z, n)
        else:
            for j in range(n):
                # 0.5 z (1 + erf(z / sqrt 2)) = z Phi(z)
                z[j] = 0.5 * z[j] * (1 + erf(z[j] * _SQRT1_2))
    elif act == ACT_GELU_TANH:
        if floating is float:
            sn_gelu_tanh_f(z, n)
        else:
            for j in range(n):
                # 0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + c z^3)
                m = z[j]
                z[j] = 0.5 * m * (1 + tanh(_SQRT_2_PI * (m + _GELU_C * m * m * m)))
    elif act == ACT_SILU:
        if floating is float:
            sn_silu_f(z, n)
        else:
            for j in range(n):
                z[j] = z[j] * _sigmoid(z[j])
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
            dy[j] = 0 if y[j] <= 0 else dy[j]
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


cdef void act_backward_input_row(int act, const floating* z, floating* dy,
                                 Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    cdef floating x, t
    if act == ACT_GELU:
        if floating is float:
            sn_gelu_back_f(z, dy, n)
        else:
            for j in range(n):
                # dy (Phi(z) + z phi(z))
                x = z[j]
                dy[j] = dy[j] * (0.5 * (1 + erf(x * _SQRT1_2))
                                 + x * _INV_SQRT_2PI * exp(-0.5 * x * x))
    elif act == ACT_GELU_TANH:
        if floating is float:
            sn_gelu_tanh_back_f(z, dy, n)
        else:
            for j in range(n):
                # dy (0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 c z^2)), t = tanh(u)
                x = z[j]
                t = tanh(_SQRT_2_PI * (x + _GELU_C * x * x * x))
                dy[j] = dy[j] * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_PI
                                 * (1 + 3 * _GELU_C * x * x))
    elif act == ACT_SILU:
        if floating is float:
            sn_silu_back_f(z, dy, n)
        else:
            for j in range(n):
                # dy s (1 + z (1 - s)), s = sigmoid(z)
                x = z[j]
                t = _sigmoid(x)
                dy[j] = dy[j] * t * (1 + x * (1 - t))


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
    """``dy <- dy * f'(z)`` in place, written through the forward output ``y``
    (:func:`backward_input` for the gelus, whose derivative needs ``z``)."""
    cdef Py_ssize_t i, rows = y.shape[0], cols = y.shape[1]
    if dy.shape[0] != rows or dy.shape[1] != cols:
        raise ValueError(f"activation backward: y is ({rows}, {cols}), dy is ({dy.shape[0]}, {dy.shape[1]})")
    if act_needs_input(act):
        raise ValueError(f"activation backward: activation id {act} (a gelu or silu) has no derivative "
                         f"through its output; keep its input z and call backward_input")
    if act == ACT_IDENTITY or rows == 0 or cols == 0:
        return
    with nogil:
        if act == ACT_SOFTMAX:
            for i in range(rows):
                act_backward_row(act, &y[i, 0], &dy[i, 0], cols)
        else:
            act_backward_row(act, &y[0, 0], &dy[0, 0], rows * cols)


def backward_input(int act, const floating[:, ::1] z, floating[:, ::1] dy):
    """``dy <- dy * f'(z)`` in place, written through the forward input ``z`` (the gelus,
    silu)."""
    cdef Py_ssize_t rows = z.shape[0], cols = z.shape[1]
    if dy.shape[0] != rows or dy.shape[1] != cols:
        raise ValueError(f"activation backward: z is ({rows}, {cols}), "
                         f"dy is ({dy.shape[0]}, {dy.shape[1]})")
    if not act_needs_input(act):
        raise ValueError(f"activation backward_input: activation id {act} is written through its "
                         f"output; call backward")
    if rows == 0 or cols == 0:
        return
    with nogil:
        act_backward_input_row(act, &z[0, 0], &dy[0, 0], rows * cols)


cdef void _leaky_scale(const floating* sign, floating* v, Py_ssize_t n,
                       floating a) noexcept nogil:
    """``v <- v if sign > 0 else a * v`` over ``n`` values (``sign`` may be ``v``): a select
    on the bits, so that the loop vectorises."""
    cdef Py_ssize_t j
    if floating is float:
        for j in range(n):
            v[j] = sn_self(sign[j] > 0, v[j], a * v[j])
    else:
        for j in range(n):
            v[j] = sn_seld(sign[j] > 0, v[j], a * v[j])


def leaky_relu_forward(floating[:, ::1] z, double slope):
    """``z <- z if z > 0 else slope * z`` in place (``slope >= 0``)."""
    cdef Py_ssize_t n = z.shape[0] * z.shape[1]
    if n == 0:
        return
    with nogil:
        _leaky_scale(&z[0, 0], &z[0, 0], n, <floating>slope)


def leaky_relu_backward(const floating[:, ::1] y, floating[:, ::1] dy, double slope):
    """``dy <- dy if y > 0 else slope * dy`` in place, through the forward output ``y``
    (its sign is its input's, for ``slope >= 0``)."""
    cdef Py_ssize_t n = y.shape[0] * y.shape[1]
    if dy.shape[0] != y.shape[0] or dy.shape[1] != y.shape[1]:
        raise ValueError(f"leaky_relu backward: y is ({y.shape[0]}, {y.shape[1]}), dy is "
                         f"({dy.shape[0]}, {dy.shape[1]})")
    if n == 0:
        return
    with nogil:
        _leaky_scale(&y[0, 0], &dy[0, 0], n, <floating>slope)

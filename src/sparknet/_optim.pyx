# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Optimizer updates over one flat parameter buffer, one fused pass, GIL released.

Formulas follow ``torch.optim.RMSprop`` and ``torch.optim.SGD`` exactly
(weight decay added to the gradient, ``eps`` added after the square root).
"""
from cython cimport floating
from libc.math cimport sqrt, sqrtf


cdef inline floating _sqrt(floating x) noexcept nogil:
    if floating is float:
        return sqrtf(x)
    else:
        return sqrt(x)


def rmsprop(floating[::1] p, const floating[::1] g, floating[::1] square_avg,
            floating[::1] grad_avg, floating[::1] buf,
            double lr, double alpha, double eps, double weight_decay, double momentum):
    """One RMSprop step, in place.

    g' = g + wd p;  v = alpha v + (1 - alpha) g'^2;
    centered (grad_avg given): a = alpha a + (1 - alpha) g'; den = sqrt(v - a^2) + eps
    else den = sqrt(v) + eps;
    momentum > 0 (buf given): buf = momentum buf + g'/den; p -= lr buf;  else p -= lr g'/den.
    """
    cdef Py_ssize_t i, n = p.shape[0]
    cdef bint centered = grad_avg is not None
    cdef bint mom = momentum > 0
    cdef floating a = <floating>alpha, oma = <floating>(1.0 - alpha)
    cdef floating e = <floating>eps, wd = <floating>weight_decay, mu = <floating>momentum
    cdef floating step = <floating>lr
    cdef floating gi, v, den, ga
    if g.shape[0] != n or square_avg.shape[0] != n or (centered and grad_avg.shape[0] != n):
        raise ValueError("rmsprop: buffers differ in length")
    if mom and (buf is None or buf.shape[0] != n):
        raise ValueError("rmsprop: momentum needs a momentum buffer of the parameters' length")
    with nogil:
        for i in range(n):
            gi = g[i]
            if wd != 0:
                gi = gi + wd * p[i]
            v = a * square_avg[i] + oma * gi * gi
            square_avg[i] = v
            if centered:
                ga = a * grad_avg[i] + oma * gi
                grad_avg[i] = ga
                den = _sqrt(v - ga * ga) + e
            else:
                den = _sqrt(v) + e
            if mom:
                buf[i] = mu * buf[i] + gi / den
                p[i] = p[i] - step * buf[i]
            else:
                p[i] = p[i] - step * gi / den


def sgd(floating[::1] p, const floating[::1] g, floating[::1] buf,
        double lr, double momentum, double dampening, double weight_decay,
        bint nesterov, bint first_step):
    """One SGD step, in place (``torch.optim.SGD``).

    g' = g + wd p; with momentum: buf = g' on the first step, else
    buf = momentum buf + (1 - dampening) g'; d = g' + momentum buf (Nesterov) or buf;
    p -= lr d.
    """
    cdef Py_ssize_t i, n = p.shape[0]
    cdef bint mom = momentum != 0
    cdef floating mu = <floating>momentum, damp = <floating>(1.0 - dampening)
    cdef floating wd = <floating>weight_decay, step = <floating>lr
    cdef floating gi, b
    if g.shape[0] != n:
        raise ValueError("sgd: buffers differ in length")
    if mom and (buf is None or buf.shape[0] != n):
        raise ValueError("sgd: momentum needs a momentum buffer of the parameters' length")
    with nogil:
        for i in range(n):
            gi = g[i]
            if wd != 0:
                gi = gi + wd * p[i]
            if mom:
                if first_step:
                    b = gi
                else:
                    b = mu * buf[i] + damp * gi
                buf[i] = b
                if nesterov:
                    gi = gi + mu * b
                else:
                    gi = b
            p[i] = p[i] - step * gi

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Optimizer updates over one flat parameter buffer, one fused pass, GIL released.

Formulas follow ``torch.optim.RMSprop``, ``SGD``, ``Adam`` and ``AdamW`` exactly
(weight decay added to the gradient, ``eps`` added after the square root), and gradient
clipping as ``torch.nn.utils.clip_grad_value_`` / ``clip_grad_norm_`` (clamp, sum of
squares, scale: the norm is the caller's, so that it can span several buffers).  The
loops are plain C (``csrc/optim_kernels.h``) so that they vectorise.
"""
from cython cimport floating


cdef extern from "optim_kernels.h" nogil:
    void sparknet_rmsprop_f(float* p, const float* g, float* v, float* ga, float* buf,
                            Py_ssize_t n, float lr, float alpha, float eps, float wd, float mu)
    void sparknet_rmsprop_d(double* p, const double* g, double* v, double* ga, double* buf,
                            Py_ssize_t n, double lr, double alpha, double eps, double wd, double mu)
    void sparknet_sgd_f(float* p, const float* g, float* buf, Py_ssize_t n, float lr, float mu,
                        float damp, float wd, int nesterov, int first)
    void sparknet_sgd_d(double* p, const double* g, double* buf, Py_ssize_t n, double lr, double mu,
                        double damp, double wd, int nesterov, int first)
    void sparknet_adam_f(float* p, const float* g, float* m, float* v, float* vmax, Py_ssize_t n,
                         float lr, float beta1, float beta2, float eps, float wd, int decoupled,
                         float bc1, float bc2_sqrt)
    void sparknet_adam_d(double* p, const double* g, double* m, double* v, double* vmax, Py_ssize_t n,
                         double lr, double beta1, double beta2, double eps, double wd, int decoupled,
                         double bc1, double bc2_sqrt)
    void sparknet_clamp_f(float* g, Py_ssize_t n, float v)
    void sparknet_clamp_d(double* g, Py_ssize_t n, double v)
    double sparknet_sumsq_f(const float* g, Py_ssize_t n)
    double sparknet_sumsq_d(const double* g, Py_ssize_t n)
    void sparknet_scale_f(float* g, Py_ssize_t n, float s)
    void sparknet_scale_d(double* g, Py_ssize_t n, double s)


def rmsprop(floating[::1] p, const floating[::1] g, floating[::1] square_avg,
            floating[::1] grad_avg, floating[::1] buf,
            double lr, double alpha, double eps, double weight_decay, double momentum):
    """One RMSprop step, in place.

    g' = g + wd p;  v = alpha v + (1 - alpha) g'^2;
    centered (grad_avg given): a = alpha a + (1 - alpha) g'; den = sqrt(v - a^2) + eps
    else den = sqrt(v) + eps;
    momentum > 0 (buf given): buf = momentum buf + g'/den; p -= lr buf;  else p -= lr g'/den.
    """
    cdef Py_ssize_t n = p.shape[0]
    cdef bint centered = grad_avg is not None
    cdef bint mom = momentum > 0
    cdef floating* ga = NULL
    cdef floating* b = NULL
    if g.shape[0] != n or square_avg.shape[0] != n or (centered and grad_avg.shape[0] != n):
        raise ValueError("rmsprop: buffers differ in length")
    if mom and (buf is None or buf.shape[0] != n):
        raise ValueError("rmsprop: momentum needs a momentum buffer of the parameters' length")
    if n == 0:
        return
    if centered:
        ga = &grad_avg[0]
    if mom:
        b = &buf[0]
    with nogil:
        if floating is float:
            sparknet_rmsprop_f(&p[0], &g[0], &square_avg[0], ga, b, n, <float>lr, <float>alpha,
                               <float>eps, <float>weight_decay, <float>momentum)
        else:
            sparknet_rmsprop_d(&p[0], &g[0], &square_avg[0], ga, b, n, lr, alpha, eps,
                               weight_decay, momentum)


def sgd(floating[::1] p, const floating[::1] g, floating[::1] buf,
        double lr, double momentum, double dampening, double weight_decay,
        bint nesterov, bint first_step):
    """One SGD step, in place (``torch.optim.SGD``).

    g' = g + wd p; with momentum: buf = g' on the first step, else
    buf = momentum buf + (1 - dampening) g'; d = g' + momentum buf (Nesterov) or buf;
    p -= lr d.
    """
    cdef Py_ssize_t n = p.shape[0]
    cdef bint mom = momentum != 0
    cdef floating* b = NULL
    if g.shape[0] != n:
        raise ValueError("sgd: buffers differ in length")
    if mom and (buf is None or buf.shape[0] != n):
        raise ValueError("sgd: momentum needs a momentum buffer of the parameters' length")
    if n == 0:
        return
    if mom:
        b = &buf[0]
    with nogil:
        if floating is float:
            sparknet_sgd_f(&p[0], &g[0], b, n, <float>lr, <float>momentum, <float>dampening,
                           <float>weight_decay, nesterov, first_step)
        else:
            sparknet_sgd_d(&p[0], &g[0], b, n, lr, momentum, dampening, weight_decay,
                           nesterov, first_step)


def adam(floating[::1] p, const floating[::1] g, floating[::1] exp_avg, floating[::1] exp_avg_sq,
         floating[::1] max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
         double weight_decay, bint decoupled, long step):
    """One Adam (``decoupled``: AdamW) step number ``step`` (1-based), in place.

    Adam: g' = g + wd p;  AdamW: p *= 1 - lr wd, g' = g;
    m += (1 - beta1) (g' - m);  v = beta2 v + (1 - beta2) g'^2;
    amsgrad (max_exp_avg_sq given): vmax = max(vmax, v), used in place of v;
    p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
    """
    cdef Py_ssize_t n = p.shape[0]
    cdef floating* vmax = NULL
    cdef double bc1 = 1.0 - beta1 ** step
    cdef double bc2_sqrt = (1.0 - beta2 ** step) ** 0.5
    if g.shape[0] != n or exp_avg.shape[0] != n or exp_avg_sq.shape[0] != n or (
            max_exp_avg_sq is not None and max_exp_avg_sq.shape[0] != n):
        raise ValueError("adam: buffers differ in length")
    if step < 1:
        raise ValueError(f"adam: step must be 1 or more, got {step}")
    if n == 0:
        return
    if max_exp_avg_sq is not None:
        vmax = &max_exp_avg_sq[0]
    with nogil:
        if floating is float:
            sparknet_adam_f(&p[0], &g[0], &exp_avg[0], &exp_avg_sq[0], vmax, n, <float>lr, <float>beta1,
                            <float>beta2, <float>eps, <float>weight_decay, decoupled, <float>bc1,
                            <float>bc2_sqrt)
        else:
            sparknet_adam_d(&p[0], &g[0], &exp_avg[0], &exp_avg_sq[0], vmax, n, lr, beta1, beta2, eps,
                            weight_decay, decoupled, bc1, bc2_sqrt)


# ------------------------------------------------------------------------------ clipping
def clamp(floating[::1] g, double value):
    """In place: g = min(max(g, -value), value) (``torch.nn.utils.clip_grad_value_``)."""
    cdef Py_ssize_t n = g.shape[0]
    if n == 0:
        return
    with nogil:
        if floating is float:
            sparknet_clamp_f(&g[0], n, <float>value)
        else:
            sparknet_clamp_d(&g[0], n, value)


def sumsq(const floating[::1] g):
    """sum(g^2), accumulated in float64 for float32 too (the squared 2-norm)."""
    cdef Py_ssize_t n = g.shape[0]
    cdef double out = 0.0
    if n == 0:
        return 0.0
    with nogil:
        if floating is float:
            out = sparknet_sumsq_f(&g[0], n)
        else:
            out = sparknet_sumsq_d(&g[0], n)
    return out


def scale(floating[::1] g, double factor):
    """In place: g *= factor (the factor rounded to g's dtype first, as torch multiplies by a
    tensor of the gradient's dtype)."""
    cdef Py_ssize_t n = g.shape[0]
    if n == 0:
        return
    with nogil:
        if floating is float:
            sparknet_scale_f(&g[0], n, <float>factor)
        else:
            sparknet_scale_d(&g[0], n, factor)

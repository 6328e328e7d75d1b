# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Optimizer updates over one flat parameter buffer, one fused pass, GIL released.

Formulas follow ``torch.optim.RMSprop``, ``SGD``, ``Adam`` and ``AdamW`` exactly
(weight decay added to the gradient, ``eps`` added after the square root), and gradient
clipping as ``torch.nn.utils.clip_grad_value_`` / ``clip_grad_norm_`` (clamp, sum of
squares, scale: the norm is the caller's, so that it can span several buffers).  The
loops are plain C (``csrc/optim_kernels.h``) so that they vectorise.
"""
from cython cimport floating
from libc.stdint cimport int32_t
from libc.stdlib cimport free, malloc

from sparknet._bf16 cimport PackedB, kernel_on, pack_part


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
    int sparknet_optim_simd()
    void sparknet_rmsprop_plain_f_avx512(float* p, const float* g, float* v, Py_ssize_t n,
                                         float lr, float alpha, float eps)
    void sparknet_rmsprop_plain_f_avx(float* p, const float* g, float* v, Py_ssize_t n,
                                      float lr, float alpha, float eps)


# the plain float32 RMSprop step on AVX-512 (2) or AVX (1) where the CPU has it (bit for bit
# the scalar loop)
cdef int _have_simd = sparknet_optim_simd()
cdef int _use_simd = _have_simd


def set_simd(bint on) -> bool:
    """Use the AVX-512 or AVX loop of the plain float32 RMSprop step (``on``, the default where
    the CPU has either) or the scalar build's loop; the results are the same bit for bit.
    Returns whether a vector loop is now in use (False on a CPU without AVX)."""
    global _use_simd
    _use_simd = _have_simd if on else 0
    return _use_simd > 0


cdef inline void _rmsprop_simd(float* p, const float* g, float* v, Py_ssize_t n, float lr,
                               float alpha, float eps) noexcept nogil:
    if _use_simd == 2:
        sparknet_rmsprop_plain_f_avx512(p, g, v, n, lr, alpha, eps)
    elif _use_simd == 1:
        sparknet_rmsprop_plain_f_avx(p, g, v, n, lr, alpha, eps)
    else:
        sparknet_rmsprop_f(p, g, v, NULL, NULL, n, lr, alpha, eps, 0, 0)


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
        if (floating is float and _use_simd and not centered and not mom
                and <float>weight_decay == 0):
            _rmsprop_simd(&p[0], &g[0], &square_avg[0], n, <float>lr, <float>alpha, <float>eps)
        elif floating is float:
            sparknet_rmsprop_f(&p[0], &g[0], &square_avg[0], ga, b, n, <float>lr, <float>alpha,
                               <float>eps, <float>weight_decay, <float>momentum)
        else:
            sparknet_rmsprop_d(&p[0], &g[0], &square_avg[0], ga, b, n, lr, alpha, eps,
                               weight_decay, momentum)


cdef inline void _rmsprop_plain(float* p, const float* g, float* v, Py_ssize_t n, float lr,
                                float alpha, float eps) noexcept nogil:
    """The plain float32 RMSprop step over n entries (AVX-512, AVX or scalar: the same bits)."""
    if n <= 0:
        return
    _rmsprop_simd(p, g, v, n, lr, alpha, eps)


# rows of a weight updated, then packed, per block: 32 (one panel of a transposed packing)
# rows of a 784-wide matrix are 100 KiB, in the L2 cache when the packing reads them
cdef enum:
    PACK_ROWS = 32

cdef struct _Target:
    Py_ssize_t off, rows, cols   # the weight: p[off:off + rows * cols] as (rows, cols)
    int32_t* packed              # its packing (B = W, K = rows), or NULL
    int32_t* packed_t            # its transpose's (B = W^T, K = cols), or NULL


def rmsprop_pack(float[::1] p, const float[::1] g, float[::1] square_avg, double lr,
                 double alpha, double eps, list targets):
    """The plain float32 :func:`rmsprop` step (no weight decay, centring or momentum) and, in
    the same pass, the bfloat16 packings of the weights it updates refilled from the new values.

    ``targets``: ``(offset, rows, cols, packs)`` per weight, ``p[offset:offset + rows * cols]``
    as a ``(rows, cols)`` matrix ``W`` and ``packs`` the :class:`sparknet._bf16.PackedB` of
    ``W`` (``trans=False``) and/or of ``W.T`` (``trans=True``) to refill; weights must not
    overlap.  Each weight is updated 32 rows at a time and those rows packed at once, while in
    cache.  The result is bit for bit :func:`rmsprop` then ``PackedB.refill`` of each weight.
    """
    cdef Py_ssize_t n = p.shape[0], nt = len(targets), i, j, pos, r0, r1
    cdef PackedB pb
    if g.shape[0] != n or square_avg.shape[0] != n:
        raise ValueError("rmsprop_pack: buffers differ in length")
    if nt and not kernel_on():
        raise RuntimeError("rmsprop_pack: the bfloat16 kernel is off (see "
                           "sparknet._bf16.backend())")
    order = sorted(targets, key=lambda t: t[0])
    cdef _Target* ts = <_Target*>malloc(max(nt, 1) * sizeof(_Target))
    if ts == NULL:
        raise MemoryError()
    try:
        pos = 0
        for i, (off, rows, cols, packs) in enumerate(order):
            if off < pos or rows < 0 or cols < 0 or off + rows * cols > n:
                raise ValueError(f"rmsprop_pack: weight {i} (offset {off}, shape ({rows}, {cols})) "
                                 f"overlaps another or leaves the {n} parameters")
            ts[i].off, ts[i].rows, ts[i].cols = off, rows, cols
            ts[i].packed = ts[i].packed_t = NULL
            for pb in packs:
                if (pb.K, pb.N) != ((cols, rows) if pb.trans else (rows, cols)):
                    raise ValueError(f"rmsprop_pack: a packing of shape K={pb.K}, N={pb.N} "
                                     f"(trans={pb.trans}) does not fit the ({rows}, {cols}) "
                                     f"weight at offset {off}")
                if pb.trans:
                    ts[i].packed_t = pb.data
                else:
                    ts[i].packed = pb.data
            pos = off + rows * cols
        with nogil:
            pos = 0
            for i in range(nt):
                _rmsprop_plain(&p[pos], &g[pos], &square_avg[pos], ts[i].off - pos, <float>lr,
                               <float>alpha, <float>eps)
                r0 = 0
                while r0 < ts[i].rows:
                    r1 = min(r0 + PACK_ROWS, ts[i].rows)
                    j = ts[i].off + r0 * ts[i].cols
                    _rmsprop_plain(&p[j], &g[j], &square_avg[j], (r1 - r0) * ts[i].cols,
                                   <float>lr, <float>alpha, <float>eps)
                    if ts[i].packed_t != NULL:
                        pack_part(&p[ts[i].off], ts[i].cols, True, ts[i].cols, ts[i].rows, r0,
                                  r1, ts[i].packed_t)
                    if ts[i].packed != NULL:
                        pack_part(&p[ts[i].off], ts[i].cols, False, ts[i].rows, ts[i].cols, r0,
                                  r1, ts[i].packed)
                    r0 = r1
                pos = ts[i].off + ts[i].rows * ts[i].cols
            if n > pos:
                _rmsprop_plain(&p[pos], &g[pos], &square_avg[pos], n - pos, <float>lr,
                               <float>alpha, <float>eps)
    finally:
        free(ts)


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

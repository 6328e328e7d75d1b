# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Normalisation kernels: layer normalisation (per row) and batch normalisation (per column).

Both work on a 2-D view ``X (M, F)`` of a channels-last batch: ``M`` rows (every leading
axis flattened) of ``F`` features.  With ``xhat = (x - mean) * rstd`` and
``rstd = 1 / sqrt(var + eps)`` (``var`` biased, as ``torch.nn.LayerNorm`` and
``torch.nn.BatchNorm*d`` normalise with), both compute ``y = gamma * xhat + beta``:

- layer norm: ``mean``, ``var`` over each row's ``F`` features; ``gamma``, ``beta`` per feature;
- batch norm: ``mean``, ``var`` over the ``M`` rows of each column (channel).

The functions are the whole maths, with every buffer passed in, so that layers built of
other layers (a Transformer encoder) call them without a layer object.  Sums run in double
precision for float32 data too (as PyTorch's CPU kernels do).  ``gamma`` and ``beta`` may be
None (no scale: ``gamma = 1``; no shift: ``beta = 0``).  Gradients are overwritten, not
accumulated.  All checks are done before the GIL is released.

Batch norm reads X row by row: per-column sums are accumulated one row at a time, a loop
over ``F`` contiguous values that the compiler vectorises; the forward pass and the
backward pass each read the data twice (statistics, then output).
"""
from cython cimport floating
from libc.math cimport sqrt
from libc.stdlib cimport calloc, free


cdef inline double _row_mean(const floating* x, Py_ssize_t F) noexcept nogil:
    """``x[:F].mean()`` with four partial sums (a dependency chain of F / 4 additions)."""
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0
    cdef Py_ssize_t j = 0
    while j + 4 <= F:
        s0 += x[j]
        s1 += x[j + 1]
        s2 += x[j + 2]
        s3 += x[j + 3]
        j += 4
    while j < F:
        s0 += x[j]
        j += 1
    return (s0 + s1 + s2 + s3) / F


cdef inline double _row_var(const floating* x, Py_ssize_t F, double mu) noexcept nogil:
    """``((x[:F] - mu) ** 2).mean()``, four partial sums."""
    cdef double s0 = 0, s1 = 0, s2 = 0, s3 = 0, d0, d1, d2, d3
    cdef Py_ssize_t j = 0
    while j + 4 <= F:
        d0 = x[j] - mu
        d1 = x[j + 1] - mu
        d2 = x[j + 2] - mu
        d3 = x[j + 3] - mu
        s0 += d0 * d0
        s1 += d1 * d1
        s2 += d2 * d2
        s3 += d3 * d3
        j += 4
    while j < F:
        d0 = x[j] - mu
        s0 += d0 * d0
        j += 1
    return (s0 + s1 + s2 + s3) / F


cdef inline void _affine_row(const floating* x, floating* y, Py_ssize_t F, const floating* mean,
                             const floating* scale, const floating* shift) noexcept nogil:
    """``y = (x - mean) * scale + shift`` over one row of per-column coefficients."""
    cdef Py_ssize_t j
    for j in range(F):
        y[j] = (x[j] - mean[j]) * scale[j] + shift[j]


# ------------------------------------------------------------------ layer normalisation
def layer_norm_forward(const floating[:, ::1] x, const floating[::1] gamma,
                       const floating[::1] beta, double eps, floating[:, ::1] y,
                       floating[::1] mean, floating[::1] rstd, bint rms=False):
    """Normalise each row of ``x`` over its features (``torch.nn.LayerNorm(F)`` on the last axis).

    Shapes: ``x (M, F)``, ``gamma (F,)`` or None, ``beta (F,)`` or None, ``y (M, F)``
    (may be ``x`` itself), ``mean (M,)``, ``rstd (M,)``.

    ``mean[i] = x[i].mean()``, ``rstd[i] = 1 / sqrt(x[i].var() + eps)`` (biased variance),
    ``y[i] = (x[i] - mean[i]) * rstd[i] * gamma + beta``.  ``mean`` and ``rstd`` are what
    :func:`layer_norm_backward` needs besides ``x``.  With ``rms``, the root-mean-square
    normalisation (``torch.nn.RMSNorm``): ``mean[i] = 0``, ``rstd[i] = 1 / sqrt((x[i] ** 2)
    .mean() + eps)``.
    """
    cdef Py_ssize_t M = x.shape[0], F = x.shape[1], i, j
    cdef bint has_g = gamma is not None, has_b = beta is not None
    cdef double mu, r
    cdef const floating* xr
    cdef floating* yr
    if (y.shape[0] != M or y.shape[1] != F or mean.shape[0] != M or rstd.shape[0] != M
            or (has_g and gamma.shape[0] != F) or (has_b and beta.shape[0] != F)):
        raise ValueError("layer_norm_forward: shape mismatch")
    if not eps > 0:
        raise ValueError(f"layer_norm_forward: eps must be positive, got {eps!r}")
    if M == 0 or F == 0:
        return
    with nogil:
        for i in range(M):
            xr = &x[i, 0]
            yr = &y[i, 0]
            mu = 0.0 if rms else _row_mean(xr, F)
            r = 1.0 / sqrt(_row_var(xr, F, mu) + eps)
            mean[i] = <floating>mu
            rstd[i] = <floating>r
            # y = xhat * gamma + beta, xhat = (x - mu) * r
            if has_g and has_b:
                for j in range(F):
                    yr[j] = <floating>((xr[j] - mu) * r) * gamma[j] + beta[j]
            elif has_g:
                for j in range(F):
                    yr[j] = <floating>((xr[j] - mu) * r) * gamma[j]
            elif has_b:
                for j in range(F):
                    yr[j] = <floating>((xr[j] - mu) * r) + beta[j]
            else:
                for j in range(F):
                    yr[j] = <floating>((xr[j] - mu) * r)


def layer_norm_backward(const floating[:, ::1] dy, const floating[:, ::1] x,
                        const floating[::1] mean, const floating[::1] rstd,
                        const floating[::1] gamma, floating[:, ::1] dx,
                        floating[::1] dgamma, floating[::1] dbeta, bint rms=False):
    """Backward pass of :func:`layer_norm_forward`.

    Shapes: ``dy (M, F)``, ``x (M, F)``, ``mean (M,)``, ``rstd (M,)`` (from the forward
    pass), ``gamma (F,)`` or None, ``dx (M, F)`` or None (may be ``dy`` itself),
    ``dgamma (F,)`` or None, ``dbeta (F,)`` or None.

    With ``g = dy * gamma`` and ``xhat = (x - mean) * rstd``, per row:
    ``dx = rstd * (g - g.mean() - xhat * (g * xhat).mean())`` (``rms``: without the
    ``g.mean()``, the mean was not subtracted); over rows: ``dgamma = (dy * xhat).sum(0)``,
    ``dbeta = dy.sum(0)``.
    """
    cdef Py_ssize_t M = x.shape[0], F = x.shape[1], i, j
    cdef bint has_g = gamma is not None, has_dx = dx is not None
    cdef bint has_dg = dgamma is not None, has_db = dbeta is not None
    cdef double mu, r, xh, g, s_g, s_gx, inv_f
    cdef const floating* xr
    cdef const floating* dyr
    cdef floating* dxr
    cdef double* acc_g = NULL
    cdef double* acc_b = NULL
    if (dy.shape[0] != M or dy.shape[1] != F or mean.shape[0] != M or rstd.shape[0] != M
            or (has_g and gamma.shape[0] != F)
            or (has_dx and (dx.shape[0] != M or dx.shape[1] != F))
            or (has_dg and dgamma.shape[0] != F) or (has_db and dbeta.shape[0] != F)):
        raise ValueError("layer_norm_backward: shape mismatch")
    acc_g = <double*>calloc(F + 1, sizeof(double))
    acc_b = <double*>calloc(F + 1, sizeof(double))
    if acc_g == NULL or acc_b == NULL:
        free(acc_g)
        free(acc_b)
        raise MemoryError("layer_norm_backward: no memory for the gradient sums")
    try:
        with nogil:
            inv_f = 1.0 / F if F > 0 else 0.0
            for i in range(M):
                xr = &x[i, 0]
                dyr = &dy[i, 0]
                mu = mean[i]
                r = rstd[i]
                # pass 1 over the row: s_g = sum(g), s_gx = sum(g * xhat); dgamma, dbeta sums
                s_g = 0
                s_gx = 0
                for j in range(F):
                    xh = (xr[j] - mu) * r
                    g = dyr[j] * gamma[j] if has_g else dyr[j]
                    s_g += g
                    s_gx += g * xh
                    acc_g[j] += dyr[j] * xh
                    acc_b[j] += dyr[j]
                if not has_dx:
                    continue
                # pass 2: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
                dxr = &dx[i, 0]
                s_g = 0.0 if rms else s_g * inv_f
                s_gx *= inv_f
                for j in range(F):
                    xh = (xr[j] - mu) * r
                    g = dyr[j] * gamma[j] if has_g else dyr[j]
                    dxr[j] = <floating>(r * (g - s_g - xh * s_gx))
            for j in range(F):
                if has_dg:
                    dgamma[j] = <floating>acc_g[j]
                if has_db:
                    dbeta[j] = <floating>acc_b[j]
    finally:
        free(acc_g)
        free(acc_b)


# ------------------------------------------------------------------ batch normalisation
def batch_norm_forward(const floating[:, ::1] x, const floating[::1] gamma,
                       const floating[::1] beta, floating[::1] running_mean,
                       floating[::1] running_var, double momentum, double eps, bint training,
                       floating[:, ::1] y, floating[::1] mean, floating[::1] rstd,
                       const unsigned char[::1] row_mask=None):
    """Normalise each column of ``x`` over its rows (``torch.nn.BatchNorm1d/2d``, channels last).

    Shapes: ``x (M, F)``, ``gamma (F,)`` or None, ``beta (F,)`` or None,
    ``running_mean (F,)`` and ``running_var (F,)`` (or both None in training),
    ``y (M, F)`` (may be ``x`` itself), ``mean (F,)``, ``rstd (F,)``,
    ``row_mask (M,)`` or None.

    Training: ``mean`` and the biased ``var`` of each column over the rows whose
    ``row_mask`` is non-zero (every row without a mask); the running statistics are updated
    in place as in PyTorch: ``running = (1 - momentum) * running + momentum * batch``, with
    the unbiased variance ``var * n / (n - 1)`` (n rows counted, at least 2).  Inference
    (``training`` false): ``mean = running_mean``, ``var = running_var``.  In both,
    ``rstd = 1 / sqrt(var + eps)`` and every row (masked ones too) gets
    ``y = (x - mean) * rstd * gamma + beta``; ``mean``, ``rstd`` are written for
    :func:`batch_norm_backward`.
    """
    cdef Py_ssize_t M = x.shape[0], F = x.shape[1], i, j, n = 0, first = -1
    cdef bint has_g = gamma is not None, has_b = beta is not None
    cdef bint has_run = running_mean is not None, has_mask = row_mask is not None
    cdef double d, var, mu
    cdef const floating* xr
    cdef const floating* xi
    cdef double* s1 = NULL
    cdef double* s2 = NULL
    cdef floating* scale = NULL
    cdef floating* shift = NULL
    if (y.shape[0] != M or y.shape[1] != F or mean.shape[0] != F or rstd.shape[0] != F
            or (has_g and gamma.shape[0] != F) or (has_b and beta.shape[0] != F)
            or (has_run and (running_var is None or running_mean.shape[0] != F
                             or running_var.shape[0] != F))
            or (has_mask and row_mask.shape[0] != M)):
        raise ValueError("batch_norm_forward: shape mismatch")
    if not has_run and not training:
        raise ValueError("batch_norm_forward: inference needs running_mean and running_var")
    if not eps > 0 or not 0 <= momentum <= 1:
        raise ValueError(f"batch_norm_forward: needs eps > 0 and momentum in [0, 1], "
                         f"got eps={eps!r}, momentum={momentum!r}")
    if training:
        if has_mask:
            for i in range(M):
                if row_mask[i]:
                    n += 1
                    if first < 0:
                        first = i
        else:
            n, first = M, 0
        if n < 2:
            raise ValueError(f"Expected more than 1 value per channel when training, got {n} "
                             f"value(s) per channel (input shape ({M}, {F}) as rows x channels)")
    s1 = <double*>calloc(F + 1, sizeof(double))
    s2 = <double*>calloc(F + 1, sizeof(double))
    scale = <floating*>calloc(F + 1, sizeof(floating))
    shift = <floating*>calloc(F + 1, sizeof(floating))
    try:
        if s1 == NULL or s2 == NULL or scale == NULL or shift == NULL:
            raise MemoryError("batch_norm_forward: no memory for the column sums")
        with nogil:
            if training and F > 0:
                # pass 1: shifted sums, K = the first counted row (stable one-pass variance):
                # s1 = sum(x - K), s2 = sum((x - K)^2); mean = K + s1 / n,
                # var = s2 / n - (s1 / n)^2
                xr = &x[first, 0]
                for i in range(M):
                    if has_mask and not row_mask[i]:
                        continue
                    xi = &x[i, 0]
                    for j in range(F):
                        d = <double>xi[j] - <double>xr[j]
                        s1[j] += d
                        s2[j] += d * d
                for j in range(F):
                    d = s1[j] / n
                    mu = xr[j] + d
                    var = s2[j] / n - d * d
                    if var < 0:
                        var = 0
                    mean[j] = <floating>mu
                    rstd[j] = <floating>(1.0 / sqrt(var + eps))
                    if has_run:
                        running_mean[j] = <floating>((1 - momentum) * running_mean[j]
                                                     + momentum * mu)
                        running_var[j] = <floating>((1 - momentum) * running_var[j]
                                                    + momentum * var * n / (n - 1))
            elif F > 0:
                for j in range(F):
                    mean[j] = running_mean[j]
                    rstd[j] = <floating>(1.0 / sqrt(<double>running_var[j] + eps))
            # pass 2: y = (x - mean) * scale + shift, scale = gamma * rstd, shift = beta
            for j in range(F):
                scale[j] = gamma[j] * rstd[j] if has_g else rstd[j]
                shift[j] = beta[j] if has_b else 0
            if F > 0:
                for i in range(M):
                    _affine_row(&x[i, 0], &y[i, 0], F, &mean[0], scale, shift)
    finally:
        free(s1)
        free(s2)
        free(scale)
        free(shift)


def batch_norm_backward(const floating[:, ::1] dy, const floating[:, ::1] x,
                        const floating[::1] mean, const floating[::1] rstd,
                        const floating[::1] gamma, bint training, floating[:, ::1] dx,
                        floating[::1] dgamma, floating[::1] dbeta,
                        const unsigned char[::1] row_mask=None):
    """Backward pass of :func:`batch_norm_forward` (same ``training`` and ``row_mask``).

    Shapes: ``dy (M, F)``, ``x (M, F)``, ``mean (F,)``, ``rstd (F,)`` (as the forward pass
    wrote them), ``gamma (F,)`` or None, ``dx (M, F)`` or None (may be ``dy`` itself),
    ``dgamma (F,)`` or None, ``dbeta (F,)`` or None, ``row_mask (M,)`` or None.

    With ``S1 = dy.sum(0)``, ``S2 = (dy * (x - mean)).sum(0)`` over all rows,
    ``a = gamma * rstd`` and ``n`` counted rows: ``dbeta = S1``, ``dgamma = rstd * S2``;
    in training ``dx = a * (dy - S1 / n - rstd^2 * S2 * (x - mean) / n)`` on counted rows
    (masked rows do not enter the statistics: ``dx = a * dy`` there); in inference, the
    statistics are constants and ``dx = a * dy``.
    """
    cdef Py_ssize_t M = x.shape[0], F = x.shape[1], i, j, n = 0
    cdef bint has_g = gamma is not None, has_dx = dx is not None
    cdef bint has_dg = dgamma is not None, has_db = dbeta is not None
    cdef bint has_mask = row_mask is not None
    cdef double a, r
    cdef const floating* xr
    cdef const floating* dyr
    cdef floating* dxr
    cdef double* s1 = NULL
    cdef double* s2 = NULL
    cdef floating* ca = NULL
    cdef floating* cb = NULL
    cdef floating* cc = NULL
    if (dy.shape[0] != M or dy.shape[1] != F or mean.shape[0] != F or rstd.shape[0] != F
            or (has_g and gamma.shape[0] != F)
            or (has_dx and (dx.shape[0] != M or dx.shape[1] != F))
            or (has_dg and dgamma.shape[0] != F) or (has_db and dbeta.shape[0] != F)
            or (has_mask and row_mask.shape[0] != M)):
        raise ValueError("batch_norm_backward: shape mismatch")
    if has_mask:
        for i in range(M):
            if row_mask[i]:
                n += 1
    else:
        n = M
    if training and n == 0 and has_dx:
        raise ValueError("batch_norm_backward: no counted rows (the mask is all zero)")
    s1 = <double*>calloc(F + 1, sizeof(double))
    s2 = <double*>calloc(F + 1, sizeof(double))
    ca = <floating*>calloc(F + 1, sizeof(floating))
    cb = <floating*>calloc(F + 1, sizeof(floating))
    cc = <floating*>calloc(F + 1, sizeof(floating))
    try:
        if s1 == NULL or s2 == NULL or ca == NULL or cb == NULL or cc == NULL:
            raise MemoryError("batch_norm_backward: no memory for the column sums")
        with nogil:
            # pass 1: S1 = sum(dy), S2 = sum(dy * (x - mean)), column by column, row by row
            if (training and has_dx) or has_dg or has_db:
                for i in range(M):
                    xr = &x[i, 0]
                    dyr = &dy[i, 0]
                    for j in range(F):
                        s1[j] += dyr[j]
                        s2[j] += dyr[j] * (<double>xr[j] - mean[j])
            for j in range(F):
                if has_dg:
                    dgamma[j] = <floating>(rstd[j] * s2[j])
                if has_db:
                    dbeta[j] = <floating>s1[j]
            # pass 2: dx = ca * dy + cb * (x - mean) + cc, with ca = a,
            # cb = -a * rstd^2 * S2 / n, cc = -a * S1 / n (cb = cc = 0 in inference)
            if has_dx and F > 0:
                for j in range(F):
                    r = rstd[j]
                    a = gamma[j] * r if has_g else r
                    ca[j] = <floating>a
                    if training:
                        cb[j] = <floating>(-a * r * r * s2[j] / n)
                        cc[j] = <floating>(-a * s1[j] / n)
                for i in range(M):
                    xr = &x[i, 0]
                    dyr = &dy[i, 0]
                    dxr = &dx[i, 0]
                    if has_mask and not row_mask[i]:
                        for j in range(F):
                            dxr[j] = ca[j] * dyr[j]
                    else:
                        for j in range(F):
                            dxr[j] = ca[j] * dyr[j] + cb[j] * (xr[j] - mean[j]) + cc[j]
    finally:
        free(s1)
        free(s2)
        free(ca)
        free(cb)
        free(cc)

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""2-D convolution kernels, channels-last, im2col + GEMM, GIL released.

Layout (all C-contiguous):

* input ``X``: ``(N, H, W, C)``;
* kernel ``Wt``: ``(KH, KW, C, F)``, read as the matrix ``(K, F)`` with
  ``K = KH * KW * C``;
* output ``Y``: ``(N, OH, OW, F)``, read as the matrix ``(P, F)`` with
  ``P = N * OH * OW``;
* columns ``cols``: ``(P, K)``; row ``p = (n, oh, ow)`` holds the receptive field of
  output pixel ``p`` in ``(kh, kw, c)`` order, zeros where it falls in the padding.

Forward: ``Y = act(cols @ Wt + b)``.  Backward: ``dZ = dY * act'``,
``dWt = cols.T @ dZ``, ``db = dZ.sum(0)``, ``dcols = dZ @ Wt.T`` and ``dX = col2im(dcols)``.

Input pixel of output ``(oh, ow)`` and tap ``(kh, kw)``:
``ih = oh * sh - ph + kh * dh``, ``iw = ow * sw - pw + kw * dw``.

The rows are processed in chunks sized to stay in the L2 cache: a chunk of columns is
written and immediately multiplied (forward) or produced by GEMM and immediately
scattered back (backward to the input), so the column matrix for the input gradient
never exists whole.  A 1x1 convolution with stride 1 and no padding skips im2col:
``X`` itself is the column matrix.
"""
from cython cimport floating
from libc.string cimport memcpy, memset
from sparknet._blas cimport gemm
from sparknet._activations cimport act_forward_row, act_backward_row, ACT_IDENTITY

# Bytes of column buffer processed per chunk (fits the 1-2 MiB L2 of current CPUs with
# room for the GEMM's own blocks).
DEF CHUNK_BYTES = 262144


cdef inline Py_ssize_t _chunk_rows(Py_ssize_t K, Py_ssize_t itemsize, Py_ssize_t P) noexcept nogil:
    cdef Py_ssize_t r = CHUNK_BYTES // (K * itemsize)
    if r < 64:
        r = 64
    if r > P:
        r = P
    return r


cdef void _im2col_rows(const floating* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                       Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                       Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                       Py_ssize_t dh, Py_ssize_t dw,
                       Py_ssize_t r0, Py_ssize_t r1, floating* dst) noexcept nogil:
    """Write column rows ``r0 <= p < r1`` to ``dst`` (row ``r0`` first)."""
    cdef Py_ssize_t n, oh, ow, kh, kw, ih, iw, iw0, r, j
    cdef Py_ssize_t KWC = KW * C
    cdef Py_ssize_t ohw = OH * OW
    cdef const floating* xn
    cdef const floating* src
    n = r0 // ohw
    oh = (r0 % ohw) // OW
    ow = r0 % OW
    for r in range(r0, r1):
        xn = X + n * H * W * C
        iw0 = ow * sw - pw
        for kh in range(KH):
            ih = oh * sh - ph + kh * dh
            if ih < 0 or ih >= H:
                memset(dst, 0, KWC * sizeof(floating))
            elif dw == 1 and iw0 >= 0 and iw0 + KW <= W:
                # the KW taps are one contiguous span of KW * C values
                src = xn + (ih * W + iw0) * C
                for j in range(KWC):
                    dst[j] = src[j]
            else:
                for kw in range(KW):
                    iw = iw0 + kw * dw
                    if iw < 0 or iw >= W:
                        for j in range(C):
                            dst[kw * C + j] = 0
                    else:
                        src = xn + (ih * W + iw) * C
                        for j in range(C):
                            dst[kw * C + j] = src[j]
            dst += KWC
        ow += 1
        if ow == OW:
            ow = 0
            oh += 1
            if oh == OH:
                oh = 0
                n += 1


cdef void _col2im_rows(floating* dX, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                       Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                       Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                       Py_ssize_t dh, Py_ssize_t dw,
                       Py_ssize_t r0, Py_ssize_t r1, const floating* src) noexcept nogil:
    """Add column rows ``r0 <= p < r1`` (``src``, row ``r0`` first) into ``dX``."""
    cdef Py_ssize_t n, oh, ow, kh, kw, ih, iw, iw0, r, j
    cdef Py_ssize_t KWC = KW * C
    cdef Py_ssize_t ohw = OH * OW
    cdef floating* xn
    cdef floating* d
    n = r0 // ohw
    oh = (r0 % ohw) // OW
    ow = r0 % OW
    for r in range(r0, r1):
        xn = dX + n * H * W * C
        iw0 = ow * sw - pw
        for kh in range(KH):
            ih = oh * sh - ph + kh * dh
            if ih < 0 or ih >= H:
                pass
            elif dw == 1 and iw0 >= 0 and iw0 + KW <= W:
                d = xn + (ih * W + iw0) * C
                for j in range(KWC):
                    d[j] += src[j]
            else:
                for kw in range(KW):
                    iw = iw0 + kw * dw
                    if iw >= 0 and iw < W:
                        d = xn + (ih * W + iw) * C
                        for j in range(C):
                            d[j] += src[kw * C + j]
            src += KWC
        ow += 1
        if ow == OW:
            ow = 0
            oh += 1
            if oh == OH:
                oh = 0
                n += 1


cdef inline bint _is_direct(Py_ssize_t KH, Py_ssize_t KW, Py_ssize_t sh, Py_ssize_t sw,
                            Py_ssize_t ph, Py_ssize_t pw) noexcept nogil:
    return KH == 1 and KW == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0


def _check_shapes(X, Wt, Y, int sh, int sw, int ph, int pw, int dh, int dw):
    cdef Py_ssize_t N = X.shape[0], H = X.shape[1], W_ = X.shape[2], C = X.shape[3]
    cdef Py_ssize_t KH = Wt.shape[0], KW = Wt.shape[1], F = Wt.shape[3]
    if sh < 1 or sw < 1 or dh < 1 or dw < 1 or ph < 0 or pw < 0:
        raise ValueError(f"conv: strides and dilations must be >= 1 and paddings >= 0, got "
                         f"strides=({sh}, {sw}), dilation=({dh}, {dw}), padding=({ph}, {pw})")
    if Wt.shape[2] != C:
        raise ValueError(f"conv: input has {C} channels, kernel expects {Wt.shape[2]}")
    cdef Py_ssize_t eh = dh * (KH - 1) + 1, ew = dw * (KW - 1) + 1
    if H + 2 * ph + 1 < eh or W_ + 2 * pw + 1 < ew:
        raise ValueError(f"conv: kernel extent ({eh}, {ew}) is larger than the padded input "
                         f"({H + 2 * ph}, {W_ + 2 * pw})")
    if Y.shape[0] != N or Y.shape[3] != F:
        raise ValueError(f"conv: output buffer has shape {tuple(Y.shape[:4])}, expected "
                         f"{N} samples and {F} channels")
    cdef Py_ssize_t OH = Y.shape[1], OW = Y.shape[2]
    # implied bottom/right padding: the top/left one, or one more ("same" with an odd total)
    cdef Py_ssize_t pb = (OH - 1) * sh + eh - H - ph, pr = (OW - 1) * sw + ew - W_ - pw
    if OH < 1 or OW < 1 or pb > ph + 1 or pr > pw + 1:
        raise ValueError(f"conv: output size ({OH}, {OW}) does not match input ({H}, {W_}), kernel "
                         f"extent ({eh}, {ew}), strides ({sh}, {sw}) and padding ({ph}, {pw})")
    return N, H, W_, C, KH, KW, F, OH, OW


def forward(const floating[:, :, :, ::1] X, const floating[:, :, :, ::1] Wt,
            const floating[::1] b, floating[:, :, :, ::1] Y, floating[:, ::1] cols,
            int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1,
            int act=ACT_IDENTITY):
    """``Y[...] = act(conv(X, Wt) + b)``.

    Args:
        X: input ``(N, H, W, C)``.
        Wt: kernel ``(KH, KW, C, F)``.
        b: bias ``(F,)`` or None.
        Y: output ``(N, OH, OW, F)``, overwritten.
        cols: ``(N * OH * OW, KH * KW * C)`` to keep the column matrix for the backward
            pass, or None to use a small scratch chunk (inference).  Ignored (may be
            None) for a 1x1, stride-1, unpadded convolution.
        sh, sw, ph, pw, dh, dw: strides, zero paddings (top/left; the bottom/right
            padding is whatever the output size implies) and dilations.
        act: activation id (``sparknet.activations.activation_id``), fused.
    """
    cdef Py_ssize_t N, H, W_, C, KH, KW, F, OH, OW
    N, H, W_, C, KH, KW, F, OH, OW = _check_shapes(X, Wt, Y, sh, sw, ph, pw, dh, dw)
    cdef Py_ssize_t P = N * OH * OW, K = KH * KW * C
    cdef bint direct = _is_direct(KH, KW, sh, sw, ph, pw)
    cdef bint keep = cols is not None
    cdef bint has_b = b is not None
    if has_b and b.shape[0] != F:
        raise ValueError(f"conv: bias has {b.shape[0]} entries for {F} filters")
    if keep and not direct and (cols.shape[0] != P or cols.shape[1] != K):
        raise ValueError(f"conv: column buffer is {(cols.shape[0], cols.shape[1])}, expected {(P, K)}")
    if P == 0 or F == 0:
        return
    cdef Py_ssize_t chunk = _chunk_rows(K, sizeof(floating), P)
    cdef floating[:, ::1] scratch
    cdef floating* cbase = NULL
    if not direct:
        if keep:
            cbase = &cols[0, 0]
        else:
            import numpy as np
            scratch = np.empty((chunk, K), dtype=np.float32 if floating is float else np.float64)
            cbase = &scratch[0, 0]
    cdef const floating* xp = &X[0, 0, 0, 0]
    cdef floating* yp = &Y[0, 0, 0, 0]
    cdef const floating* wp = &Wt[0, 0, 0, 0]
    cdef const floating* bp = &b[0] if has_b else NULL
    cdef Py_ssize_t r0, r1, i, j
    cdef floating* c
    cdef floating* y
    with nogil:
        r0 = 0
        while r0 < P:
            r1 = r0 + chunk if r0 + chunk < P else P
            if direct:
                c = <floating*>xp + r0 * K
            else:
                c = cbase + (r0 * K if keep else 0)
                _im2col_rows(xp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, c)
            gemm(False, False, <int>(r1 - r0), <int>F, <int>K, <floating>1, c, <int>K,
                 wp, <int>F, <floating>0, yp + r0 * F, <int>F)
            for i in range(r0, r1):
                y = yp + i * F
                if has_b:
                    for j in range(F):
                        y[j] = y[j] + bp[j]
                if act != ACT_IDENTITY:
                    act_forward_row(act, y, F)
            r0 = r1


def im2col(const floating[:, :, :, ::1] X, floating[:, ::1] cols, int KH, int KW,
           int OH, int OW, int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1):
    """Fill ``cols`` ``(N * OH * OW, KH * KW * C)`` from ``X`` ``(N, H, W, C)``."""
    cdef Py_ssize_t N = X.shape[0], H = X.shape[1], W_ = X.shape[2], C = X.shape[3]
    cdef Py_ssize_t P = N * OH * OW
    if cols.shape[0] != P or cols.shape[1] != KH * KW * C:
        raise ValueError(f"im2col: column buffer is {(cols.shape[0], cols.shape[1])}, "
                         f"expected {(P, KH * KW * C)}")
    if P == 0:
        return
    with nogil:
        _im2col_rows(&X[0, 0, 0, 0], H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw,
                     0, P, &cols[0, 0])


def col2im(const floating[:, ::1] cols, floating[:, :, :, ::1] dX, int KH, int KW,
           int OH, int OW, int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1):
    """``dX[...] = 0`` then add every column row back to the input pixels it came from."""
    cdef Py_ssize_t N = dX.shape[0], H = dX.shape[1], W_ = dX.shape[2], C = dX.shape[3]
    cdef Py_ssize_t P = N * OH * OW
    if cols.shape[0] != P or cols.shape[1] != KH * KW * C:
        raise ValueError(f"col2im: column buffer is {(cols.shape[0], cols.shape[1])}, "
                         f"expected {(P, KH * KW * C)}")
    with nogil:
        if N * H * W_ * C > 0:
            memset(&dX[0, 0, 0, 0], 0, N * H * W_ * C * sizeof(floating))
        if P > 0:
            _col2im_rows(&dX[0, 0, 0, 0], H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw,
                         0, P, &cols[0, 0])


def backward(const floating[:, :, :, ::1] X, const floating[:, :, :, ::1] Wt,
             const floating[:, :, :, ::1] Y, floating[:, :, :, ::1] dY,
             const floating[:, ::1] cols, floating[:, :, :, ::1] dX,
             floating[:, :, :, ::1] dW, floating[::1] db,
             int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1,
             int act=ACT_IDENTITY):
    """Backward pass of :func:`forward`; gradients are overwritten, never accumulated.

    Args:
        X, Wt, Y: the forward input, kernel and output.
        dY: gradient w.r.t. ``Y``; overwritten with ``dZ = dY * act'``.
        cols: the column matrix of ``X`` kept by :func:`forward` (None for a direct
            1x1 convolution).
        dX: gradient w.r.t. ``X`` (same shape), or None to skip it.
        dW: gradient w.r.t. ``Wt`` (same shape).
        db: gradient w.r.t. the bias, or None.
    """
    cdef Py_ssize_t N, H, W_, C, KH, KW, F, OH, OW
    N, H, W_, C, KH, KW, F, OH, OW = _check_shapes(X, Wt, Y, sh, sw, ph, pw, dh, dw)
    cdef Py_ssize_t P = N * OH * OW, K = KH * KW * C
    cdef bint direct = _is_direct(KH, KW, sh, sw, ph, pw)
    cdef bint has_db = db is not None
    cdef bint has_dx = dX is not None
    if (dY.shape[0], dY.shape[1], dY.shape[2], dY.shape[3]) != (N, OH, OW, F) or (dW.shape[0], dW.shape[1], dW.shape[2], dW.shape[3]) != (KH, KW, C, F):
        raise ValueError("conv backward: gradient buffers do not match the forward shapes")
    if has_dx and (dX.shape[0], dX.shape[1], dX.shape[2], dX.shape[3]) != (N, H, W_, C):
        raise ValueError("conv backward: dX does not match X")
    if has_db and db.shape[0] != F:
        raise ValueError("conv backward: db does not match the number of filters")
    if not direct and (cols is None or cols.shape[0] != P or cols.shape[1] != K):
        raise ValueError(f"conv backward: needs the {(P, K)} column matrix of the forward pass")
    cdef Py_ssize_t chunk = _chunk_rows(K, sizeof(floating), P) if P > 0 else 1
    cdef floating[:, ::1] scratch
    import numpy as np
    if has_dx and not direct and P > 0:
        scratch = np.empty((chunk, K), dtype=np.float32 if floating is float else np.float64)
    cdef const floating* cp = (&X[0, 0, 0, 0] if direct else &cols[0, 0]) if P > 0 else NULL
    cdef floating* dzp = &dY[0, 0, 0, 0] if P > 0 and F > 0 else NULL
    cdef Py_ssize_t i, j, r0, r1
    cdef floating* d
    with nogil:
        if has_db:
            for j in range(F):
                db[j] = 0
        if P == 0 or F == 0:
            memset(&dW[0, 0, 0, 0], 0, K * F * sizeof(floating))
            if has_dx and N * H * W_ * C > 0:
                memset(&dX[0, 0, 0, 0], 0, N * H * W_ * C * sizeof(floating))
        else:
            for i in range(P):
                d = dzp + i * F
                if act != ACT_IDENTITY:
                    act_backward_row(act, &Y[0, 0, 0, 0] + i * F, d, F)
                if has_db:
                    for j in range(F):
                        db[j] = db[j] + d[j]
            # dW (K, F) = cols^T (K, P) @ dZ (P, F)
            gemm(True, False, <int>K, <int>F, <int>P, <floating>1, cp, <int>K,
                 dzp, <int>F, <floating>0, &dW[0, 0, 0, 0], <int>F)
            if has_dx:
                if direct:
                    # dX (P, C) = dZ (P, F) @ Wt^T (F, C)
                    gemm(False, True, <int>P, <int>K, <int>F, <floating>1, dzp, <int>F,
                         &Wt[0, 0, 0, 0], <int>F, <floating>0, &dX[0, 0, 0, 0], <int>K)
                else:
                    memset(&dX[0, 0, 0, 0], 0, N * H * W_ * C * sizeof(floating))
                    r0 = 0
                    while r0 < P:
                        r1 = r0 + chunk if r0 + chunk < P else P
                        # dcols chunk (rows, K) = dZ chunk (rows, F) @ Wt^T (F, K)
                        gemm(False, True, <int>(r1 - r0), <int>K, <int>F, <floating>1,
                             dzp + r0 * F, <int>F, &Wt[0, 0, 0, 0], <int>F, <floating>0,
                             &scratch[0, 0], <int>K)
                        _col2im_rows(&dX[0, 0, 0, 0], H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw,
                                     dh, dw, r0, r1, &scratch[0, 0])
                        r0 = r1

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""2-D max and mean pooling kernels, channels-last ``(N, H, W, C)``, GIL released.

Window of output pixel ``(oh, ow)``: input rows ``oh * sh - pt + i`` for ``0 <= i < PH``
and columns ``ow * sw - pl + j`` for ``0 <= j < PW``; taps outside the input (padding)
are skipped: they never win a max and do not count in a mean.

Max pooling keeps, for every output value, the index ``(ih * W + iw) * C + c`` of its
winner inside the sample.  Tie rule: the window is scanned in row-major order (``i``
then ``j``) and a later tap replaces the current maximum only if it is strictly
greater, so among equal maxima the first in row-major window order is the winner and
alone receives the gradient.

Mean pooling divides by the number of taps inside the input (all ``PH * PW`` of them
for ``"valid"`` padding).  Overlapping windows (stride < pool size) are supported:
backward passes add their contributions.
"""
from cython cimport floating
from libc.string cimport memset

cdef extern from "conv_kernels.h" nogil:
    void sn_maxpool_fwd_f(const float* x, float* y, int* arg, Py_ssize_t H, Py_ssize_t W,
                          Py_ssize_t C, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t PH,
                          Py_ssize_t PW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pt,
                          Py_ssize_t pl)
    void sn_maxpool_fwd_d(const double* x, double* y, int* arg, Py_ssize_t H, Py_ssize_t W,
                          Py_ssize_t C, Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t PH,
                          Py_ssize_t PW, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pt,
                          Py_ssize_t pl)
    void sn_maxpool_bwd_tiled_f(const float* dy, const int* arg, float* dx, Py_ssize_t H,
                                Py_ssize_t W, Py_ssize_t C, Py_ssize_t OH, Py_ssize_t OW,
                                Py_ssize_t PH, Py_ssize_t PW)
    void sn_maxpool_bwd_tiled_d(const double* dy, const int* arg, double* dx, Py_ssize_t H,
                                Py_ssize_t W, Py_ssize_t C, Py_ssize_t OH, Py_ssize_t OW,
                                Py_ssize_t PH, Py_ssize_t PW)


def max_forward(const floating[:, :, :, ::1] X, floating[:, :, :, ::1] Y, int[:, :, :, ::1] arg,
                int PH, int PW, int sh=0, int sw=0, int pt=0, int pl=0):
    """``Y = maxpool(X)``; ``arg`` receives each winner's index inside its sample.

    ``sh``/``sw`` default to the pool size; ``pt``/``pl`` are the top/left paddings.
    """
    cdef Py_ssize_t N = X.shape[0], H = X.shape[1], W = X.shape[2], C = X.shape[3]
    cdef Py_ssize_t OH = Y.shape[1], OW = Y.shape[2]
    if sh <= 0:
        sh = PH
    if sw <= 0:
        sw = PW
    _check(N, H, W, C, Y.shape[0], OH, OW, Y.shape[3], PH, PW, sh, sw, pt, pl)
    if arg.shape[0] != N or arg.shape[1] != OH or arg.shape[2] != OW or arg.shape[3] != C:
        raise ValueError("max pool: argmax buffer does not match the output")
    if N * OH * OW * C == 0:
        return
    cdef Py_ssize_t n, step_x = H * W * C, step_y = OH * OW * C
    with nogil:
        for n in range(N):
            if floating is float:
                sn_maxpool_fwd_f(&X[n, 0, 0, 0], &Y[n, 0, 0, 0], &arg[n, 0, 0, 0], H, W, C, OH, OW,
                                 PH, PW, sh, sw, pt, pl)
            else:
                sn_maxpool_fwd_d(&X[n, 0, 0, 0], &Y[n, 0, 0, 0], &arg[n, 0, 0, 0], H, W, C, OH, OW,
                                 PH, PW, sh, sw, pt, pl)


def max_backward(const floating[:, :, :, ::1] dY, const int[:, :, :, ::1] arg,
                 floating[:, :, :, ::1] dX, int PH=0, int PW=0, int sh=0, int sw=0,
                 int pt=0, int pl=0):
    """``dX[...] = 0``, then each ``dY`` value is added to its window's winner.

    With the pooling geometry given and windows that tile the image (stride equal to the
    pool size, no padding), ``dX`` is written in one pass without a zero fill.
    """
    cdef Py_ssize_t N = dX.shape[0], H = dX.shape[1], W = dX.shape[2], C = dX.shape[3]
    cdef Py_ssize_t OH = dY.shape[1], OW = dY.shape[2]
    cdef Py_ssize_t M = OH * OW * dY.shape[3]
    cdef Py_ssize_t n, k
    if dY.shape[0] != N or arg.shape[0] != N or arg.shape[1] != dY.shape[1] \
            or arg.shape[2] != dY.shape[2] or arg.shape[3] != dY.shape[3] or dY.shape[3] != C:
        raise ValueError("max pool backward: dY, argmax and dX do not match")
    cdef bint tiled = (PH > 0 and PW > 0 and sh == PH and sw == PW and pt == 0 and pl == 0
                       and OH * PH <= H and OW * PW <= W)
    if N * H * W * C == 0:
        return
    cdef floating* dx
    cdef const floating* dy
    cdef const int* a
    with nogil:
        if tiled:
            for n in range(N):
                if floating is float:
                    sn_maxpool_bwd_tiled_f(&dY[n, 0, 0, 0], &arg[n, 0, 0, 0], &dX[n, 0, 0, 0],
                                           H, W, C, OH, OW, PH, PW)
                else:
                    sn_maxpool_bwd_tiled_d(&dY[n, 0, 0, 0], &arg[n, 0, 0, 0], &dX[n, 0, 0, 0],
                                           H, W, C, OH, OW, PH, PW)
        else:
            memset(&dX[0, 0, 0, 0], 0, N * H * W * C * sizeof(floating))
            if M > 0:
                for n in range(N):
                    dx = &dX[n, 0, 0, 0]
                    dy = &dY[n, 0, 0, 0]
                    a = &arg[n, 0, 0, 0]
                    for k in range(M):
                        dx[a[k]] += dy[k]


def avg_forward(const floating[:, :, :, ::1] X, floating[:, :, :, ::1] Y,
                int PH, int PW, int sh=0, int sw=0, int pt=0, int pl=0):
    """``Y = meanpool(X)`` (mean over the taps inside the input)."""
    cdef Py_ssize_t N = X.shape[0], H = X.shape[1], W = X.shape[2], C = X.shape[3]
    cdef Py_ssize_t OH = Y.shape[1], OW = Y.shape[2]
    if sh <= 0:
        sh = PH
    if sw <= 0:
        sw = PW
    _check(N, H, W, C, Y.shape[0], OH, OW, Y.shape[3], PH, PW, sh, sw, pt, pl)
    if N * OH * OW * C == 0:
        return
    cdef Py_ssize_t n, oh, ow, i, j, c, ih, iw, ih0, iw0, cnt
    cdef const floating* x
    cdef const floating* src
    cdef floating* y
    cdef floating inv
    with nogil:
        for n in range(N):
            x = &X[n, 0, 0, 0]
            for oh in range(OH):
                ih0 = oh * sh - pt
                for ow in range(OW):
                    iw0 = ow * sw - pl
                    y = &Y[n, oh, ow, 0]
                    for c in range(C):
                        y[c] = 0
                    cnt = 0
                    for i in range(PH):
                        ih = ih0 + i
                        if ih < 0 or ih >= H:
                            continue
                        for j in range(PW):
                            iw = iw0 + j
                            if iw < 0 or iw >= W:
                                continue
                            cnt += 1
                            src = x + (ih * W + iw) * C
                            for c in range(C):
                                y[c] += src[c]
                    inv = (<floating>1) / cnt
                    for c in range(C):
                        y[c] = y[c] * inv


def avg_backward(const floating[:, :, :, ::1] dY, floating[:, :, :, ::1] dX,
                 int PH, int PW, int sh=0, int sw=0, int pt=0, int pl=0):
    """``dX[...] = 0``, then each ``dY`` value is spread evenly over its window's taps."""
    cdef Py_ssize_t N = dX.shape[0], H = dX.shape[1], W = dX.shape[2], C = dX.shape[3]
    cdef Py_ssize_t OH = dY.shape[1], OW = dY.shape[2]
    if sh <= 0:
        sh = PH
    if sw <= 0:
        sw = PW
    _check(N, H, W, C, dY.shape[0], OH, OW, dY.shape[3], PH, PW, sh, sw, pt, pl)
    if N * H * W * C == 0:
        return
    cdef Py_ssize_t n, oh, ow, i, j, c, ih, iw, ih0, iw0, cnt, i0, i1, j0, j1
    cdef floating* dx
    cdef floating* d
    cdef const floating* dy
    cdef floating g
    with nogil:
        memset(&dX[0, 0, 0, 0], 0, N * H * W * C * sizeof(floating))
        for n in range(N):
            dx = &dX[n, 0, 0, 0]
            for oh in range(OH):
                ih0 = oh * sh - pt
                i0 = 0 if ih0 >= 0 else -ih0
                i1 = PH if ih0 + PH <= H else H - ih0
                for ow in range(OW):
                    iw0 = ow * sw - pl
                    j0 = 0 if iw0 >= 0 else -iw0
                    j1 = PW if iw0 + PW <= W else W - iw0
                    g = (<floating>1) / ((i1 - i0) * (j1 - j0))
                    dy = &dY[n, oh, ow, 0]
                    for i in range(i0, i1):
                        ih = ih0 + i
                        for j in range(j0, j1):
                            iw = iw0 + j
                            d = dx + (ih * W + iw) * C
                            for c in range(C):
                                d[c] += dy[c] * g


cdef _check(Py_ssize_t N, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C, Py_ssize_t YN,
            Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t YC, int PH, int PW, int sh, int sw,
            int pt, int pl):
    if PH < 1 or PW < 1 or sh < 1 or sw < 1 or pt < 0 or pl < 0 or pt >= PH or pl >= PW:
        raise ValueError(f"pool: bad window {PH}x{PW}, strides ({sh}, {sw}) or padding ({pt}, {pl})")
    if YN != N or YC != C:
        raise ValueError(f"pool: output has {YN} samples and {YC} channels, input {N} and {C}")
    # every window must hold at least one tap inside the input
    if OH < 1 or OW < 1 or (OH - 1) * sh - pt >= H or (OW - 1) * sw - pl >= W:
        raise ValueError(f"pool: output size ({OH}, {OW}) does not fit input ({H}, {W})")

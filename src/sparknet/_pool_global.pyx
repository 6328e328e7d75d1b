# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Global max and mean pooling over the steps of ``(N, T, C)``, masked, GIL released.

Layout (all C-contiguous): input ``X`` ``(N, T, C)``; mask ``M`` ``(N, T)`` of 0/1 bytes
(a numpy bool array viewed as ``uint8``), or None for all steps valid; output ``Y``
``(N, C)``.  Images ``(N, H, W, C)`` pass as ``(N, H * W, C)``.

Max: ``Y[n, c] = max over valid t of X[n, t, c]``; ``arg[n, c]`` keeps the step of the
winner.  The steps are scanned in order and a later step replaces the running maximum
only if it is strictly greater (or NaN, which propagates), so among equal maxima the
first wins and alone receives the gradient.  Mean: ``Y[n, c] = inv[n] * sum over valid
t of X[n, t, c]`` with ``inv[n] = 1 / count[n]``.  A sample with no valid step gets
``Y = 0``, ``arg = -1`` and ``inv = 0``: a zero gradient.

Each function is one pass over ``X`` (or ``dX``) in memory order, with a running row of
``C`` values per sample, where numpy would need several (``where``, ``argmax`` along a
strided axis, ``take_along_axis``).
"""
from cython cimport floating
from libc.string cimport memset


cdef _check(X, M, Py_ssize_t YN, Py_ssize_t YC, str what):
    cdef Py_ssize_t N = X.shape[0], T = X.shape[1], C = X.shape[2]
    if YN != N or YC != C:
        raise ValueError(f"{what}: output is ({YN}, {YC}), expected (N, C) = ({N}, {C})")
    if M is not None and (M.shape[0] != N or M.shape[1] != T):
        raise ValueError(f"{what}: mask is ({M.shape[0]}, {M.shape[1]}), expected (N, T) = "
                         f"({N}, {T})")
    if T >= 2 ** 31:
        raise ValueError(f"{what}: {T} steps do not fit the int32 winner index")


def max_forward(const floating[:, :, ::1] X, const unsigned char[:, ::1] M,
                floating[:, ::1] Y, int[:, ::1] arg):
    """``Y[n, c] = max over valid t of X[n, t, c]``, ``arg[n, c]`` its first step
    (0 and -1 for a sample with no valid step)."""
    _check(X, M, Y.shape[0], Y.shape[1], "global max pool")
    if arg.shape[0] != Y.shape[0] or arg.shape[1] != Y.shape[1]:
        raise ValueError("global max pool: the winner buffer does not match the output")
    cdef Py_ssize_t N = X.shape[0], T = X.shape[1], C = X.shape[2], n, t, c
    cdef bint has_m = M is not None
    cdef bint seen
    cdef const floating* x
    cdef floating* y
    cdef int* a
    cdef floating v
    if N * C == 0:
        return
    with nogil:
        for n in range(N):
            y = &Y[n, 0]
            a = &arg[n, 0]
            seen = False
            for t in range(T):
                if has_m and not M[n, t]:
                    continue
                x = &X[n, t, 0]
                if not seen:
                    # the first valid step starts the running maximum
                    for c in range(C):
                        y[c] = x[c]
                        a[c] = <int>t
                    seen = True
                    continue
                for c in range(C):
                    v = x[c]
                    if v > y[c] or v != v:
                        y[c] = v
                        a[c] = <int>t
            if not seen:
                for c in range(C):
                    y[c] = 0
                    a[c] = -1


def max_backward(const floating[:, ::1] dY, const int[:, ::1] arg, floating[:, :, ::1] dX):
    """``dX[...] = 0``, then ``dX[n, arg[n, c], c] = dY[n, c]`` where ``arg >= 0``."""
    cdef Py_ssize_t N = dX.shape[0], T = dX.shape[1], C = dX.shape[2], n, c
    cdef int a
    if dY.shape[0] != N or dY.shape[1] != C or arg.shape[0] != N or arg.shape[1] != C:
        raise ValueError(f"global max pool backward: dY ({dY.shape[0]}, {dY.shape[1]}) and "
                         f"arg ({arg.shape[0]}, {arg.shape[1]}) must be (N, C) = ({N}, {C})")
    if N * T * C == 0:
        return
    with nogil:
        memset(&dX[0, 0, 0], 0, N * T * C * sizeof(floating))
        for n in range(N):
            for c in range(C):
                a = arg[n, c]
                if 0 <= a < T:
                    dX[n, a, c] = dY[n, c]


def mean_forward(const floating[:, :, ::1] X, const unsigned char[:, ::1] M,
                 floating[:, ::1] Y, floating[::1] inv):
    """``Y[n, c] = inv[n] * sum over valid t of X[n, t, c]``; ``inv[n]`` gets
    ``1 / count[n]`` (0 for a sample with no valid step)."""
    _check(X, M, Y.shape[0], Y.shape[1], "global mean pool")
    if inv.shape[0] != X.shape[0]:
        raise ValueError("global mean pool: inv must hold one value per sample")
    cdef Py_ssize_t N = X.shape[0], T = X.shape[1], C = X.shape[2], n, t, c, cnt
    cdef bint has_m = M is not None
    cdef const floating* x
    cdef floating* y
    cdef floating s
    if N == 0:
        return
    with nogil:
        for n in range(N):
            y = &Y[n, 0] if C > 0 else NULL
            for c in range(C):
                y[c] = 0
            cnt = 0
            for t in range(T):
                if has_m and not M[n, t]:
                    continue
                cnt += 1
                x = &X[n, t, 0]
                for c in range(C):
                    y[c] += x[c]
            s = (<floating>1) / cnt if cnt > 0 else 0
            inv[n] = s
            for c in range(C):
                y[c] = y[c] * s


def mean_backward(const floating[:, ::1] dY, const unsigned char[:, ::1] M,
                  const floating[::1] inv, floating[:, :, ::1] dX):
    """``dX[n, t, c] = M[n, t] * inv[n] * dY[n, c]`` (``M`` None: every step valid)."""
    cdef Py_ssize_t N = dX.shape[0], T = dX.shape[1], C = dX.shape[2], n, t, c
    cdef bint has_m = M is not None
    cdef floating* d
    cdef floating s
    if dY.shape[0] != N or dY.shape[1] != C or inv.shape[0] != N:
        raise ValueError(f"global mean pool backward: dY ({dY.shape[0]}, {dY.shape[1]}) must "
                         f"be (N, C) = ({N}, {C}) and inv ({inv.shape[0]},) one per sample")
    if has_m and (M.shape[0] != N or M.shape[1] != T):
        raise ValueError("global mean pool backward: the mask does not match dX")
    if N * T * C == 0:
        return
    with nogil:
        for n in range(N):
            s = inv[n]
            for t in range(T):
                d = &dX[n, t, 0]
                if has_m and not M[n, t]:
                    memset(d, 0, C * sizeof(floating))
                    continue
                for c in range(C):
                    d[c] = s * dY[n, c]

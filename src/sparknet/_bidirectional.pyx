# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Kernels of :class:`sparknet.layers.Bidirectional`: each row's valid steps in reverse order.

The backward direction of a bidirectional recurrent layer reads every sequence from its last
valid step to its first.  With a mask the valid steps of row ``n`` are ``p_0 < ... < p_{k-1}``
(padding on the right, on the left, or anywhere); the reversal sends step ``p_j`` to
``p_{k-1-j}`` and leaves each padded step where it is.  It is held as one index array
``idx (N, T)`` with ``rev[n, t] = src[n, idx[n, t]]``, and since reversing twice gives back
the order it started from (``idx[n, idx[n, t]] == t``), the same array takes the backward
direction's inputs there and its outputs and gradients back.  The padded steps keep their
places, so the mask of the reversed batch is the mask itself.

Every function below is one pass of row copies (``memcpy`` of a step's ``D`` values) with the
GIL released, in float32 or float64; ``idx`` None means no mask (``idx[n, t] = T - 1 - t``).
"""
from libc.string cimport memcpy

from cython cimport floating


cdef int _check(bint ok, str what) except -1:
    if not ok:
        raise ValueError(what)
    return 0


def reversal_index(const unsigned char[:, ::1] mask, Py_ssize_t[:, ::1] idx):
    """``idx (N, T)``: the reversal of each row's valid steps (``mask[n, t] != 0``), padded steps
    mapped to themselves."""
    cdef Py_ssize_t N = mask.shape[0], T = mask.shape[1], n, t, lo, hi
    _check(idx.shape[0] == N and idx.shape[1] == T, "reversal_index: idx must be (N, T) like mask")
    with nogil:
        for n in range(N):
            for t in range(T):
                idx[n, t] = t
            # the j-th valid step from the left trades places with the j-th from the right
            lo = 0
            hi = T - 1
            while True:
                while lo < T and mask[n, lo] == 0:
                    lo += 1
                while hi >= 0 and mask[n, hi] == 0:
                    hi -= 1
                if lo >= hi:
                    break
                idx[n, lo] = hi
                idx[n, hi] = lo
                lo += 1
                hi -= 1


cdef inline Py_ssize_t _src(const Py_ssize_t* idx, Py_ssize_t n, Py_ssize_t t,
                            Py_ssize_t T) noexcept nogil:
    """The step of row ``n`` that reversed step ``t`` reads: ``idx[n, t]``, or ``T - 1 - t``
    without an index (``idx`` NULL)."""
    return idx[n * T + t] if idx != NULL else T - 1 - t


cdef inline const Py_ssize_t* _ptr(const Py_ssize_t[:, ::1] idx) noexcept:
    return &idx[0, 0] if idx is not None and idx.shape[0] > 0 and idx.shape[1] > 0 else NULL


def reverse_steps(const floating[:, :, ::1] src, const Py_ssize_t[:, ::1] idx,
                  floating[:, :, ::1] dst):
    """``dst[n, t, :] = src[n, idx[n, t], :]``: a batch ``(N, T, D)`` with each row's valid steps
    in reverse order."""
    cdef Py_ssize_t N = src.shape[0], T = src.shape[1], D = src.shape[2], n, t
    cdef bint has_idx = idx is not None
    cdef const Py_ssize_t* ip
    _check(dst.shape[0] == N and dst.shape[1] == T and dst.shape[2] == D,
           "reverse_steps: dst must have the shape of src")
    _check(not has_idx or (idx.shape[0] == N and idx.shape[1] == T), "reverse_steps: idx shape")
    if N == 0 or T == 0 or D == 0:
        return
    ip = _ptr(idx)
    with nogil:
        for n in range(N):
            for t in range(T):
                memcpy(&dst[n, t, 0], &src[n, _src(ip, n, t, T), 0], D * sizeof(floating))


def merge_sequences(const floating[:, :, ::1] y_fwd, const floating[:, :, ::1] y_bwd,
                    const Py_ssize_t[:, ::1] idx, bint concat, floating[:, :, ::1] out):
    """The merged per-step output, with the backward direction's steps put back in place:
    ``out[n, t] = [y_fwd[n, t], y_bwd[n, idx[n, t]]]`` (``concat``, ``out (N, T, 2H)``) or
    ``y_fwd[n, t] + y_bwd[n, idx[n, t]]`` (``out (N, T, H)``)."""
    cdef Py_ssize_t N = y_fwd.shape[0], T = y_fwd.shape[1], H = y_fwd.shape[2], n, t, j
    cdef bint has_idx = idx is not None
    cdef const Py_ssize_t* ip
    cdef const floating* b
    cdef floating* o
    _check(y_bwd.shape[0] == N and y_bwd.shape[1] == T and y_bwd.shape[2] == H,
           "merge_sequences: the two directions' outputs differ in shape")
    _check(out.shape[0] == N and out.shape[1] == T and out.shape[2] == (2 * H if concat else H),
           "merge_sequences: out shape")
    _check(not has_idx or (idx.shape[0] == N and idx.shape[1] == T), "merge_sequences: idx shape")
    if N == 0 or T == 0 or H == 0:
        return
    ip = _ptr(idx)
    with nogil:
        for n in range(N):
            for t in range(T):
                b = &y_bwd[n, _src(ip, n, t, T), 0]
                o = &out[n, t, 0]
                if concat:
                    memcpy(o, &y_fwd[n, t, 0], H * sizeof(floating))
                    memcpy(o + H, b, H * sizeof(floating))
                else:
                    for j in range(H):
                        o[j] = y_fwd[n, t, j] + b[j]


def split_sequence_grad(const floating[:, :, ::1] dy, const Py_ssize_t[:, ::1] idx,
                        floating[:, :, ::1] dy_fwd, floating[:, :, ::1] dy_bwd):
    """The output gradient ``dy (N, T, C)`` split between the directions, the backward one's in
    its reversed order: ``dy_bwd[n, t] = dy[n, idx[n, t], C - H:]`` and, when ``dy_fwd`` is
    not None, ``dy_fwd[n, t] = dy[n, t, :H]`` (``C = 2H`` for concat; for sum ``C = H`` and
    the forward direction reads ``dy`` itself)."""
    cdef Py_ssize_t N = dy.shape[0], T = dy.shape[1], C = dy.shape[2], n, t
    cdef Py_ssize_t H = dy_bwd.shape[2]
    cdef bint has_idx = idx is not None, has_fwd = dy_fwd is not None
    cdef const Py_ssize_t* ip
    _check(dy_bwd.shape[0] == N and dy_bwd.shape[1] == T and (C == H or C == 2 * H),
           "split_sequence_grad: dy_bwd shape")
    _check(not has_fwd or (dy_fwd.shape[0] == N and dy_fwd.shape[1] == T and dy_fwd.shape[2] == H),
           "split_sequence_grad: dy_fwd shape")
    _check(not has_idx or (idx.shape[0] == N and idx.shape[1] == T),
           "split_sequence_grad: idx shape")
    if N == 0 or T == 0 or H == 0:
        return
    ip = _ptr(idx)
    with nogil:
        for n in range(N):
            for t in range(T):
                if has_fwd:
                    memcpy(&dy_fwd[n, t, 0], &dy[n, t, 0], H * sizeof(floating))
                memcpy(&dy_bwd[n, t, 0], &dy[n, _src(ip, n, t, T), C - H],
                       H * sizeof(floating))


def add_reversed(floating[:, :, ::1] dx, const floating[:, :, ::1] dx_bwd,
                 const Py_ssize_t[:, ::1] idx):
    """The input gradient of both directions: ``dx[n, t] += dx_bwd[n, idx[n, t]]``."""
    cdef Py_ssize_t N = dx.shape[0], T = dx.shape[1], F = dx.shape[2], n, t, j
    cdef bint has_idx = idx is not None
    cdef const Py_ssize_t* ip
    cdef const floating* b
    _check(dx_bwd.shape[0] == N and dx_bwd.shape[1] == T and dx_bwd.shape[2] == F,
           "add_reversed: the two directions' input gradients differ in shape")
    _check(not has_idx or (idx.shape[0] == N and idx.shape[1] == T), "add_reversed: idx shape")
    if N == 0 or T == 0 or F == 0:
        return
    ip = _ptr(idx)
    with nogil:
        for n in range(N):
            for t in range(T):
                b = &dx_bwd[n, _src(ip, n, t, T), 0]
                for j in range(F):
                    dx[n, t, j] += b[j]

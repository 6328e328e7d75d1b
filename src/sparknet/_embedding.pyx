# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Embedding kernels: a row gather forward and a scatter-add backward, GIL released."""
from libc.string cimport memcpy, memset

from cython cimport floating


def embedding_forward(const long long[::1] ids, const floating[:, ::1] table, floating[:, ::1] out):
    """``out[k] = table[ids[k]]``; ids must already be checked to lie in ``[0, vocab)``."""
    cdef Py_ssize_t K = ids.shape[0], D = table.shape[1], k
    if out.shape[0] != K or out.shape[1] != D:
        raise ValueError("embedding_forward: out shape")
    if K == 0 or D == 0:
        return
    with nogil:
        for k in range(K):
            memcpy(&out[k, 0], &table[ids[k], 0], D * sizeof(floating))


def embedding_backward(const long long[::1] ids, const floating[:, ::1] dy,
                       floating[:, ::1] dtable):
    """``dtable[...] = 0; dtable[ids[k]] += dy[k]`` (a scatter-add, overwrites ``dtable``)."""
    cdef Py_ssize_t K = ids.shape[0], D = dtable.shape[1], V = dtable.shape[0], k, j
    cdef floating* dst
    cdef const floating* src
    if dy.shape[0] != K or dy.shape[1] != D:
        raise ValueError("embedding_backward: dy shape")
    if V == 0 or D == 0:
        return
    with nogil:
        memset(&dtable[0, 0], 0, V * D * sizeof(floating))
        for k in range(K):
            dst = &dtable[ids[k], 0]
            src = &dy[k, 0]
            for j in range(D):
                dst[j] = dst[j] + src[j]

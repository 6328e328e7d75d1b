# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Row-major BLAS wrappers (see ``_blas.pxd``) and Python-callable test shims."""

from cython cimport floating
from scipy.linalg.cython_blas cimport sgemm, dgemm, sgemv, dgemv, saxpy, daxpy, sdot, ddot


cdef void gemm(bint trans_a, bint trans_b, int M, int N, int K,
               floating alpha, const floating* A, int lda,
               const floating* B, int ldb,
               floating beta, floating* C, int ldc) noexcept nogil:
    # Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
    # A row-major matrix read as column-major is its transpose, so we pass
    # B first, then A, keeping their own transpose flags.
    cdef char ta = b'T' if trans_b else b'N'
    cdef char tb = b'T' if trans_a else b'N'
    if M == 0 or N == 0:
        return
    if floating is float:
        sgemm(&ta, &tb, &N, &M, &K, &alpha, <float*>B, &ldb, <float*>A, &lda, &beta, C, &ldc)
    else:
        dgemm(&ta, &tb, &N, &M, &K, &alpha, <double*>B, &ldb, <double*>A, &lda, &beta, C, &ldc)


cdef void gemv(bint trans, int M, int N, floating alpha, const floating* A, int lda,
               const floating* x, int incx, floating beta, floating* y, int incy) noexcept nogil:
    # Row-major (M, N) is column-major (N, M): flip the transpose flag.
    cdef char t = b'N' if trans else b'T'
    if floating is float:
        sgemv(&t, &N, &M, &alpha, <float*>A, &lda, <float*>x, &incx, &beta, y, &incy)
    else:
        dgemv(&t, &N, &M, &alpha, <double*>A, &lda, <double*>x, &incx, &beta, y, &incy)


cdef void axpy(int n, floating alpha, const floating* x, int incx,
               floating* y, int incy) noexcept nogil:
    if floating is float:
        saxpy(&n, &alpha, <float*>x, &incx, y, &incy)
    else:
        daxpy(&n, &alpha, <double*>x, &incx, y, &incy)


cdef floating dot(int n, const floating* x, int incx, const floating* y, int incy) noexcept nogil:
    if floating is float:
        return sdot(&n, <float*>x, &incx, <float*>y, &incy)
    else:
        return ddot(&n, <double*>x, &incx, <double*>y, &incy)


# ---------------------------------------------------------------------------
# Python entry points (used by tests and by pure-Python code that wants a
# nogil product into a preallocated buffer).
# ---------------------------------------------------------------------------

def py_gemm(bint trans_a, bint trans_b, double alpha, const floating[:, ::1] A,
            const floating[:, ::1] B, double beta, floating[:, ::1] C):
    """``C[...] = alpha * op(A) @ op(B) + beta * C`` (all C-contiguous), GIL released."""
    cdef int M = C.shape[0]
    cdef int N = C.shape[1]
    cdef int K = A.shape[0] if trans_a else A.shape[1]
    cdef int ka = A.shape[1] if trans_a else A.shape[0]
    cdef int kb = B.shape[1] if trans_b else B.shape[0]
    cdef int nb = B.shape[0] if trans_b else B.shape[1]
    if ka != M or kb != K or nb != N:
        raise ValueError(
            f"gemm shape mismatch: op(A) is ({ka}, {K}), op(B) is ({kb}, {nb}), C is ({M}, {N})")
    if K == 0:
        if beta == 0:
            C[:, :] = 0
        else:
            for i in range(M):
                for j in range(N):
                    C[i, j] *= beta
        return
    with nogil:
        gemm(trans_a, trans_b, M, N, K, <floating>alpha, &A[0, 0], A.shape[1], &B[0, 0], B.shape[1],
             <floating>beta, &C[0, 0], C.shape[1])

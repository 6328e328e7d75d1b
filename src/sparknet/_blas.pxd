# cython: language_level=3
"""Row-major, nogil BLAS wrappers over ``scipy.linalg.cython_blas``.

Every routine takes raw pointers to C-contiguous (row-major) data.  BLAS is
column-major, so a row-major product ``C = A @ B`` is computed as the
column-major product ``C^T = B^T @ A^T``: the operands are swapped, no data is
copied.  ``floating`` is Cython's fused type (float32 and float64).
"""

from cython cimport floating

# C[M, N] = alpha * op(A) @ op(B) + beta * C, all row-major.
# op(A) is (M, K): A is (M, K) with lda >= K, or (K, M) with lda >= M when trans_a.
# op(B) is (K, N): B is (K, N) with ldb >= N, or (N, K) with ldb >= K when trans_b.
# numpy: C[...] = alpha * (A.T if trans_a else A) @ (B.T if trans_b else B) + beta * C
cdef void gemm(bint trans_a, bint trans_b, int M, int N, int K,
               floating alpha, const floating* A, int lda,
               const floating* B, int ldb,
               floating beta, floating* C, int ldc) noexcept nogil

# y[M] = alpha * op(A) @ x + beta * y, A row-major (M, N), or (N, M) when trans.
# numpy: y[...] = alpha * (A.T if trans else A) @ x + beta * y
cdef void gemv(bint trans, int M, int N, floating alpha, const floating* A, int lda,
               const floating* x, int incx, floating beta, floating* y, int incy) noexcept nogil

# y += alpha * x   (numpy: y += alpha * x)
cdef void axpy(int n, floating alpha, const floating* x, int incx,
               floating* y, int incy) noexcept nogil

# returns x @ y
cdef floating dot(int n, const floating* x, int incx, const floating* y, int incy) noexcept nogil

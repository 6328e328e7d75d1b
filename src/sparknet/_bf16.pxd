# cython: language_level=3
"""The bfloat16 GEMM of ``csrc/bf16_gemm.h`` (AVX512-BF16) and ``csrc/bf16_amx.h`` (AMX tiles,
chosen per product) for the other kernels (float32 operands rounded to bfloat16 as they are
packed, float32 accumulation and result).  Row-major, as ``_blas.pxd``.
Call the products only when :c:func:`kernel_on` is true (the layers check it through
:mod:`sparknet.precision` before they choose the bfloat16 path)."""

from libc.stdint cimport int32_t


# B (K, N) packed in panels of 32 columns of bfloat16 pairs, for any number of products
cdef class PackedB:
    cdef int32_t* data
    cdef readonly Py_ssize_t K, N
    cdef readonly bint trans
    cdef int fill(self, const float* src, Py_ssize_t ld) except -1 nogil


# True when the bfloat16 kernels are usable (CPU has AVX512-BF16, not switched off)
cdef bint kernel_on() noexcept nogil

# panels of B (K, N) = src (row stride ld), or src^T (src is (N, K)) when trans; malloc'd (the
# caller frees it), NULL if out of memory
cdef int32_t* pack_alloc(const float* src, Py_ssize_t ld, bint trans, Py_ssize_t K,
                         Py_ssize_t N) noexcept nogil

# the words of the packing of B (K, N) (as pack_alloc: src, or src^T when trans) that the
# source's rows lo <= r < hi determine, written in place into out (lo even, or a multiple of 32
# when trans): the optimizer packs the rows it has just updated while they are in cache
cdef void pack_part(const float* src, Py_ssize_t ld, bint trans, Py_ssize_t K, Py_ssize_t N,
                    Py_ssize_t lo, Py_ssize_t hi, int32_t* out) noexcept nogil

# C (M, N) (+)= op(A) (M, K) @ B, B in panels; op(A) = A (M, K) or A^T (A is (K, M)) when
# trans_a.  numpy: C[...] = (A.T if trans_a else A) @ B (+ C).  Returns -1 if out of memory.
cdef int gemm_packed(bint trans_a, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* A,
                     Py_ssize_t lda, const int32_t* Bp, float* C, Py_ssize_t ldc,
                     bint accumulate) noexcept nogil

# C (M, N) (+)= op(A) @ op(B), both packed here for this one product (activations, gradients).
# numpy: C[...] = (A.T if trans_a else A) @ (B.T if trans_b else B) (+ C).  -1 if out of memory.
cdef int gemm(bint trans_a, bint trans_b, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
              const float* A, Py_ssize_t lda, const float* B, Py_ssize_t ldb, float* C,
              Py_ssize_t ldc, bint accumulate) noexcept nogil

# the same two products with A (and B) given as float32 or as bfloat16 bits (a_bf16, b_bf16:
# uint16, e.g. im2col's columns written so)
cdef int product(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, bint a_bf16,
                 Py_ssize_t lda, bint trans_a, const int32_t* Bp, float* C, Py_ssize_t ldc,
                 bint accumulate) noexcept nogil
cdef int product_of(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, bint a_bf16,
                    Py_ssize_t lda, bint trans_a, const void* B, bint b_bf16, Py_ssize_t ldb,
                    bint trans_b, float* C, Py_ssize_t ldc, bint accumulate) noexcept nogil

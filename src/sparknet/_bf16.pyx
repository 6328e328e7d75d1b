# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""bfloat16 products with float32 accumulation, and float32 <-> bfloat16 conversions.

``C (+)= op(A) @ op(B)`` where the float32 operands are rounded to bfloat16 (round to
nearest even) and the products are summed in float32: the result of a float32 GEMM on
the rounded operands, up to the order of the additions.  bfloat16 arrays are ``uint16``
arrays of the bit patterns (the upper half of the float32).

The kernel is ``csrc/bf16_gemm.h`` (AVX512-BF16, chosen at run time: the CPU is asked
once, at import).  Without it (a CPU without the instructions, or :func:`set_backend`
``("fallback")``, or the environment variable ``SPARKNET_BF16=fallback`` at import), the
same products run as float32 BLAS products of the rounded operands: the same values up to
summation order, at float32 speed.  Training (``precision="bf16"``) then uses float32
instead (:mod:`sparknet.precision`).

AMX tiles (``cpu_features()["amx_bf16"]``) are detected and reported, not used: an AMX kernel
would be one more backend chosen here at import, after asking Linux for the tile state
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``), behind the same functions.
"""
import os

import numpy as np

from libc.stdint cimport int32_t, uint16_t
from libc.stdlib cimport free, malloc

from sparknet._blas cimport gemm as blas_gemm


cdef extern from "bf16_gemm.h" nogil:
    int sn_bf16_cpu_features()
    size_t sn_bf16_packed_bytes(Py_ssize_t K, Py_ssize_t N)
    void sn_f32_to_bf16_scalar(const float* x, uint16_t* y, Py_ssize_t n)
    void sn_f32_to_bf16_avx512(const float* x, uint16_t* y, Py_ssize_t n)
    void sn_bf16_to_f32_scalar(const uint16_t* x, float* y, Py_ssize_t n)
    void sn_bf16_pack_b(Py_ssize_t K, Py_ssize_t N, const void* B, int b_bf16, Py_ssize_t ldb,
                        int trans_b, int32_t* out)
    int sn_bf16_gemm_packed(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, int a_bf16,
                            Py_ssize_t lda, int trans_a, const int32_t* Bp, float* C,
                            Py_ssize_t ldc, int accumulate)
    int sn_bf16_gemm(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, int a_bf16,
                     Py_ssize_t lda, int trans_a, const void* B, int b_bf16, Py_ssize_t ldb,
                     int trans_b, float* C, Py_ssize_t ldc, int accumulate)


#: the values of ``SPARKNET_BF16`` that turn the kernel off at import
FALLBACK_VALUES = ("fallback", "off", "0", "no", "false")

cdef int _features = sn_bf16_cpu_features()
cdef bint _cpu_bf16 = (_features & 1) != 0
cdef bint _kernel = _cpu_bf16 and (
    os.environ.get("SPARKNET_BF16", "").strip().lower() not in FALLBACK_VALUES)


cdef bint kernel_on() noexcept nogil:
    return _kernel


def cpu_features() -> dict:
    """What the CPU offers (cpuid): ``{"avx512_bf16": bool, "amx_bf16": bool}``
    (``avx512_bf16`` also requires AVX512F/BW/VL and the OS saving the zmm state)."""
    return {"avx512_bf16": bool(_features & 1), "amx_bf16": bool(_features & 2)}


def set_backend(str name) -> str:
    """Choose the bfloat16 products: ``"auto"`` (the AVX512-BF16 kernel when the CPU has
    it) or ``"fallback"`` (float32 BLAS on rounded operands; training in bf16 then falls
    back to float32).  Returns :func:`backend`."""
    global _kernel
    if name not in ("auto", "fallback"):
        raise ValueError(f"bf16 backend must be 'auto' or 'fallback', got {name!r}")
    _kernel = _cpu_bf16 and name == "auto"
    return backend()


def backend() -> str:
    """``"avx512_bf16"`` or ``"fallback"``: what the bfloat16 products run on now."""
    return "avx512_bf16" if _kernel else "fallback"


def capabilities() -> dict:
    """The paths sparknet's matrix products take on this CPU:

    ``{"fp32": "avx512" | "blas", "bf16": "avx512_bf16" | None, "amx": None,
    "cpu": cpu_features()}``: float32 products on the built-in AVX-512 kernels (convolution
    and recurrent layers; dense layers use the BLAS) or on the BLAS alone; bfloat16 products
    on the AVX512-BF16 kernel, or None when ``precision="bf16"`` falls back to float32; AMX
    tiles are not used by this build (``cpu["amx_bf16"]`` says whether the CPU has them).
    """
    import sparknet._conv as _conv
    return {"fp32": _conv.gemm_backend(), "bf16": "avx512_bf16" if _kernel else None,
            "amx": None, "cpu": cpu_features()}


# ---------------------------------------------------------------------------- conversions

def to_bf16(x) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (``uint16``, same shape), round to nearest even;
    NaN stays NaN, float32 denormals become zeros of their sign (as the instructions do)."""
    cdef float[::1] src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(src.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] dst = out
    if src.shape[0] > 0:
        with nogil:
            if _kernel:
                sn_f32_to_bf16_avx512(&src[0], &dst[0], src.shape[0])
            else:
                sn_f32_to_bf16_scalar(&src[0], &dst[0], src.shape[0])
    return out.reshape(np.shape(x))


def from_bf16(h) -> np.ndarray:
    """bfloat16 bit patterns (``uint16``) -> float32 (exact)."""
    cdef uint16_t[::1] src = np.ascontiguousarray(h, dtype=np.uint16).reshape(-1)
    out = np.empty(src.shape[0], dtype=np.float32)
    cdef float[::1] dst = out
    if src.shape[0] > 0:
        with nogil:
            sn_bf16_to_f32_scalar(&src[0], &dst[0], src.shape[0])
    return out.reshape(np.shape(h))


def round_bf16(x) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (as float32): ``from_bf16(to_bf16(x))``."""
    return from_bf16(to_bf16(x))


# ---------------------------------------------------------------------------- packed weights

cdef class PackedB:
    """A matrix ``B (K, N)`` packed in bfloat16 panels for :func:`gemm_packed`: from ``W``
    itself (``trans=False``, ``W`` is ``(K, N)``) or its transpose (``trans=True``, ``W`` is
    ``(N, K)``).  :meth:`refill` packs new values of the same shape in place."""

    def __cinit__(self, Py_ssize_t K, Py_ssize_t N, bint trans=False):
        if K < 0 or N < 0:
            raise ValueError(f"PackedB: K and N must be >= 0, got K={K}, N={N}")
        self.K = K
        self.N = N
        self.trans = trans
        self.data = <int32_t*>malloc(sn_bf16_packed_bytes(K, N))
        if self.data == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.data)

    cdef int fill(self, const float* src, Py_ssize_t ld) except -1 nogil:
        if not _kernel:
            with gil:
                raise RuntimeError("the AVX512-BF16 kernel is off (see sparknet._bf16.backend())")
        if self.K > 0 and self.N > 0:
            sn_bf16_pack_b(self.K, self.N, src, 0, ld, self.trans, self.data)
        return 0

    def refill(self, const float[:, ::1] W) -> None:
        """Pack ``W`` (same shape as at creation) in place."""
        cdef Py_ssize_t rows = self.N if self.trans else self.K
        cdef Py_ssize_t cols = self.K if self.trans else self.N
        if W.shape[0] != rows or W.shape[1] != cols:
            raise ValueError(f"PackedB.refill: W has shape {(W.shape[0], W.shape[1])}, expected "
                             f"{(rows, cols)}")
        if rows > 0 and cols > 0:
            with nogil:
                self.fill(&W[0, 0], cols)


def pack(const float[:, ::1] W, bint trans=False) -> PackedB:
    """``W`` (``trans=False``: B = W, ``(K, N)``) or ``W.T`` (``trans=True``: W is ``(N, K)``)
    packed for :func:`gemm_packed` (needs the AVX512-BF16 kernel)."""
    cdef Py_ssize_t rows = W.shape[0], cols = W.shape[1]
    cdef PackedB p = PackedB(cols, rows, True) if trans else PackedB(rows, cols, False)
    p.refill(W)
    return p


# ---------------------------------------------------------------------------- for other kernels

cdef int32_t* pack_alloc(const float* src, Py_ssize_t ld, bint trans, Py_ssize_t K,
                         Py_ssize_t N) noexcept nogil:
    cdef int32_t* out = <int32_t*>malloc(sn_bf16_packed_bytes(K, N))
    if out != NULL and K > 0 and N > 0:
        sn_bf16_pack_b(K, N, src, 0, ld, trans, out)
    return out


cdef int gemm_packed(bint trans_a, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* A,
                     Py_ssize_t lda, const int32_t* Bp, float* C, Py_ssize_t ldc,
                     bint accumulate) noexcept nogil:
    return sn_bf16_gemm_packed(M, N, K, A, 0, lda, trans_a, Bp, C, ldc, accumulate)


cdef int gemm(bint trans_a, bint trans_b, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
              const float* A, Py_ssize_t lda, const float* B, Py_ssize_t ldb, float* C,
              Py_ssize_t ldc, bint accumulate) noexcept nogil:
    return sn_bf16_gemm(M, N, K, A, 0, lda, trans_a, B, 0, ldb, trans_b, C, ldc, accumulate)


# ---------------------------------------------------------------------------- Python entry points

def _operand(X, str name):
    """A 2-D C-contiguous float32 or bfloat16 (uint16) operand."""
    a = np.asarray(X)
    if a.ndim != 2:
        raise ValueError(f"bf16 gemm: {name} must be 2-D, got shape {a.shape}")
    if a.dtype != np.uint16:
        a = np.ascontiguousarray(a, dtype=np.float32)
    return np.ascontiguousarray(a)


def _as_float(a) -> np.ndarray:
    """A float32 operand rounded to bfloat16, or a bfloat16 one widened (the fallback's input)."""
    return from_bf16(a) if a.dtype == np.uint16 else round_bf16(a)


def py_gemm(X, Y, float[:, ::1] C, bint trans_a=False, bint trans_b=False,
            bint accumulate=False) -> None:
    """``C[...] = op(X) @ op(Y)`` (``C +=`` when ``accumulate``) with bfloat16 operands and
    float32 accumulation; ``X``, ``Y`` are float32 (rounded to bfloat16 here) or ``uint16``
    bfloat16 bit patterns, 2-D; ``op(X) = X.T`` when ``trans_a`` (likewise ``trans_b``);
    ``C`` is float32, C-contiguous.  GIL released."""
    A = _operand(X, "A")
    B = _operand(Y, "B")
    cdef Py_ssize_t M = A.shape[1] if trans_a else A.shape[0]
    cdef Py_ssize_t K = A.shape[0] if trans_a else A.shape[1]
    cdef Py_ssize_t kb = B.shape[1] if trans_b else B.shape[0]
    cdef Py_ssize_t N = B.shape[0] if trans_b else B.shape[1]
    if kb != K or C.shape[0] != M or C.shape[1] != N:
        raise ValueError(f"bf16 gemm shape mismatch: op(A) is ({M}, {K}), op(B) is ({kb}, {N}), "
                         f"C is ({C.shape[0]}, {C.shape[1]})")
    if M == 0 or N == 0:
        return
    cdef int rc = 0
    cdef bint a16 = A.dtype == np.uint16, b16 = B.dtype == np.uint16
    cdef Py_ssize_t lda = A.shape[1], ldb = B.shape[1]
    cdef const void* ap = <const void*><size_t>A.ctypes.data
    cdef const void* bp = <const void*><size_t>B.ctypes.data
    cdef float[:, ::1] af
    cdef float[:, ::1] bf
    if _kernel:
        with nogil:
            rc = sn_bf16_gemm(M, N, K, ap, a16, lda, trans_a, bp, b16, ldb,
                              trans_b, &C[0, 0], C.shape[1], accumulate)
        if rc != 0:
            raise MemoryError()
        return
    if K == 0:
        if not accumulate:
            C[:, :] = 0
        return
    af = _as_float(A)
    bf = _as_float(B)
    with nogil:
        blas_gemm(trans_a, trans_b, <int>M, <int>N, <int>K, <float>1, &af[0, 0], <int>af.shape[1],
                  &bf[0, 0], <int>bf.shape[1], <float>(1 if accumulate else 0), &C[0, 0],
                  <int>C.shape[1])


def py_gemm_packed(X, PackedB Bp, float[:, ::1] C, bint trans_a=False,
                   bint accumulate=False) -> None:
    """``C[...] = op(X) @ B`` (``C +=`` when ``accumulate``) with ``B`` packed by :func:`pack`;
    ``X`` float32 or bfloat16 bits.  Needs the AVX512-BF16 kernel."""
    A = _operand(X, "A")
    cdef Py_ssize_t M = A.shape[1] if trans_a else A.shape[0]
    cdef Py_ssize_t K = A.shape[0] if trans_a else A.shape[1]
    if K != Bp.K or C.shape[0] != M or C.shape[1] != Bp.N:
        raise ValueError(f"bf16 gemm shape mismatch: op(A) is ({M}, {K}), B is ({Bp.K}, {Bp.N}), "
                         f"C is ({C.shape[0]}, {C.shape[1]})")
    if not _kernel:
        raise RuntimeError("the AVX512-BF16 kernel is off (see sparknet._bf16.backend())")
    cdef int rc = 0
    cdef bint a16 = A.dtype == np.uint16
    cdef Py_ssize_t lda = A.shape[1]
    cdef const void* ap = <const void*><size_t>A.ctypes.data
    if M == 0 or Bp.N == 0:
        return
    with nogil:
        rc = sn_bf16_gemm_packed(M, Bp.N, K, ap, a16, lda, trans_a, Bp.data, &C[0, 0],
                                 C.shape[1], accumulate)
    if rc != 0:
        raise MemoryError()

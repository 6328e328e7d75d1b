# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""bfloat16 products with float32 accumulation, and float32 <-> bfloat16 conversions.

``C (+)= op(A) @ op(B)`` where the float32 operands are rounded to bfloat16 (round to
nearest even) and the products are summed in float32: the result of a float32 GEMM on
the rounded operands, up to the order of the additions.  bfloat16 arrays are ``uint16``
arrays of the bit patterns (the upper half of the float32).

Backends, chosen at run time (:func:`set_backend`, or ``SPARKNET_BF16=<name>`` at import):

- ``"amx"``: AMX-BF16 tiles (``csrc/bf16_amx.h``, ``tdpbf16ps``).  Under ``"auto"`` only the
  products past a size rule (``sn_amx_worth``: small ones are faster on AVX512-BF16) run on
  the tiles; ``set_backend("amx")`` sends every product there.  Linux gives a process the
  tile state on request (``arch_prctl(ARCH_REQ_XCOMP_PERM)``), asked the first time it is
  needed; if it refuses, the products run on AVX512-BF16 and :func:`capabilities` says why.
- ``"avx512_bf16"``: the AVX512-BF16 kernel (``csrc/bf16_gemm.h``, ``vdpbf16ps``).
- ``"fallback"`` (also ``SPARKNET_BF16=off``, ``0``, ...): float32 BLAS products of the
  rounded operands, the same values up to summation order at float32 speed; training
  (``precision="bf16"``) then uses float32 instead (:mod:`sparknet.precision`).
- ``"auto"`` (the default): AMX where the CPU and the OS allow it, else AVX512-BF16, else
  the fallback.

Both kernels read the same packed weights (:class:`PackedB`), so the choice may change
between products.
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
    void sn_bf16_pack_b_part(Py_ssize_t K, Py_ssize_t N, const void* B, int b_bf16,
                             Py_ssize_t ldb, int trans_b, Py_ssize_t lo, Py_ssize_t hi,
                             int32_t* out)
    int sn_bf16_gemm_packed(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, int a_bf16,
                            Py_ssize_t lda, int trans_a, const int32_t* Bp, float* C,
                            Py_ssize_t ldc, int accumulate)
    int SN_AMX_OK, SN_AMX_NO_CPU, SN_AMX_NO_OS, SN_AMX_NOT_LINUX, SN_AMX_REFUSED
    int sn_amx_status()
    int sn_amx_errno()
    int sn_amx_worth(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K)
    int sn_amx_gemm_packed(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, int a_bf16,
                           Py_ssize_t lda, int trans_a, const int32_t* Bp, float* C,
                           Py_ssize_t ldc, int accumulate)


#: the names :func:`set_backend` takes (and ``SPARKNET_BF16`` at import)
BACKENDS = ("auto", "amx", "avx512_bf16", "fallback")
#: the values of ``SPARKNET_BF16`` that turn the kernels off at import
FALLBACK_VALUES = ("fallback", "off", "0", "no", "false")

# which products run on AMX tiles
cdef enum AmxMode:
    AMX_NONE = 0     # none
    AMX_SIZED = 1    # those that sn_amx_worth() picks ("auto")
    AMX_ALL = 2      # all ("amx")

cdef int _features = sn_bf16_cpu_features()
cdef bint _cpu_bf16 = (_features & 1) != 0
cdef bint _cpu_amx = (_features & 3) == 3
cdef bint _kernel = False
cdef AmxMode _amx_mode = AMX_NONE
cdef str _choice = "auto"


cdef bint kernel_on() noexcept nogil:
    return _kernel


cdef inline bint on_amx(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K) noexcept nogil:
    """True when the product (M, N, K) runs on AMX tiles (the first call may ask Linux for
    them)."""
    if _amx_mode == AMX_NONE or (_amx_mode == AMX_SIZED and not sn_amx_worth(M, N, K)):
        return False
    return sn_amx_status() == SN_AMX_OK


def cpu_features() -> dict:
    """What the CPU offers (cpuid): ``{"avx512_bf16": bool, "amx_bf16": bool}``
    (``avx512_bf16`` also requires AVX512F/BW/VL and the OS saving the zmm state;
    ``amx_bf16`` means AMX-BF16 and AMX-TILE)."""
    return {"avx512_bf16": bool(_features & 1), "amx_bf16": bool(_features & 2)}


def amx_status() -> str:
    """Why AMX tiles can or cannot run products in this process: ``"ok"`` or the reason.
    Asks Linux for the tile state the first time (once per process)."""
    cdef int s = sn_amx_status()
    if s == SN_AMX_OK:
        return "ok"
    if s == SN_AMX_NO_CPU:
        return ("this CPU has no AMX-BF16 tiles" if not _features & 2
                else "AMX needs AVX512-BF16 too, which this CPU (or its OS) lacks")
    if s == SN_AMX_NO_OS:
        return "the OS does not manage the AMX tile state (XCR0 bits 17-18 clear)"
    if s == SN_AMX_NOT_LINUX:
        return "not Linux: no arch_prctl to ask for the AMX tile state"
    err = sn_amx_errno()
    return (f"Linux refused the AMX tile state: arch_prctl(ARCH_REQ_XCOMP_PERM) failed with "
            f"{os.strerror(err)} (errno {err})")


def amx_worth(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K) -> bool:
    """Whether ``"auto"`` sends a product ``(M, K) @ (K, N)`` to AMX tiles (where they are
    usable): the size rule of ``csrc/bf16_amx.h``."""
    return bool(sn_amx_worth(M, N, K))


def available_backends() -> tuple:
    """The names :func:`set_backend` accepts on this machine (``"amx"`` only where the tiles
    are usable; may ask Linux for them)."""
    out = ["auto"]
    if _cpu_amx and amx_status() == "ok":
        out.append("amx")
    if _cpu_bf16:
        out.append("avx512_bf16")
    out.append("fallback")
    return tuple(out)


def set_backend(str name) -> str:
    """Choose what runs the bfloat16 products: ``"auto"`` (AMX tiles where usable and worth
    it per product, else AVX512-BF16, else the fallback), ``"amx"`` (every product on AMX
    tiles), ``"avx512_bf16"`` or ``"fallback"`` (float32 BLAS on rounded operands; training in
    bf16 then falls back to float32).  A name this machine cannot run raises ``ValueError``
    naming :func:`available_backends`.  Returns :func:`backend`."""
    if name not in BACKENDS:
        raise ValueError(f"bf16 backend must be one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {name!r}")
    if name == "amx" and not (_cpu_amx and amx_status() == "ok"):
        raise ValueError(f"bf16 backend 'amx' is not available here ({amx_status()}); "
                         f"available: {', '.join(map(repr, available_backends()))}")
    if name == "avx512_bf16" and not _cpu_bf16:
        raise ValueError(f"bf16 backend 'avx512_bf16' is not available here (this CPU has no "
                         f"AVX512-BF16); available: {', '.join(map(repr, available_backends()))}")
    _apply(name)
    return backend()


cdef void _apply(str name):
    """Switch to the backend ``name`` (checked by the caller) without asking Linux for AMX
    tiles: the first product that would run on them asks (:c:func:`on_amx`)."""
    global _kernel, _amx_mode, _choice
    _choice = name
    _kernel = _cpu_bf16 and name != "fallback"
    _amx_mode = (AMX_ALL if name == "amx" else
                 AMX_SIZED if name == "auto" and _cpu_amx else AMX_NONE)


def backend() -> str:
    """What the bfloat16 products run on now: ``"amx"`` (under ``"auto"``, the products past
    the size rule; the others on AVX512-BF16), ``"avx512_bf16"`` or ``"fallback"``."""
    if not _kernel:
        return "fallback"
    return "amx" if _amx_mode != AMX_NONE and sn_amx_status() == SN_AMX_OK else "avx512_bf16"


def capabilities() -> dict:
    """The paths sparknet's matrix products take on this CPU:

    ``{"fp32": "avx512" | "blas", "bf16": "amx" | "avx512_bf16" | None, "amx": str,
    "cpu": cpu_features()}``: float32 products of dense and convolution layers on the
    built-in AVX-512 kernel or on the BLAS (:func:`sparknet._conv.set_gemm_backend`);
    bfloat16 products as :func:`backend` (None when ``precision="bf16"`` falls back to
    float32); ``"amx"`` says whether AMX tiles run products and if not, why.
    """
    import sparknet._conv as _conv
    name = backend()
    if name == "amx":
        amx = ("on: every bfloat16 product" if _amx_mode == AMX_ALL
               else "on: the larger bfloat16 products (the small ones run on AVX512-BF16)")
    elif not _cpu_amx or amx_status() != "ok":
        amx = f"off: {amx_status()}"
    else:
        amx = f"off: set_backend({_choice!r})"
    return {"fp32": _conv.gemm_backend(), "bf16": None if name == "fallback" else name,
            "amx": amx, "cpu": cpu_features()}


def _backend_from_environment() -> str:
    """The backend ``SPARKNET_BF16`` names (``"auto"`` when unset, unknown, or not available)."""
    value = os.environ.get("SPARKNET_BF16", "").strip().lower()
    if value in FALLBACK_VALUES:
        return "fallback"
    if value in ("amx", "avx512_bf16") and value in available_backends():
        return value
    return "auto"


_apply(_backend_from_environment())


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
                raise RuntimeError("the bfloat16 kernel is off (see sparknet._bf16.backend())")
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
    packed for :func:`gemm_packed` (needs the bfloat16 kernels on: :func:`backend` is not
    ``"fallback"``)."""
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


cdef void pack_part(const float* src, Py_ssize_t ld, bint trans, Py_ssize_t K, Py_ssize_t N,
                    Py_ssize_t lo, Py_ssize_t hi, int32_t* out) noexcept nogil:
    if K > 0 and N > 0 and hi > lo:
        sn_bf16_pack_b_part(K, N, src, 0, ld, trans, lo, hi, out)


cdef int gemm_packed(bint trans_a, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* A,
                     Py_ssize_t lda, const int32_t* Bp, float* C, Py_ssize_t ldc,
                     bint accumulate) noexcept nogil:
    return product(M, N, K, A, 0, lda, trans_a, Bp, C, ldc, accumulate)


cdef int gemm(bint trans_a, bint trans_b, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
              const float* A, Py_ssize_t lda, const float* B, Py_ssize_t ldb, float* C,
              Py_ssize_t ldc, bint accumulate) noexcept nogil:
    return product_of(M, N, K, A, 0, lda, trans_a, B, 0, ldb, trans_b, C, ldc, accumulate)


cdef int product(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, bint a_bf16,
                 Py_ssize_t lda, bint trans_a, const int32_t* Bp, float* C, Py_ssize_t ldc,
                 bint accumulate) noexcept nogil:
    """C (M, N) (+)= op(A) @ B, B packed: on AMX tiles or AVX512-BF16 (:func:`on_amx`)."""
    if on_amx(M, N, K):
        return sn_amx_gemm_packed(M, N, K, A, a_bf16, lda, trans_a, Bp, C, ldc, accumulate)
    return sn_bf16_gemm_packed(M, N, K, A, a_bf16, lda, trans_a, Bp, C, ldc, accumulate)


cdef int product_of(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const void* A, bint a_bf16,
                    Py_ssize_t lda, bint trans_a, const void* B, bint b_bf16, Py_ssize_t ldb,
                    bint trans_b, float* C, Py_ssize_t ldc, bint accumulate) noexcept nogil:
    """The same with op(B) packed here for this one product; -1 if out of memory."""
    cdef int32_t* bp
    cdef int rc
    if M <= 0 or N <= 0:
        return 0
    bp = <int32_t*>malloc(sn_bf16_packed_bytes(K, N))
    if bp == NULL:
        return -1
    sn_bf16_pack_b(K, N, B, b_bf16, ldb, trans_b, bp)
    rc = product(M, N, K, A, a_bf16, lda, trans_a, bp, C, ldc, accumulate)
    free(bp)
    return rc


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
            rc = product_of(M, N, K, ap, a16, lda, trans_a, bp, b16, ldb, trans_b, &C[0, 0],
                            C.shape[1], accumulate)
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
    ``X`` float32 or bfloat16 bits.  Needs the bfloat16 kernels on."""
    A = _operand(X, "A")
    cdef Py_ssize_t M = A.shape[1] if trans_a else A.shape[0]
    cdef Py_ssize_t K = A.shape[0] if trans_a else A.shape[1]
    if K != Bp.K or C.shape[0] != M or C.shape[1] != Bp.N:
        raise ValueError(f"bf16 gemm shape mismatch: op(A) is ({M}, {K}), B is ({Bp.K}, {Bp.N}), "
                         f"C is ({C.shape[0]}, {C.shape[1]})")
    if not _kernel:
        raise RuntimeError("the bfloat16 kernel is off (see sparknet._bf16.backend())")
    cdef int rc = 0
    cdef bint a16 = A.dtype == np.uint16
    cdef Py_ssize_t lda = A.shape[1]
    cdef const void* ap = <const void*><size_t>A.ctypes.data
    if M == 0 or Bp.N == 0:
        return
    with nogil:
        rc = product(M, Bp.N, K, ap, a16, lda, trans_a, Bp.data, &C[0, 0], C.shape[1],
                     accumulate)
    if rc != 0:
        raise MemoryError()

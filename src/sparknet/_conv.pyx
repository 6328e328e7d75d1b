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

The column matrix never exists whole.  Rows are processed in chunks sized for the L2
cache: the forward pass builds a chunk of columns and multiplies it at once; the
backward pass builds the same chunk again, adds its share of ``dWt`` and produces and
scatters back its column gradients while they are hot.  Rebuilding a chunk costs far
less than writing the whole column matrix to main memory and reading it back.  A 1x1
convolution with stride 1 and no padding skips im2col: ``X`` itself is the column matrix.

float32 GEMMs run on the AVX-512 kernel of ``csrc/sgemm_avx512.h`` when the CPU has
AVX-512 (:func:`set_gemm_backend` switches to BLAS); float64 always uses BLAS.  In float32
the three products may take bfloat16 operands with float32 accumulation
(:mod:`sparknet._bf16`, ``precision="bf16"``): the forward given the kernel packed
(``w16``), the backward given ``bf16=True`` and the kernel's transpose packed (``wt16``).
"""
from cython cimport floating
from libc.stdint cimport int32_t, uint16_t
from libc.string cimport memcpy, memset
from posix.time cimport clock_gettime, timespec, CLOCK_THREAD_CPUTIME_ID
from sparknet._blas cimport gemm
from sparknet._bf16 cimport PackedB
from sparknet._bf16 cimport gemm as bf16_gemm, gemm_packed as bf16_gemm_packed
from sparknet._bf16 cimport product as bf16_product, product_of as bf16_product_of
from sparknet._activations cimport act_forward_row, act_backward_row, ACT_IDENTITY, ACT_RELU
from sparknet import _dense

cdef extern from "conv_kernels.h" nogil:
    void sn_bias_relu_f(float* y, const float* b, Py_ssize_t rows, Py_ssize_t F, int relu)
    void sn_bias_relu_d(double* y, const double* b, Py_ssize_t rows, Py_ssize_t F, int relu)
    void sn_relu_grad_bias_grad_f(const float* y, float* d, float* db, Py_ssize_t rows,
                                  Py_ssize_t F, int relu)
    void sn_relu_grad_bias_grad_d(const double* y, double* d, double* db, Py_ssize_t rows,
                                  Py_ssize_t F, int relu)


cdef extern from "bf16_gemm.h" nogil:
    void sn_im2col_rows_bf16(const float* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                             Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                             Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                             Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1,
                             uint16_t* dst)


cdef extern from "sgemm_avx512.h" nogil:
    int sn_cpu_has_avx512()
    void sn_sgemm_avx512(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* A,
                         Py_ssize_t ars, Py_ssize_t aps, const float* B, Py_ssize_t ldb,
                         float* C, Py_ssize_t ldc, int accumulate, Py_ssize_t kc_max)
    void sn_im2col_rows_avx512(const float* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                               Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                               Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                               Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1,
                               float* dst)
    void sn_col2im_rows_avx512(float* dX, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                               Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                               Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                               Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1,
                               const float* src)

# float32 GEMMs go to the AVX-512 kernel of csrc/sgemm_avx512.h when the CPU has AVX-512
# (it is tuned for these skinny shapes and does not depend on how BLAS was built);
# float64 and other CPUs use BLAS.
cdef bint _have_avx512 = sn_cpu_has_avx512() != 0
cdef bint _own_gemm = _have_avx512


def set_gemm_backend(str name):
    """Choose the float32 kernels: ``"auto"`` (the AVX-512 GEMM, im2col and col2im when
    the CPU has AVX-512, else as ``"blas"``) or ``"blas"`` (BLAS GEMM and portable C
    loops), for convolutions and dense layers (:func:`sparknet._dense.set_gemm_backend`).
    Returns the backend now in use (``"avx512"`` or ``"blas"``)."""
    global _own_gemm
    if name not in ("auto", "blas"):
        raise ValueError(f"gemm backend must be 'auto' or 'blas', got {name!r}")
    _own_gemm = _have_avx512 and name == "auto"
    _dense.set_gemm_backend(name)
    return gemm_backend()


def gemm_backend():
    """``"avx512"`` or ``"blas"``: what float32 convolutions use now."""
    return "avx512" if _own_gemm else "blas"


cdef inline int _gemm_nn(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const floating* A,
                         Py_ssize_t lda, const floating* B, Py_ssize_t ldb, floating* C,
                         Py_ssize_t ldc, const int32_t* b16=NULL) noexcept nogil:
    """``C = A @ B`` (row-major, overwritten); with ``b16`` (B packed) in bfloat16.  Returns
    -1 when out of memory."""
    if floating is float:
        if b16 != NULL:
            return bf16_gemm_packed(False, M, N, K, A, lda, b16, C, ldc, False)
        if _own_gemm:
            sn_sgemm_avx512(M, N, K, A, lda, 1, B, ldb, C, ldc, 0, 1024)
            return 0
    gemm(False, False, <int>M, <int>N, <int>K, <floating>1, A, <int>lda, B, <int>ldb,
         <floating>0, C, <int>ldc)
    return 0


cdef inline int _gemm_tn(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const floating* A,
                         Py_ssize_t lda, const floating* B, Py_ssize_t ldb, floating* C,
                         Py_ssize_t ldc, bint accumulate, bint bf16=False) noexcept nogil:
    """``C = A.T @ B`` (or ``C += A.T @ B``) with A stored (K, M), row-major; in bfloat16
    when ``bf16``.  Returns -1 when out of memory."""
    if floating is float:
        if bf16:
            return bf16_gemm(True, False, M, N, K, A, lda, B, ldb, C, ldc, accumulate)
        if _own_gemm:
            sn_sgemm_avx512(M, N, K, A, 1, lda, B, ldb, C, ldc, accumulate, 128)
            return 0
    gemm(True, False, <int>M, <int>N, <int>K, <floating>1, A, <int>lda, B, <int>ldb,
         <floating>1 if accumulate else <floating>0, C, <int>ldc)
    return 0


cdef inline int _gemm_nt(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const floating* A,
                         Py_ssize_t lda, const floating* B, Py_ssize_t ldb,
                         const floating* BT, floating* C, Py_ssize_t ldc,
                         const int32_t* bt16=NULL) noexcept nogil:
    """``C = A @ B.T`` with B stored (N, K); ``BT`` is the same matrix transposed, (K, N)
    row-major (the AVX-512 kernel reads it); with ``bt16`` (B.T packed) in bfloat16.
    Returns -1 when out of memory."""
    if floating is float:
        if bt16 != NULL:
            return bf16_gemm_packed(False, M, N, K, A, lda, bt16, C, ldc, False)
        if _own_gemm:
            sn_sgemm_avx512(M, N, K, A, lda, 1, BT, N, C, ldc, 0, 1024)
            return 0
    gemm(False, True, <int>M, <int>N, <int>K, <floating>1, A, <int>lda, B, <int>ldb,
         <floating>0, C, <int>ldc)
    return 0


cdef inline void _bias_act(floating* y, const floating* b, Py_ssize_t rows, Py_ssize_t F,
                           int act) noexcept nogil:
    """Rows x F in place: y + b (b may be NULL), then the activation."""
    cdef Py_ssize_t i, j
    if act == ACT_IDENTITY or act == ACT_RELU:
        if floating is float:
            sn_bias_relu_f(y, b, rows, F, act == ACT_RELU)
        else:
            sn_bias_relu_d(y, b, rows, F, act == ACT_RELU)
        return
    for i in range(rows):
        if b != NULL:
            for j in range(F):
                y[j] = y[j] + b[j]
        act_forward_row(act, y, F)
        y += F


cdef inline void _act_grad_bias_grad(const floating* y, floating* d, floating* db,
                                     Py_ssize_t rows, Py_ssize_t F, int act) noexcept nogil:
    """``d <- d * act'`` (through the output y), then ``db = d.sum(0)`` if db is not NULL."""
    cdef Py_ssize_t i, j
    if act == ACT_IDENTITY or act == ACT_RELU:
        if floating is float:
            sn_relu_grad_bias_grad_f(y, d, db, rows, F, act == ACT_RELU)
        else:
            sn_relu_grad_bias_grad_d(y, d, db, rows, F, act == ACT_RELU)
        return
    if db != NULL:
        for j in range(F):
            db[j] = 0
    for i in range(rows):
        act_backward_row(act, y + i * F, d + i * F, F)
        if db != NULL:
            for j in range(F):
                db[j] = db[j] + d[i * F + j]

# Bytes of column buffer processed per chunk: small enough to stay in the L2 cache between
# im2col and GEMM (or GEMM and col2im), large enough for the GEMM to run at full speed.
cdef Py_ssize_t _chunk_bytes = 1 << 20


def set_chunk_bytes(Py_ssize_t nbytes):
    """Set the column-chunk size in bytes (a tuning knob; returns the previous value)."""
    global _chunk_bytes
    old = _chunk_bytes
    if nbytes < 1:
        raise ValueError(f"chunk size must be positive, got {nbytes}")
    _chunk_bytes = nbytes
    return old


# --------------------------------------------------------------------------- profiling
# CPU seconds of the calling thread spent per phase, accumulated while profiling is on
# (benchmarks only; thread CPU time is robust to other processes sharing the machine).
DEF N_PHASES = 7
PHASES = ("im2col", "gemm_forward", "bias_activation", "activation_grad_bias_grad",
          "gemm_weight_grad", "gemm_input_grad", "col2im")
cdef double _prof[N_PHASES]
cdef bint _profiling = False


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec + 1e-9 * ts.tv_nsec


cdef inline double _tick(int phase, double t0) noexcept nogil:
    """Add the time since ``t0`` to ``phase`` (when profiling); return the current time."""
    cdef double t
    if not _profiling:
        return 0
    t = _now()
    _prof[phase] += t - t0
    return t


def set_profiling(bint on):
    """Turn per-phase timing of the conv kernels on or off (and reset the counters)."""
    global _profiling
    cdef int i
    _profiling = on
    for i in range(N_PHASES):
        _prof[i] = 0


def profile():
    """Seconds spent per phase since :func:`set_profiling` (``PHASES`` order, as a dict)."""
    return {PHASES[i]: _prof[i] for i in range(N_PHASES)}


cdef inline Py_ssize_t _chunk_rows(Py_ssize_t K, Py_ssize_t itemsize, Py_ssize_t P,
                                   Py_ssize_t buffers) noexcept nogil:
    """Rows per chunk so that ``buffers`` chunk buffers of K columns fit the budget."""
    cdef Py_ssize_t r = _chunk_bytes // (buffers * K * itemsize)
    if r < 64:
        r = 64
    if r > P:
        r = P
    return r


cdef extern from "conv_kernels.h" nogil:
    void sn_im2col_rows_f(const float* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                          Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                          Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                          Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1, float* dst)
    void sn_im2col_rows_d(const double* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                          Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                          Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                          Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1, double* dst)
    void sn_col2im_rows_f(float* dX, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                          Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                          Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                          Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1,
                          const float* src)
    void sn_col2im_rows_d(double* dX, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                          Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                          Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                          Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t r0, Py_ssize_t r1,
                          const double* src)


cdef inline void _im2col_rows(const floating* X, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                              Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                              Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                              Py_ssize_t dh, Py_ssize_t dw,
                              Py_ssize_t r0, Py_ssize_t r1, floating* dst) noexcept nogil:
    """Write column rows ``r0 <= p < r1`` to ``dst`` (row ``r0`` first)."""
    if floating is float:
        if _own_gemm:
            sn_im2col_rows_avx512(X, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, dst)
        else:
            sn_im2col_rows_f(X, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, dst)
    else:
        sn_im2col_rows_d(X, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, dst)


cdef inline void _col2im_rows(floating* dX, Py_ssize_t H, Py_ssize_t W, Py_ssize_t C,
                              Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t KH, Py_ssize_t KW,
                              Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                              Py_ssize_t dh, Py_ssize_t dw,
                              Py_ssize_t r0, Py_ssize_t r1, const floating* src) noexcept nogil:
    """Add column rows ``r0 <= p < r1`` (``src``, row ``r0`` first) into ``dX``."""
    if floating is float:
        if _own_gemm:
            sn_col2im_rows_avx512(dX, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, src)
        else:
            sn_col2im_rows_f(dX, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, src)
    else:
        sn_col2im_rows_d(dX, H, W, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, src)


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
            const floating[::1] b, floating[:, :, :, ::1] Y,
            int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1,
            int act=ACT_IDENTITY, PackedB w16=None):
    """``Y[...] = act(conv(X, Wt) + b)``.

    Args:
        X: input ``(N, H, W, C)``.
        Wt: kernel ``(KH, KW, C, F)``.
        b: bias ``(F,)`` or None.
        Y: output ``(N, OH, OW, F)``, overwritten.
        sh, sw, ph, pw, dh, dw: strides, zero paddings (top/left; the bottom/right
            padding is whatever the output size implies) and dilations.
        act: activation id (``sparknet.activations.activation_id``), fused.
        w16: ``Wt`` as the matrix (K, F) packed by :func:`sparknet._bf16.pack` (float32
            only): the product then takes bfloat16 operands.
    """
    cdef Py_ssize_t N, H, W_, C, KH, KW, F, OH, OW
    N, H, W_, C, KH, KW, F, OH, OW = _check_shapes(X, Wt, Y, sh, sw, ph, pw, dh, dw)
    cdef Py_ssize_t P = N * OH * OW, K = KH * KW * C
    if w16 is not None and (floating is double or w16.K != K or w16.N != F or w16.trans):
        raise ValueError(f"conv: w16 must be the kernel as a ({K}, {F}) matrix, packed (float32)")
    cdef const int32_t* w16p = w16.data if w16 is not None else NULL
    cdef int rc = 0
    cdef bint direct = _is_direct(KH, KW, sh, sw, ph, pw)
    cdef bint has_b = b is not None
    if has_b and b.shape[0] != F:
        raise ValueError(f"conv: bias has {b.shape[0]} entries for {F} filters")
    if P == 0 or F == 0:
        return
    cdef Py_ssize_t chunk = _chunk_rows(K, sizeof(floating), P, 1)
    cdef floating[:, ::1] scratch
    cdef uint16_t[:, ::1] scratch16
    cdef floating* cbase = NULL
    cdef uint16_t* c16 = NULL
    # bf16 products: the columns written in bfloat16 (what the product reads), half the bytes
    cdef bint cols16 = floating is float and w16p != NULL and not direct
    if not direct:
        import numpy as np
        if cols16:
            scratch16 = np.empty((chunk, K), dtype=np.uint16)
            c16 = &scratch16[0, 0]
        else:
            scratch = np.empty((chunk, K), dtype=np.float32 if floating is float else np.float64)
            cbase = &scratch[0, 0]
    cdef const floating* xp = &X[0, 0, 0, 0]
    cdef floating* yp = &Y[0, 0, 0, 0]
    cdef const floating* wp = &Wt[0, 0, 0, 0]
    cdef const floating* bp = &b[0] if has_b else NULL
    cdef Py_ssize_t r0, r1
    cdef floating* c
    cdef double t = _now() if _profiling else 0
    with nogil:
        r0 = 0
        while r0 < P:
            r1 = r0 + chunk if r0 + chunk < P else P
            if cols16:
                sn_im2col_rows_bf16(<const float*>xp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw,
                                    dh, dw, r0, r1, c16)
                t = _tick(0, t)
                rc |= bf16_product(r1 - r0, F, K, c16, True, K, False, w16p,
                                   <float*>yp + r0 * F, F, False)
            else:
                if direct:
                    c = <floating*>xp + r0 * K
                else:
                    c = cbase
                    _im2col_rows(xp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1, c)
                    t = _tick(0, t)
                rc |= _gemm_nn(r1 - r0, F, K, c, K, wp, F, yp + r0 * F, F, w16p)
            t = _tick(1, t)
            _bias_act(yp + r0 * F, bp, r1 - r0, F, act)
            t = _tick(2, t)
            r0 = r1
    if rc != 0:
        raise MemoryError()


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
             floating[:, :, :, ::1] dX, floating[:, :, :, ::1] dW, floating[::1] db,
             int sh=1, int sw=1, int ph=0, int pw=0, int dh=1, int dw=1,
             int act=ACT_IDENTITY, bint bf16=False, PackedB wt16=None):
    """Backward pass of :func:`forward`; gradients are overwritten, never accumulated.

    The columns of ``X`` are rebuilt chunk by chunk (as in the forward pass) rather than
    kept: a chunk is built in the L2 cache, used for its share of the weight gradient,
    and the same rows' input gradient is produced and scattered back (col2im) while
    they are hot.  No column matrix of the whole batch ever reaches main memory.

    Args:
        X, Wt, Y: the forward input, kernel and output.
        dY: gradient w.r.t. ``Y``; overwritten with ``dZ = dY * act'``.
        dX: gradient w.r.t. ``X`` (same shape), or None to skip it.
        dW: gradient w.r.t. ``Wt`` (same shape).
        db: gradient w.r.t. the bias, or None.
        bf16: the products take bfloat16 operands (float32 only); ``wt16`` is then the
            kernel's transpose, (F, K), packed (needed when ``dX`` is not None).
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
    if bf16 and (floating is double or (has_dx and (wt16 is None or wt16.K != F
                                                    or wt16.N != KH * KW * C or not wt16.trans))):
        raise ValueError("conv backward: bf16 needs float32 and, for dX, the kernel's "
                         "transpose packed as wt16")
    cdef const int32_t* wt16p = wt16.data if bf16 and has_dx else NULL
    cdef int rc = 0
    cdef floating* dwp = &dW[0, 0, 0, 0] if K * F > 0 else NULL
    cdef Py_ssize_t j
    if P == 0 or F == 0 or K == 0:
        with nogil:
            if has_db:
                for j in range(F):
                    db[j] = 0
            if K * F > 0:
                memset(dwp, 0, K * F * sizeof(floating))
            if has_dx and N * H * W_ * C > 0:
                memset(&dX[0, 0, 0, 0], 0, N * H * W_ * C * sizeof(floating))
        return
    import numpy as np
    dtype = np.float32 if floating is float else np.float64
    # two chunk buffers (columns, column gradients) share the cache budget
    cdef Py_ssize_t chunk = _chunk_rows(K, sizeof(floating), P, 2)
    cdef floating[:, ::1] cols_buf, dcols_buf, wt_t
    cdef uint16_t[:, ::1] cols16_buf
    cdef floating* cbase = NULL
    cdef floating* dcbase = NULL
    cdef uint16_t* c16 = NULL
    # bf16 products: the columns written in bfloat16, as in the forward
    cdef bint cols16 = floating is float and bf16 and not direct
    if not direct:
        if cols16:
            cols16_buf = np.empty((chunk, K), dtype=np.uint16)
            c16 = &cols16_buf[0, 0]
        else:
            cols_buf = np.empty((chunk, K), dtype=dtype)
            cbase = &cols_buf[0, 0]
        if has_dx:
            dcols_buf = np.empty((chunk, K), dtype=dtype)
            dcbase = &dcols_buf[0, 0]
    # the kernel transposed, (F, K), for the AVX-512 GEMM of the input gradient
    cdef const floating* wtp = NULL
    if has_dx and not bf16:
        wt_t = np.ascontiguousarray(np.asarray(Wt).reshape(K, F).T)
        wtp = &wt_t[0, 0]
    cdef const floating* xp = &X[0, 0, 0, 0]
    cdef const floating* wp = &Wt[0, 0, 0, 0]
    cdef floating* dzp = &dY[0, 0, 0, 0]
    cdef floating* dxp = &dX[0, 0, 0, 0] if has_dx else NULL
    cdef Py_ssize_t r0, r1
    cdef const floating* c
    cdef double t = _now() if _profiling else 0
    with nogil:
        _act_grad_bias_grad(&Y[0, 0, 0, 0], dzp, &db[0] if has_db else NULL, P, F, act)
        t = _tick(3, t)
        if has_dx and not direct:
            memset(dxp, 0, N * H * W_ * C * sizeof(floating))
            t = _tick(6, t)
        r0 = 0
        while r0 < P:
            r1 = r0 + chunk if r0 + chunk < P else P
            if cols16:
                sn_im2col_rows_bf16(<const float*>xp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw,
                                    dh, dw, r0, r1, c16)
                t = _tick(0, t)
                # dW (K, F) (+)= cols^T (K, rows) @ dZ (rows, F)
                rc |= bf16_product_of(K, F, r1 - r0, c16, True, K, True,
                                      <const float*>dzp + r0 * F, False, F, False, <float*>dwp,
                                      F, r0 > 0)
            else:
                if direct:
                    c = xp + r0 * K
                else:
                    _im2col_rows(xp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, r0, r1,
                                 cbase)
                    c = cbase
                    t = _tick(0, t)
                # dW (K, F) (+)= cols^T (K, rows) @ dZ (rows, F)
                rc |= _gemm_tn(K, F, r1 - r0, c, K, dzp + r0 * F, F, dwp, F, r0 > 0, bf16)
            t = _tick(4, t)
            if has_dx:
                if direct:
                    # dX rows (rows, C) = dZ (rows, F) @ Wt^T (F, C)
                    rc |= _gemm_nt(r1 - r0, K, F, dzp + r0 * F, F, wp, F, wtp, dxp + r0 * K, K,
                                   wt16p)
                    t = _tick(5, t)
                else:
                    # dcols (rows, K) = dZ (rows, F) @ Wt^T (F, K), then scattered back
                    rc |= _gemm_nt(r1 - r0, K, F, dzp + r0 * F, F, wp, F, wtp, dcbase, K, wt16p)
                    t = _tick(5, t)
                    _col2im_rows(dxp, H, W_, C, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw,
                                 r0, r1, dcbase)
                    t = _tick(6, t)
            r0 = r1
    if rc != 0:
        raise MemoryError()

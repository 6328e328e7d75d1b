# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fully connected layer kernels: ``Y = f(X W^T + b)`` and its backward pass.

Shapes (row-major): X (N, I), W (O, I) as in ``torch.nn.Linear``, b (O,), Y (N, O).
Bias and activation are fused into one pass over Y after the GEMM; the
backward fuses the activation derivative with the bias-gradient column sum.
The gelus' derivative needs the pre-activation ``Z = X W^T + b`` (``act_needs_input``):
the forward then also writes Z, and the backward reads it.

In float32 the three products may run in bfloat16 with float32 accumulation
(:mod:`sparknet._bf16`, ``precision="bf16"``): the forward given ``W.T`` packed (``wt16``),
the backward given ``bf16=True`` and ``W`` packed (``w16``, for ``dX``).

Float32 products of weights up to 2^21 floats (8 MiB) run on the AVX-512 kernel of
``csrc/sgemm_avx512.h`` when the CPU has AVX-512 (the forward hands it ``W.T``, transposed
per call in registers into scratch space the thread keeps: 0.06 ms for a 512 x 784 weight),
and on the BLAS for larger weights, elsewhere and in float64; :func:`set_gemm_backend`
chooses.  On the MLP's shapes the kernel runs at twice the rate of OpenBLAS' Haswell
kernels (``benchmarks/README.md``).
"""
from cython cimport floating
from libc.string cimport memcpy
from sparknet._blas cimport gemm
from sparknet._bf16 cimport PackedB
from sparknet._bf16 cimport gemm as bf16_gemm, gemm_packed as bf16_gemm_packed
from sparknet._activations cimport (act_forward_row, act_backward_row, act_backward_input_row,
                                    act_needs_input, ACT_IDENTITY, ACT_SOFTMAX)

cdef extern from "sgemm_avx512.h" nogil:
    int sn_cpu_has_avx512()
    void sn_sgemm_avx512(Py_ssize_t M, Py_ssize_t N, Py_ssize_t K, const float* A,
                         Py_ssize_t ars, Py_ssize_t aps, const float* B, Py_ssize_t ldb,
                         float* C, Py_ssize_t ldc, int accumulate, Py_ssize_t kc_max)
    void sn_transpose_avx512(Py_ssize_t rows, Py_ssize_t cols, const float* src,
                             Py_ssize_t lds, float* dst, Py_ssize_t ldd)
    size_t SN_SCRATCH_KEEP
    float* sn_scratch_f32(size_t n)

cdef bint _have_avx512 = sn_cpu_has_avx512() != 0
cdef bint _own_gemm = _have_avx512
# Weights up to the scratch a thread keeps (SN_SCRATCH_KEEP, 2^21 floats) take the built-in
# product.  Larger ones stay on the BLAS: their forward would need a second copy of W (a
# model-parallel block sized to its executor's memory would not fit twice), and the kernel
# reads B by rows in place, which a BLAS that packs its panels does better at long strides.
cdef Py_ssize_t _OWN_MAX = <Py_ssize_t>SN_SCRATCH_KEEP


def set_gemm_backend(str name):
    """Choose the float32 products: ``"auto"`` (the AVX-512 kernel when the CPU has AVX-512,
    else as ``"blas"``) or ``"blas"``.  Returns the backend now in use (``"avx512"`` or
    ``"blas"``).  :func:`sparknet._conv.set_gemm_backend` sets this one too."""
    global _own_gemm
    if name not in ("auto", "blas"):
        raise ValueError(f"gemm backend must be 'auto' or 'blas', got {name!r}")
    _own_gemm = _have_avx512 and name == "auto"
    return gemm_backend()


def gemm_backend():
    """``"avx512"`` or ``"blas"``: what float32 dense layers use now."""
    return "avx512" if _own_gemm else "blas"


def forward(const floating[:, ::1] X, const floating[:, ::1] W, const floating[::1] b,
            floating[:, ::1] Y, int act=ACT_IDENTITY, floating[:, ::1] Z=None,
            PackedB wt16=None):
    """``Y[...] = act(X @ W.T + b)``; ``b`` may be None.  ``Z`` (N, O), when given, gets
    the pre-activation ``X @ W.T + b`` (needed for the gelus' backward).  With ``wt16``
    (``W.T`` packed, float32 only) the product takes bfloat16 operands."""
    cdef Py_ssize_t N = X.shape[0], I = X.shape[1], O = W.shape[0]
    cdef Py_ssize_t i, j
    cdef bint has_b = b is not None
    cdef bint has_z = Z is not None
    cdef floating* y
    if W.shape[1] != I or Y.shape[0] != N or Y.shape[1] != O or (has_b and b.shape[0] != O):
        raise ValueError("dense forward: shape mismatch")
    if has_z and (Z.shape[0] != N or Z.shape[1] != O):
        raise ValueError("dense forward: Z must have the shape of Y")
    cdef bint bf16 = wt16 is not None
    if bf16 and (floating is double or wt16.K != I or wt16.N != O or not wt16.trans):
        raise ValueError("dense forward: wt16 must be W.T packed (float32)")
    cdef int rc = 0
    cdef float* wt
    if N == 0 or O == 0:
        return
    with nogil:
        if I == 0:
            for i in range(N):
                for j in range(O):
                    Y[i, j] = 0
        elif floating is float and bf16:
            # Y (N, O) = X (N, I) @ W^T (I, O), bfloat16 operands
            rc = bf16_gemm_packed(False, N, O, I, &X[0, 0], I, wt16.data, &Y[0, 0], O, False)
        elif floating is float and _own_gemm and I * O <= _OWN_MAX:
            # the kernel reads B by rows: W.T, in this thread's scratch space
            wt = sn_scratch_f32(I * O)
            if wt == NULL:
                rc = -1
            else:
                sn_transpose_avx512(O, I, &W[0, 0], I, wt, O)
                sn_sgemm_avx512(N, O, I, &X[0, 0], I, 1, wt, O, &Y[0, 0], O, 0, 1024)
        else:
            gemm(False, True, <int>N, <int>O, <int>I, <floating>1, &X[0, 0], <int>I,
                 &W[0, 0], <int>I, <floating>0, &Y[0, 0], <int>O)
        for i in range(N):
            y = &Y[i, 0]
            if has_b:
                for j in range(O):
                    y[j] = y[j] + b[j]
            if has_z:
                memcpy(&Z[i, 0], y, O * sizeof(floating))
            if act != ACT_IDENTITY:
                act_forward_row(act, y, O)
    if rc != 0:
        raise MemoryError()


def backward(const floating[:, ::1] X, const floating[:, ::1] W, const floating[:, ::1] Y,
             floating[:, ::1] dY, floating[:, ::1] dX, floating[:, ::1] dW, floating[::1] db,
             int act=ACT_IDENTITY, const floating[:, ::1] Z=None, bint bf16=False,
             PackedB w16=None):
    """Backward pass of :func:`forward`.

    ``dY`` is overwritten with the pre-activation gradient dZ = dY * act'(.), written
    through ``Y``, or through the forward's ``Z`` for the gelus (then required).
    Then ``dW = dZ.T @ X``, ``db = dZ.sum(0)`` (if ``db`` is not None) and
    ``dX = dZ @ W`` (if ``dX`` is not None); gradients are overwritten.
    With ``bf16`` (float32 only) the products take bfloat16 operands; ``w16`` is then ``W``
    packed (needed when ``dX`` is not None).
    """
    cdef Py_ssize_t N = X.shape[0], I = X.shape[1], O = W.shape[0]
    cdef Py_ssize_t i, j
    cdef bint has_db = db is not None
    cdef bint has_dx = dX is not None
    cdef floating* d
    if (dY.shape[0] != N or dY.shape[1] != O or dW.shape[0] != O or dW.shape[1] != I
            or (has_db and db.shape[0] != O) or (has_dx and (dX.shape[0] != N or dX.shape[1] != I))):
        raise ValueError("dense backward: shape mismatch")
    cdef bint from_z = act_needs_input(act)
    if from_z and (Z is None or Z.shape[0] != N or Z.shape[1] != O):
        raise ValueError("dense backward: this activation needs the forward's pre-activation Z "
                         "(N, O); pass the Z that forward filled")
    if bf16 and (floating is double or (has_dx and (w16 is None or w16.K != O or w16.N != I
                                                    or w16.trans))):
        raise ValueError("dense backward: bf16 needs float32 and, for dX, W packed as w16")
    cdef int rc = 0
    with nogil:
        if has_db:
            for j in range(O):
                db[j] = 0
        for i in range(N):
            d = &dY[i, 0]
            if from_z:
                act_backward_input_row(act, &Z[i, 0], d, O)
            elif act != ACT_IDENTITY:
                act_backward_row(act, &Y[i, 0], d, O)
            if has_db:
                for j in range(O):
                    db[j] = db[j] + d[j]
        if N == 0:
            for i in range(O):
                for j in range(I):
                    dW[i, j] = 0
        elif O > 0 and I > 0:
            # dW (O, I) = dZ^T (O, N) @ X (N, I)
            if floating is float and bf16:
                rc = bf16_gemm(True, False, O, I, N, &dY[0, 0], O, &X[0, 0], I, &dW[0, 0], I,
                               False)
            elif floating is float and _own_gemm and I * O <= _OWN_MAX:
                sn_sgemm_avx512(O, I, N, &dY[0, 0], 1, O, &X[0, 0], I, &dW[0, 0], I, 0, 256)
            else:
                gemm(True, False, <int>O, <int>I, <int>N, <floating>1, &dY[0, 0], <int>O,
                     &X[0, 0], <int>I, <floating>0, &dW[0, 0], <int>I)
        if has_dx and N > 0 and I > 0:
            if O == 0:
                for i in range(N):
                    for j in range(I):
                        dX[i, j] = 0
            else:
                # dX (N, I) = dZ (N, O) @ W (O, I)
                if floating is float and bf16:
                    rc = rc | bf16_gemm_packed(False, N, I, O, &dY[0, 0], O, w16.data, &dX[0, 0],
                                               I, False)
                elif floating is float and _own_gemm and I * O <= _OWN_MAX:
                    sn_sgemm_avx512(N, I, O, &dY[0, 0], O, 1, &W[0, 0], I, &dX[0, 0], I, 0, 1024)
                else:
                    gemm(False, False, <int>N, <int>I, <int>O, <floating>1, &dY[0, 0], <int>O,
                         &W[0, 0], <int>I, <floating>0, &dX[0, 0], <int>I)
    if rc != 0:
        raise MemoryError()

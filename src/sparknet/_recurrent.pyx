# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""What the recurrent kernels share: the simple RNN (:mod:`sparknet._rnn`) and the LSTM
(:mod:`sparknet._lstm`) run the same products, layout and steps around their time loops,
declared in ``_recurrent.pxd`` and defined once here.

Everything runs with the GIL released, in float32 or float64 (Cython's ``floating``).

Layout.  The caller's input is batch-major ``x (N, T, F)``.  Inside, the kernels work
time-major: ``x`` is transposed once into ``xt (T, N, F)`` so that

* the input projection of *all* time steps is ONE gemm,
  ``gates (T*N, G) = xt (T*N, F) @ W_ih^T`` (``G = 4H`` for the LSTM, ``H`` for the RNN);
* the recurrent part of step ``t`` is one gemm on the batch,
  ``gates[t] (N, G) += h[t] (N, H) @ W_hh^T``, accumulated in place into the
  preallocated gate buffer;
* the gate nonlinearities, the cell update and the bias are fused in one pass per row
  (C loops with ``restrict`` pointers that the compiler vectorises; in float32 the
  sigmoid and tanh are a rational approximation, absolute error < 4e-7, float64 uses libm);
* the state buffers ``hs``/``cs`` are ``(T+1, N, H)``: ``hs[0]`` is the initial state,
  ``hs[t+1]`` the state after step ``t``.  So ``hs[0:T]`` are the previous states of every
  step, contiguous, and the backward computes ``dW_hh = dgates^T @ hs[0:T]`` with ONE gemm
  over all steps at the end (likewise ``dW_ih = dgates^T @ xt`` and ``dxt = dgates @ W_ih``).

bfloat16 (``precision="bf16"``, :mod:`sparknet._bf16`): the products of the BLAS order
above run on the bfloat16 kernel (float32 accumulation), the recurrent weights packed once
per call into bfloat16 panels like the float32 ones (``ON_BF16`` in ``_recurrent.pxd``).

Float32 on AVX-512 or AVX2 + FMA CPUs.  The products above run in the built-in kernels of
this module (8 x 32 register blocks in 16 zmm accumulators on AVX-512, 6 x 16 blocks in 12
ymm accumulators on AVX2: ``csrc/step_gemm_avx2.h``) instead of the BLAS: the recurrent
weights are packed once per call into 32-column panels and read in place by all ``T`` step
products, where a BLAS would repack them at every step; the weight gradients use the same
kernel with ``dgates`` read transposed.  Float64, other CPUs, or :func:`use_step_kernel`
(False) use the BLAS ``gemm`` for every product; :func:`step_kernel_isa` says which ran.

The LSTM on that kernel goes step by step instead (:func:`use_fused_steps`, the default):
each forward step computes ``gates[t] = x_t @ W_ih^T + h_{t-1} @ W_hh^T`` in one pass (no
``(T*N, 4H)`` projection written and read back), and each backward step writes its gate
gradients to an ``(N, 4H)`` scratch that stays in cache for the step's ``dh`` product and its
shares of ``dW_hh``, ``dW_ih`` and ``dx``.  Products over all ``T*N`` rows read ``dgates``
with a ``4H``-float row stride that maps the rows onto few cache sets, and ran at a quarter
of the kernel's rate on a 2 MiB-L2 Xeon; per step they run at its full rate.

Masks.  ``mask[n, t] == 0`` marks a padded step: the state is carried unchanged
(``h[t+1] = h[t]``, ``c[t+1] = c[t]``), the per-step output is zero, and in the backward the
incoming state gradient passes through unchanged while the step's gate gradients are zero
(so it adds nothing to any parameter or input gradient, and its output gradient is ignored).

Truncated BPTT: no gradient flows into the initial state (it is a constant of the chunk).
"""
from libc.stdlib cimport free, malloc
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset

from cython cimport floating

from sparknet._blas cimport gemm
from sparknet._bf16 cimport gemm as bf16_gemm, gemm_packed as bf16_gemm_packed, pack_alloc


cdef extern from "recurrent_kernels.h":
    float sn_tanh_f(float x) noexcept nogil
    float sn_sigm_f(float x) noexcept nogil
    void sn_sgemm_panels(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                         float* C, int ldc, int acc) noexcept nogil
    void sn_sgemm_panels_tn(int M, int Nc, int K, const float* At, int lda,
                            const float* Bp, float* C, int ldc, int acc) noexcept nogil
    void sn_sgemm_panels2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                          int K2, const float* A2, int lda2, const float* Bp2, float* C,
                          int ldc, int acc) noexcept nogil
    int sn_step_isa() noexcept nogil
    void sn_pack_panels(const float* src, int ld, int K, int Nc, float* out) noexcept nogil


# ---------------------------------------------------------------------------- the step kernel

cdef bint _own_step_kernel = True


def step_kernel_available() -> bool:
    """True when float32 recurrent steps can use the built-in products on this CPU (AVX-512,
    or AVX2 with FMA)."""
    return sn_step_isa() > 0


def step_kernel_isa() -> str | None:
    """The instruction set of the built-in float32 step products on this CPU: ``"avx512"``,
    ``"avx2"`` or None (the BLAS runs every product).  The environment variable
    ``SPARKNET_STEP_ISA=avx2`` (or ``blas``), read once per process, keeps it below the CPU's."""
    return {2: "avx512", 1: "avx2"}.get(sn_step_isa())


def use_step_kernel(bint on=True) -> bool:
    """Choose the float32 per-step product: the built-in kernel (default, when the CPU has
    AVX-512 or AVX2 with FMA) or the BLAS gemm.  Returns whether the built-in kernel is now
    used."""
    global _own_step_kernel
    _own_step_kernel = on
    return bool(on and sn_step_isa() > 0)


cdef bint own_kernel() noexcept nogil:
    return _own_step_kernel and sn_step_isa() > 0


cdef bint _fused_steps = True


def use_fused_steps(bint on=True) -> bool:
    """Choose how the built-in kernel orders the LSTM's products: one step at a time (default:
    the input projection joins each step's recurrent product, and the weight and input
    gradients accumulate inside the backward's time loop while the step's gate gradients are
    in cache) or whole sequences (one product over all ``T*N`` rows before the forward loop
    and after the backward loop).  Returns the new setting."""
    global _fused_steps
    _fused_steps = on
    return bool(on)


cdef bint fused_steps() noexcept nogil:
    return _fused_steps


cdef int check(bint ok, str what) except -1:
    if not ok:
        raise ValueError(what)
    return 0


# ---------------------------------------------------------------------------- products

cdef float* pack_panels(const floating* src, Py_ssize_t ld, Py_ssize_t K, Py_ssize_t Nc,
                         bint transposed) noexcept nogil:
    """Panels of 32 columns of B (K, Nc) for :c:func:`sn_sgemm_panels`; B = src (K, Nc) with
    row stride ``ld``, or B = src^T when ``transposed`` (src is (Nc, K)).  NULL if out of memory."""
    cdef Py_ssize_t P = (Nc + 31) // 32, p, k, c, col
    cdef float* out = <float*>malloc(P * K * 32 * sizeof(float))
    cdef float* dst
    if out == NULL:
        return NULL
    for p in range(P):
        for k in range(K):
            dst = out + (p * K + k) * 32
            for c in range(32):
                col = p * 32 + c
                if col >= Nc:
                    dst[c] = 0
                elif transposed:
                    dst[c] = <float>src[col * ld + k]
                else:
                    dst[c] = <float>src[k * ld + col]
    return out


# The products every recurrent kernel needs, on the float32 AVX-512 panel kernel when ``own``
# (float32 on an AVX-512 CPU) and on the BLAS otherwise.  ``rows`` is T*N for whole-sequence
# products, N for one time step; ``G`` is the gate width (4H for the LSTM, H for the RNN).

cdef void project_inputs(int own, const floating* xt, const floating* w_ih, floating* out,
                          Py_ssize_t rows, Py_ssize_t F, Py_ssize_t G) noexcept nogil:
    """out (rows, G) = xt (rows, F) @ W_ih^T, W_ih (G, F): every step's input projection at once."""
    if floating is float:
        if own == ON_BF16 and bf16_gemm(False, True, rows, G, F, xt, F, w_ih, F, out, G,
                                        False) == 0:
            return
    cdef float* wp = pack_panels(w_ih, F, F, G, True) if own == ON_PANELS else NULL
    if wp != NULL:
        sn_sgemm_panels(<int>rows, <int>G, <int>F, <float*>xt, <int>F, wp, <float*>out, <int>G, 0)
        free(wp)
    else:
        gemm(False, True, <int>rows, <int>G, <int>F, <floating>1, xt, <int>F, w_ih, <int>F,
             <floating>0, out, <int>G)


cdef void times_packed(int own, const floating* a, Py_ssize_t rows, Py_ssize_t K,
                        const float* bp, const floating* b, bint b_transposed, Py_ssize_t Nc,
                        floating* c, bint accumulate) noexcept nogil:
    """c (rows, Nc) (+)= a (rows, K) @ B, B = b^T (b is (Nc, K)) when ``b_transposed``, else b
    (K, Nc); ``bp`` is B already packed in panels (used unless ``ON_BLAS``)."""
    if floating is float:
        if own == ON_BF16 and bp != NULL and bf16_gemm_packed(False, rows, Nc, K, a, K,
                                                              <const int32_t*>bp, c, Nc,
                                                              accumulate) == 0:
            return
    if own == ON_PANELS:
        sn_sgemm_panels(<int>rows, <int>Nc, <int>K, <float*>a, <int>K, bp, <float*>c, <int>Nc,
                        1 if accumulate else 0)
    elif b_transposed:
        gemm(False, True, <int>rows, <int>Nc, <int>K, <floating>1, a, <int>K, b, <int>K,
             <floating>(1 if accumulate else 0), c, <int>Nc)
    else:
        gemm(False, False, <int>rows, <int>Nc, <int>K, <floating>1, a, <int>K, b, <int>Nc,
             <floating>(1 if accumulate else 0), c, <int>Nc)


cdef void product(bint trans_a, bint trans_b, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                  const floating* A, Py_ssize_t lda, const floating* B, Py_ssize_t ldb,
                  const void* b16, bint bf16, bint accumulate, floating* C,
                  Py_ssize_t ldc) noexcept nogil:
    """C (M, N) (+)= op(A) @ op(B) (row-major, as ``_blas.gemm``): in bfloat16 when ``bf16``
    (``b16``: op(B) already packed, or NULL to pack it here), else on the BLAS (also when a
    bfloat16 product cannot get its buffers)."""
    if floating is float:
        if bf16 and b16 != NULL:
            if bf16_gemm_packed(trans_a, M, N, K, A, lda, <const int32_t*>b16, C, ldc,
                                accumulate) == 0:
                return
        elif bf16:
            if bf16_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate) == 0:
                return
    gemm(trans_a, trans_b, <int>M, <int>N, <int>K, <floating>1, A, <int>lda, B, <int>ldb,
         <floating>(1 if accumulate else 0), C, <int>ldc)


cdef void weight_grad(int own, const floating* dg, const floating* src, floating* dw,
                       Py_ssize_t rows, Py_ssize_t G, Py_ssize_t K) noexcept nogil:
    """dw (G, K) = dg^T (G, rows) @ src (rows, K): one product over all T*N rows."""
    if floating is float:
        if own == ON_BF16 and bf16_gemm(True, False, G, K, rows, dg, G, src, K, dw, K,
                                        False) == 0:
            return
    cdef float* bp = pack_panels(src, K, rows, K, False) if own == ON_PANELS else NULL
    if bp != NULL:
        sn_sgemm_panels_tn(<int>G, <int>K, <int>rows, <float*>dg, <int>G, bp, <float*>dw,
                           <int>K, 0)
        free(bp)
    else:
        gemm(True, False, <int>G, <int>K, <int>rows, <floating>1, dg, <int>G, src, <int>K,
             <floating>0, dw, <int>K)


cdef void step_product(const floating* x, Py_ssize_t F, const float* wiT, const floating* h,
                       Py_ssize_t H, const float* whT, Py_ssize_t rows, Py_ssize_t G,
                       floating* out) noexcept nogil:
    """One step's pre-activations on the float32 panel kernel, in one pass over ``out``:
    out (rows, G) = x (rows, F) @ W_ih^T + h (rows, H) @ W_hh^T (the second term only when
    ``h`` is not NULL); ``wiT``, ``whT`` are W_ih^T, W_hh^T in panels."""
    sn_sgemm_panels2(<int>rows, <int>G, <int>F, <const float*>x, <int>F, wiT,
                     <int>H if h != NULL else 0, <const float*>h if h != NULL else NULL,
                     <int>H, whT, <float*>out, <int>G, 0)


cdef float* step_grad_scratch(Py_ssize_t N, Py_ssize_t F, Py_ssize_t H) noexcept nogil:
    """Room for one step's states (N, H) and inputs (N, F) in panels; NULL if out of memory."""
    return <float*>malloc((((H + 31) // 32) + ((F + 31) // 32)) * 32 * N * sizeof(float) + 64)


cdef void step_weight_grads(const floating* dg, const floating* h, const floating* x,
                            floating* dw_hh, floating* dw_ih, float* scratch, Py_ssize_t N,
                            Py_ssize_t F, Py_ssize_t G, Py_ssize_t H, bint accumulate,
                            bint h_zero=False) noexcept nogil:
    """One step's share of the weight gradients on the float32 panel kernel:
    dW_hh (G, H) (+)= dg (N, G)^T @ h (N, H) and dW_ih (G, F) (+)= dg^T @ x (N, F), while the
    step's gate gradients are still in cache (``scratch`` from :c:func:`step_grad_scratch`).
    With ``h_zero`` (h all zeros: the first step from a zero state) dW_hh gains nothing, and
    its product, 1/T of the recurrent weight gradient's, is skipped."""
    cdef float* xp = scratch + ((H + 31) // 32) * 32 * N
    if h_zero:
        if not accumulate:
            memset(dw_hh, 0, G * H * sizeof(floating))
    else:
        sn_pack_panels(<const float*>h, <int>H, <int>N, <int>H, scratch)
        sn_sgemm_panels_tn(<int>G, <int>H, <int>N, <const float*>dg, <int>G, scratch,
                           <float*>dw_hh, <int>H, 1 if accumulate else 0)
    if F > 0:
        sn_pack_panels(<const float*>x, <int>F, <int>N, <int>F, xp)
        sn_sgemm_panels_tn(<int>G, <int>F, <int>N, <const float*>dg, <int>G, xp,
                           <float*>dw_ih, <int>F, 1 if accumulate else 0)


cdef bint all_zero(const floating* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] != 0:
            return False
    return True


# ---------------------------------------------------------------------------- layout

cdef void to_time_major(const floating* x, floating* xt, Py_ssize_t N, Py_ssize_t T,
                         Py_ssize_t F) noexcept nogil:
    """xt[t, n, :] = x[n, t, :]"""
    cdef Py_ssize_t n, t
    for n in range(N):
        for t in range(T):
            memcpy(xt + (t * N + n) * F, x + (n * T + t) * F, F * sizeof(floating))


cdef void to_batch_major(const floating* xt, floating* x, Py_ssize_t N, Py_ssize_t T,
                          Py_ssize_t F) noexcept nogil:
    """x[n, t, :] = xt[t, n, :]"""
    cdef Py_ssize_t n, t
    for t in range(T):
        for n in range(N):
            memcpy(x + (n * T + t) * F, xt + (t * N + n) * F, F * sizeof(floating))


# ---------------------------------------------------------------------------- around the time loop

cdef void init_state(floating* s, const floating* s0, Py_ssize_t size) noexcept nogil:
    """s[:size] = s0[:size], or zeros when s0 is NULL (an initial state or state gradient)."""
    if s0 != NULL:
        memcpy(s, s0, size * sizeof(floating))
    else:
        memset(s, 0, size * sizeof(floating))


cdef int check_forward_buffers(str kernel, const floating[:, :, ::1] x, floating[:, :, ::1] xt,
                               floating[:, :, ::1] pre, str pre_name, floating[:, :, ::1] hs,
                               const floating[:, ::1] h0, const unsigned char[:, ::1] mask,
                               floating[:, :, ::1] y, Py_ssize_t G, Py_ssize_t H) except -1:
    """The buffers of a forward over ``x (N, T, F)``: ``xt (T, N, F)``, the pre-activations
    ``pre (T, N, G)``, ``hs (T + 1, N, H)``, and ``h0 (N, H)``, ``mask (N, T)``, ``y (N, T, H)``
    or None."""
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    check(xt.shape[0] == T and xt.shape[1] == N and xt.shape[2] == F, f"{kernel}: xt shape")
    check(pre.shape[0] == T and pre.shape[1] == N and pre.shape[2] == G, f"{kernel}: {pre_name} shape")
    check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H, f"{kernel}: hs shape")
    check(h0 is None or (h0.shape[0] == N and h0.shape[1] == H), f"{kernel}: h0 shape")
    check(mask is None or (mask.shape[0] == N and mask.shape[1] == T), f"{kernel}: mask shape")
    check(y is None or (y.shape[0] == N and y.shape[1] == T and y.shape[2] == H), f"{kernel}: y shape")
    return 0


cdef int forward_buffers(int own, const floating* w_hh, Py_ssize_t H, Py_ssize_t G,
                         floating** b, float** whT, const floating* w_ih=NULL, Py_ssize_t F=0,
                         float** wiT=NULL) except -1:
    """``b[0]`` = room for the summed bias ``(G,)``; ``whT[0]`` = W_hh^T ``(H, G)`` in panels, read
    in place by every step's product (unless ``ON_BLAS``: NULL; bfloat16 panels ``ON_BF16``);
    likewise ``wiT[0]`` = W_ih^T ``(F, G)`` when ``wiT`` is given (a per-step input projection,
    ``ON_PANELS``).  The caller frees them."""
    b[0] = <floating*>malloc(G * sizeof(floating))
    whT[0] = NULL
    if wiT != NULL:
        wiT[0] = NULL
    if b[0] == NULL:
        raise MemoryError()
    if floating is float:
        if own == ON_BF16:
            # a NULL here makes the step products run on the BLAS
            whT[0] = <float*>pack_alloc(w_hh, H, True, H, G)
    if own == ON_PANELS:
        whT[0] = pack_panels(w_hh, H, H, G, True)
        if wiT != NULL and whT[0] != NULL:
            wiT[0] = pack_panels(w_ih, F, F, G, True)
        if whT[0] == NULL or (wiT != NULL and wiT[0] == NULL):
            free(b[0])
            free(whT[0])
            b[0] = NULL
            whT[0] = NULL
            raise MemoryError()
    return 0


cdef void forward_prologue(int own, const floating* x, const floating* w_ih, const floating* b_ih,
                           const floating* b_hh, const floating* h0, floating* b, floating* xt,
                           floating* pre, floating* hs, Py_ssize_t N, Py_ssize_t T, Py_ssize_t F,
                           Py_ssize_t G, Py_ssize_t H, bint project=True) noexcept nogil:
    """Everything before the first step: ``b (G,) = b_ih + b_hh``; ``hs[0] = h0`` (zeros when
    NULL); ``xt`` = ``x`` time-major and every step's input projection in one product,
    ``pre (T*N, G) = xt (T*N, F) @ W_ih^T`` (zeros when ``F == 0``)."""
    cdef Py_ssize_t j
    for j in range(G):
        b[j] = b_ih[j] + b_hh[j]
    init_state(hs, h0, N * H)
    if T > 0:
        if F > 0:
            to_time_major(x, xt, N, T, F)
            if project:
                project_inputs(own, xt, w_ih, pre, T * N, F, G)
        else:
            memset(pre, 0, T * N * G * sizeof(floating))


cdef void zero_grads(floating* dw_ih, floating* dw_hh, floating* db_hh, Py_ssize_t F,
                     Py_ssize_t G, Py_ssize_t H) noexcept nogil:
    """A backward over no step (``T == 0`` or ``N == 0``): ``dW_ih``, ``dW_hh`` and ``db_hh`` zero."""
    memset(dw_ih, 0, G * F * sizeof(floating))
    memset(dw_hh, 0, G * H * sizeof(floating))
    memset(db_hh, 0, G * sizeof(floating))


cdef void backward_products(int own, const floating* dg, const floating* hs, const floating* xt,
                            const floating* w_ih, floating* dw_ih, floating* dw_hh,
                            const floating* db_ih, floating* db_hh, floating* dxt, floating* dx,
                            Py_ssize_t N, Py_ssize_t T, Py_ssize_t F, Py_ssize_t G,
                            Py_ssize_t H, bint steps_done=False) noexcept nogil:
    """After the last step, one product each over all ``T*N`` rows of the pre-activation
    gradients ``dg (T*N, G)`` (the input gradient only when ``dx`` is not NULL).  With
    ``steps_done`` the time loop already accumulated the weight gradients and wrote ``dxt``
    step by step (``dg`` is not read): only ``dx`` and ``db_hh`` are left."""
    if F > 0:
        if not steps_done:
            # dW_ih (G, F) = dg^T (G, T*N) @ xt (T*N, F)
            weight_grad(own, dg, xt, dw_ih, T * N, G, F)
        if dx != NULL:
            if not steps_done:
                # dxt (T*N, F) = dg (T*N, G) @ W_ih (G, F)
                _dx_product(own, dg, w_ih, dxt, T * N, F, G)
            to_batch_major(dxt, dx, N, T, F)
    if not steps_done:
        # dW_hh (G, H) = dg^T (G, T*N) @ hs[0:T] (T*N, H)
        weight_grad(own, dg, hs, dw_hh, T * N, G, H)
    # both biases receive the same gradient
    memcpy(db_hh, db_ih, G * sizeof(floating))


cdef void _dx_product(int own, const floating* dg, const floating* w_ih, floating* dxt,
                      Py_ssize_t rows, Py_ssize_t F, Py_ssize_t G) noexcept nogil:
    """dxt (rows, F) = dg (rows, G) @ W_ih (G, F)."""
    if floating is float:
        if own == ON_BF16 and bf16_gemm(False, False, rows, F, G, dg, G, w_ih, F, dxt, F,
                                        False) == 0:
            return
    gemm(False, False, <int>rows, <int>F, <int>G, <floating>1, dg, <int>G, w_ih, <int>F,
         <floating>0, dxt, <int>F)


# ---------------------------------------------------------------------------- for tests

def sgemm_step(const float[:, ::1] A, const float[:, ::1] B, float[:, ::1] C, bint accumulate):
    """``C[...] = A @ B`` (or ``C += A @ B``) with the built-in step kernel (for tests)."""
    cdef float* Bp
    if sn_step_isa() == 0:
        raise RuntimeError("this CPU has neither AVX-512 nor AVX2 with FMA")
    check(A.shape[1] == B.shape[0] and C.shape[0] == A.shape[0] and C.shape[1] == B.shape[1],
          "sgemm_step: shape mismatch")
    if A.shape[0] == 0 or B.shape[1] == 0:
        return
    if A.shape[1] == 0:  # an empty sum: C = 0, or C kept when accumulating
        sn_sgemm_panels(<int>A.shape[0], <int>B.shape[1], 0, NULL, 1, NULL, &C[0, 0],
                        <int>C.shape[1], accumulate)
        return
    Bp = pack_panels(&B[0, 0], B.shape[1], B.shape[0], B.shape[1], False)
    if Bp == NULL:
        raise MemoryError()
    with nogil:
        sn_sgemm_panels(<int>A.shape[0], <int>B.shape[1], <int>A.shape[1], &A[0, 0], <int>A.shape[1],
                        Bp, &C[0, 0], <int>C.shape[1], accumulate)
    free(Bp)


def sgemm_tn_step(const float[:, ::1] At, const float[:, ::1] B, float[:, ::1] C, bint accumulate):
    """``C[...] = At.T @ B`` (or ``C += At.T @ B``) with the built-in step kernel (for tests)."""
    cdef float* Bp
    if sn_step_isa() == 0:
        raise RuntimeError("this CPU has neither AVX-512 nor AVX2 with FMA")
    check(At.shape[0] == B.shape[0] and C.shape[0] == At.shape[1] and C.shape[1] == B.shape[1],
          "sgemm_tn_step: shape mismatch")
    if At.shape[1] == 0 or B.shape[1] == 0:
        return
    if At.shape[0] == 0:
        sn_sgemm_panels_tn(<int>At.shape[1], <int>B.shape[1], 0, NULL, 1, NULL, &C[0, 0],
                           <int>C.shape[1], accumulate)
        return
    Bp = pack_panels(&B[0, 0], B.shape[1], B.shape[0], B.shape[1], False)
    if Bp == NULL:
        raise MemoryError()
    with nogil:
        sn_sgemm_panels_tn(<int>At.shape[1], <int>B.shape[1], <int>At.shape[0], &At[0, 0],
                           <int>At.shape[1], Bp, &C[0, 0], <int>C.shape[1], accumulate)
    free(Bp)


def fast_tanh_f32(const float[::1] x, float[::1] out):
    """The float32 tanh used by the kernels (for tests): ``out[...] = tanh(x)``."""
    cdef Py_ssize_t i
    check(out.shape[0] == x.shape[0], "fast_tanh_f32: length mismatch")
    with nogil:
        for i in range(x.shape[0]):
            out[i] = sn_tanh_f(x[i])


def fast_sigmoid_f32(const float[::1] x, float[::1] out):
    """The float32 sigmoid used by the kernels (for tests): ``out[...] = sigmoid(x)``."""
    cdef Py_ssize_t i
    check(out.shape[0] == x.shape[0], "fast_sigmoid_f32: length mismatch")
    with nogil:
        for i in range(x.shape[0]):
            out[i] = sn_sigm_f(x[i])

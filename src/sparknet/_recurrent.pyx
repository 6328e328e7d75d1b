# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Recurrent kernels: simple RNN and LSTM, forward over all time steps and BPTT backward.

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

Float32 on AVX-512 CPUs.  The products above run in the built-in kernels of this module
(8 x 32 register blocks, 16 zmm accumulators) instead of the BLAS: the recurrent weights are
packed once per call into 32-column panels and read in place by all ``T`` step products,
where a BLAS would repack them at every step; the weight gradients use the same kernel
with ``dgates`` read transposed.  Float64, other CPUs, or :func:`use_step_kernel` (False)
use the BLAS ``gemm`` for every product.

Masks.  ``mask[n, t] == 0`` marks a padded step: the state is carried unchanged
(``h[t+1] = h[t]``, ``c[t+1] = c[t]``), the per-step output is zero, and in the backward the
incoming state gradient passes through unchanged while the step's gate gradients are zero
(so it adds nothing to any parameter or input gradient, and its output gradient is ignored).

LSTM formulas (as ``torch.nn.LSTM``, gate order i, f, g, o; two biases ``b_ih`` and ``b_hh``)::

    a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          (4H values: blocks i, f, g, o)
    i = sigmoid(a_i)  f = sigmoid(a_f)  g = tanh(a_g)  o = sigmoid(a_o)
    c_t = f * c_{t-1} + i * g
    h_t = o * tanh(c_t)

Simple RNN: ``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``.

Truncated BPTT: no gradient flows into the initial state (it is a constant of the chunk).
"""
from cython cimport floating
from libc.string cimport memcpy, memset
from libc.stdlib cimport malloc, free
from sparknet._blas cimport gemm

cdef extern from "recurrent_kernels.h":
    void sn_lstm_fwd_f(int H, float* a, const float* b, const float* c_prev, float* c,
                       float* tc, float* h) noexcept nogil
    void sn_lstm_fwd_d(int H, double* a, const double* b, const double* c_prev, double* c,
                       double* tc, double* h) noexcept nogil
    void sn_lstm_bwd_f(int H, float* a, const float* c_prev, const float* tc,
                       const float* dh_rec, const float* dy, float* dc, float* db) noexcept nogil
    void sn_lstm_bwd_d(int H, double* a, const double* c_prev, const double* tc,
                       const double* dh_rec, const double* dy, double* dc, double* db) noexcept nogil
    void sn_rnn_fwd_f(int H, int act, const float* z, const float* b, float* h) noexcept nogil
    void sn_rnn_fwd_d(int H, int act, const double* z, const double* b, double* h) noexcept nogil
    void sn_rnn_bwd_f(int H, int act, const float* h, const float* dh_rec, const float* dy,
                      float* dz, float* db) noexcept nogil
    void sn_rnn_bwd_d(int H, int act, const double* h, const double* dh_rec, const double* dy,
                      double* dz, double* db) noexcept nogil
    float sn_tanh_f(float x) noexcept nogil
    float sn_sigm_f(float x) noexcept nogil
    void sn_sgemm_panels_avx512(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                         float* C, int ldc, int acc) noexcept nogil
    int sn_has_avx512() noexcept nogil
    void sn_sgemm_panels_tn_avx512(int M, int Nc, int K, const float* At, int lda, const float* Bp,
                            float* C, int ldc, int acc) noexcept nogil


# ---------------------------------------------------------------------------- helpers

cdef bint _own_step_kernel = True


def step_kernel_available() -> bool:
    """True when float32 recurrent steps can use the built-in AVX-512 product (this CPU)."""
    return bool(sn_has_avx512())


def use_step_kernel(bint on=True) -> bool:
    """Choose the float32 per-step product: the built-in AVX-512 kernel (default, when the
    CPU has AVX-512) or the BLAS gemm.  Returns whether the built-in kernel is now used."""
    global _own_step_kernel
    _own_step_kernel = on
    return bool(on and sn_has_avx512())


cdef float* _pack_panels(const floating* src, Py_ssize_t ld, Py_ssize_t K, Py_ssize_t Nc,
                         bint transposed) noexcept nogil:
    """Panels of 32 columns of B (K, Nc) for :c:func:`sn_sgemm_panels_avx512`; B = src (K, Nc) with
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

cdef void _project_inputs(bint own, const floating* xt, const floating* w_ih, floating* out,
                          Py_ssize_t rows, Py_ssize_t F, Py_ssize_t G) noexcept nogil:
    """out (rows, G) = xt (rows, F) @ W_ih^T, W_ih (G, F): every step's input projection at once."""
    cdef float* wp = _pack_panels(w_ih, F, F, G, True) if own else NULL
    if wp != NULL:
        sn_sgemm_panels_avx512(<int>rows, <int>G, <int>F, <float*>xt, <int>F, wp, <float*>out, <int>G, 0)
        free(wp)
    else:
        gemm(False, True, <int>rows, <int>G, <int>F, <floating>1, xt, <int>F, w_ih, <int>F,
             <floating>0, out, <int>G)


cdef void _times_packed(bint own, const floating* a, Py_ssize_t rows, Py_ssize_t K,
                        const float* bp, const floating* b, bint b_transposed, Py_ssize_t Nc,
                        floating* c, bint accumulate) noexcept nogil:
    """c (rows, Nc) (+)= a (rows, K) @ B, B = b^T (b is (Nc, K)) when ``b_transposed``, else b
    (K, Nc); ``bp`` is B already packed in panels (used when ``own``)."""
    if own:
        sn_sgemm_panels_avx512(<int>rows, <int>Nc, <int>K, <float*>a, <int>K, bp, <float*>c, <int>Nc,
                               1 if accumulate else 0)
    elif b_transposed:
        gemm(False, True, <int>rows, <int>Nc, <int>K, <floating>1, a, <int>K, b, <int>K,
             <floating>(1 if accumulate else 0), c, <int>Nc)
    else:
        gemm(False, False, <int>rows, <int>Nc, <int>K, <floating>1, a, <int>K, b, <int>Nc,
             <floating>(1 if accumulate else 0), c, <int>Nc)


cdef void _weight_grad(bint own, const floating* dg, const floating* src, floating* dw,
                       Py_ssize_t rows, Py_ssize_t G, Py_ssize_t K) noexcept nogil:
    """dw (G, K) = dg^T (G, rows) @ src (rows, K): one product over all T*N rows."""
    cdef float* bp = _pack_panels(src, K, rows, K, False) if own else NULL
    if bp != NULL:
        sn_sgemm_panels_tn_avx512(<int>G, <int>K, <int>rows, <float*>dg, <int>G, bp, <float*>dw,
                                  <int>K, 0)
        free(bp)
    else:
        gemm(True, False, <int>G, <int>K, <int>rows, <floating>1, dg, <int>G, src, <int>K,
             <floating>0, dw, <int>K)


def sgemm_step(const float[:, ::1] A, const float[:, ::1] B, float[:, ::1] C, bint accumulate):
    """``C[...] = A @ B`` (or ``C += A @ B``) with the built-in AVX-512 kernel (for tests)."""
    cdef float* Bp
    if not sn_has_avx512():
        raise RuntimeError("this CPU has no AVX-512")
    _check(A.shape[1] == B.shape[0] and C.shape[0] == A.shape[0] and C.shape[1] == B.shape[1]
           and A.shape[1] > 0, "sgemm_step: shape mismatch")
    if A.shape[0] == 0 or B.shape[1] == 0:
        return
    Bp = _pack_panels(&B[0, 0], B.shape[1], B.shape[0], B.shape[1], False)
    if Bp == NULL:
        raise MemoryError()
    with nogil:
        sn_sgemm_panels_avx512(<int>A.shape[0], <int>B.shape[1], <int>A.shape[1], &A[0, 0], <int>A.shape[1],
                        Bp, &C[0, 0], <int>C.shape[1], accumulate)
    free(Bp)


def sgemm_tn_step(const float[:, ::1] At, const float[:, ::1] B, float[:, ::1] C, bint accumulate):
    """``C[...] = At.T @ B`` (or ``C += At.T @ B``) with the built-in AVX-512 kernel (for tests)."""
    cdef float* Bp
    if not sn_has_avx512():
        raise RuntimeError("this CPU has no AVX-512")
    _check(At.shape[0] == B.shape[0] and C.shape[0] == At.shape[1] and C.shape[1] == B.shape[1]
           and At.shape[0] > 0, "sgemm_tn_step: shape mismatch")
    if At.shape[1] == 0 or B.shape[1] == 0:
        return
    Bp = _pack_panels(&B[0, 0], B.shape[1], B.shape[0], B.shape[1], False)
    if Bp == NULL:
        raise MemoryError()
    with nogil:
        sn_sgemm_panels_tn_avx512(<int>At.shape[1], <int>B.shape[1], <int>At.shape[0], &At[0, 0],
                           <int>At.shape[1], Bp, &C[0, 0], <int>C.shape[1], accumulate)
    free(Bp)


cdef inline bint _own_kernel() noexcept nogil:
    return _own_step_kernel and sn_has_avx512()


cdef inline void _lstm_fwd_row(int H, floating* a, const floating* b, const floating* c_prev,
                               floating* c, floating* tc, floating* h) noexcept nogil:
    if floating is float:
        sn_lstm_fwd_f(H, a, b, c_prev, c, tc, h)
    else:
        sn_lstm_fwd_d(H, a, b, c_prev, c, tc, h)


cdef inline void _lstm_bwd_row(int H, floating* a, const floating* c_prev,
                               const floating* tc, const floating* dh_rec, const floating* dy,
                               floating* dc, floating* db) noexcept nogil:
    if floating is float:
        sn_lstm_bwd_f(H, a, c_prev, tc, dh_rec, dy, dc, db)
    else:
        sn_lstm_bwd_d(H, a, c_prev, tc, dh_rec, dy, dc, db)


cdef inline void _rnn_fwd_row(int H, int act, const floating* z, const floating* b,
                              floating* h) noexcept nogil:
    if floating is float:
        sn_rnn_fwd_f(H, act, z, b, h)
    else:
        sn_rnn_fwd_d(H, act, z, b, h)


cdef inline void _rnn_bwd_row(int H, int act, const floating* h, const floating* dh_rec,
                              const floating* dy, floating* dz, floating* db) noexcept nogil:
    if floating is float:
        sn_rnn_bwd_f(H, act, h, dh_rec, dy, dz, db)
    else:
        sn_rnn_bwd_d(H, act, h, dh_rec, dy, dz, db)


cdef void _to_time_major(const floating* x, floating* xt, Py_ssize_t N, Py_ssize_t T,
                         Py_ssize_t F) noexcept nogil:
    """xt[t, n, :] = x[n, t, :]"""
    cdef Py_ssize_t n, t
    for n in range(N):
        for t in range(T):
            memcpy(xt + (t * N + n) * F, x + (n * T + t) * F, F * sizeof(floating))


cdef void _to_batch_major(const floating* xt, floating* x, Py_ssize_t N, Py_ssize_t T,
                          Py_ssize_t F) noexcept nogil:
    """x[n, t, :] = xt[t, n, :]"""
    cdef Py_ssize_t n, t
    for t in range(T):
        for n in range(N):
            memcpy(x + (n * T + t) * F, xt + (t * N + n) * F, F * sizeof(floating))


def _check(bint ok, str what):
    if not ok:
        raise ValueError(what)


def fast_tanh_f32(const float[::1] x, float[::1] out):
    """The float32 tanh used by the kernels (for tests): ``out[...] = tanh(x)``."""
    cdef Py_ssize_t i
    _check(out.shape[0] == x.shape[0], "fast_tanh_f32: length mismatch")
    with nogil:
        for i in range(x.shape[0]):
            out[i] = sn_tanh_f(x[i])


def fast_sigmoid_f32(const float[::1] x, float[::1] out):
    """The float32 sigmoid used by the kernels (for tests): ``out[...] = sigmoid(x)``."""
    cdef Py_ssize_t i
    _check(out.shape[0] == x.shape[0], "fast_sigmoid_f32: length mismatch")
    with nogil:
        for i in range(x.shape[0]):
            out[i] = sn_sigm_f(x[i])


# ---------------------------------------------------------------------------- LSTM

def lstm_forward(const floating[:, :, ::1] x, const floating[:, ::1] w_ih,
                 const floating[:, ::1] w_hh, const floating[::1] b_ih, const floating[::1] b_hh,
                 const floating[:, ::1] h0, const floating[:, ::1] c0,
                 const unsigned char[:, ::1] mask,
                 floating[:, :, ::1] xt, floating[:, :, ::1] gates, floating[:, :, ::1] hs,
                 floating[:, :, ::1] cs, floating[:, :, ::1] tcs, floating[:, :, ::1] y):
    """LSTM forward over all ``T`` steps.

    Args:
        x: input ``(N, T, F)``.
        w_ih, w_hh, b_ih, b_hh: ``(4H, F)``, ``(4H, H)``, ``(4H,)``, ``(4H,)`` (gates i, f, g, o).
        h0, c0: initial state ``(N, H)`` or None (zeros).
        mask: ``(N, T)`` uint8 (0 = padded step) or None.
        xt: scratch ``(T, N, F)``; on return, ``x`` time-major (kept for the backward).
        gates: ``(T, N, 4H)``; on return the activated gates i, f, g, o.
        hs, cs: ``(T + 1, N, H)``; on return the states (``hs[0] = h0``, ``hs[t+1]`` after step t).
        tcs: ``(T, N, H)``; on return ``tanh(c_t)``.
        y: ``(N, T, H)`` per-step output (zeros at masked steps), or None.
    """
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    cdef Py_ssize_t G = w_ih.shape[0], H = w_hh.shape[1]
    cdef bint has_h0 = h0 is not None, has_c0 = c0 is not None
    cdef bint has_mask = mask is not None, has_y = y is not None
    cdef Py_ssize_t t, n, j
    cdef floating* b
    _check(G == 4 * H and w_ih.shape[1] == F and w_hh.shape[0] == G and b_ih.shape[0] == G
           and b_hh.shape[0] == G, "lstm_forward: weight shapes disagree")
    _check(xt.shape[0] == T and xt.shape[1] == N and xt.shape[2] == F, "lstm_forward: xt shape")
    _check(gates.shape[0] == T and gates.shape[1] == N and gates.shape[2] == G,
           "lstm_forward: gates shape")
    _check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H
           and cs.shape[0] == T + 1 and cs.shape[1] == N and cs.shape[2] == H,
           "lstm_forward: state buffer shape")
    _check(tcs.shape[0] == T and tcs.shape[1] == N and tcs.shape[2] == H, "lstm_forward: tcs shape")
    _check(not has_h0 or (h0.shape[0] == N and h0.shape[1] == H), "lstm_forward: h0 shape")
    _check(not has_c0 or (c0.shape[0] == N and c0.shape[1] == H), "lstm_forward: c0 shape")
    _check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "lstm_forward: mask shape")
    _check(not has_y or (y.shape[0] == N and y.shape[1] == T and y.shape[2] == H),
           "lstm_forward: y shape")
    if N == 0 or H == 0:
        return
    cdef bint own = floating is float and _own_kernel()
    cdef float* whT = NULL
    b = <floating*>malloc(G * sizeof(floating))
    if b == NULL:
        raise MemoryError()
    if own:
        # W_hh^T (H, 4H) in panels, read in place by every step's product
        whT = _pack_panels(&w_hh[0, 0], H, H, G, True)
        if whT == NULL:
            free(b)
            raise MemoryError()
    try:
        with nogil:
            for j in range(G):
                b[j] = b_ih[j] + b_hh[j]
            if has_h0:
                memcpy(&hs[0, 0, 0], &h0[0, 0], N * H * sizeof(floating))
            else:
                memset(&hs[0, 0, 0], 0, N * H * sizeof(floating))
            if has_c0:
                memcpy(&cs[0, 0, 0], &c0[0, 0], N * H * sizeof(floating))
            else:
                memset(&cs[0, 0, 0], 0, N * H * sizeof(floating))
            if T > 0:
                # all input projections in one gemm: gates (T*N, 4H) = xt (T*N, F) @ W_ih^T
                if F > 0:
                    _to_time_major(&x[0, 0, 0], &xt[0, 0, 0], N, T, F)
                    _project_inputs(own, &xt[0, 0, 0], &w_ih[0, 0], &gates[0, 0, 0], T * N, F, G)
                else:
                    memset(&gates[0, 0, 0], 0, T * N * G * sizeof(floating))
            for t in range(T):
                if t > 0 or has_h0:
                    # gates[t] (N, 4H) += h_{t-1} (N, H) @ W_hh^T
                    _times_packed(own, &hs[t, 0, 0], N, H, whT, &w_hh[0, 0], True, G,
                                  &gates[t, 0, 0], True)
                for n in range(N):
                    if has_mask and mask[n, t] == 0:
                        memcpy(&hs[t + 1, n, 0], &hs[t, n, 0], H * sizeof(floating))
                        memcpy(&cs[t + 1, n, 0], &cs[t, n, 0], H * sizeof(floating))
                        if has_y:
                            memset(&y[n, t, 0], 0, H * sizeof(floating))
                    else:
                        _lstm_fwd_row(<int>H, &gates[t, n, 0], b, &cs[t, n, 0], &cs[t + 1, n, 0],
                                      &tcs[t, n, 0], &hs[t + 1, n, 0])
                        if has_y:
                            memcpy(&y[n, t, 0], &hs[t + 1, n, 0], H * sizeof(floating))
    finally:
        free(b)
        free(whT)


def lstm_backward(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                  const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                  floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                  const floating[:, :, ::1] cs, const floating[:, :, ::1] tcs,
                  const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                  const floating[:, ::1] dc_last, floating[:, ::1] dh_a, floating[:, ::1] dh_b,
                  floating[:, ::1] dc, floating[:, :, ::1] dxt, floating[:, :, ::1] dx,
                  floating[:, ::1] dw_ih, floating[:, ::1] dw_hh, floating[::1] db_ih,
                  floating[::1] db_hh):
    """BPTT through the steps of the last :func:`lstm_forward` (buffers as it left them).

    Args:
        gates: the activated gates left by the forward; overwritten, step by step, with the
            gradients of the gate pre-activations (so a forward is backpropagated once).
        dy: gradient of the per-step output ``(N, T, H)``, or None.
        dh_last, dc_last: gradient of the final state ``(N, H)``, or None.
        dh_a, dh_b, dc: scratch ``(N, H)``.
        dxt: scratch ``(T, N, F)`` and dx ``(N, T, F)``: the input gradient, or both None.
        dw_ih, dw_hh, db_ih, db_hh: parameter gradients, overwritten.
    """
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], G = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = G // 4
    cdef bint has_mask = mask is not None, has_dy = dy is not None
    cdef bint has_dx = dx is not None
    cdef Py_ssize_t t, n, j
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef const floating* dyp = NULL
    cdef bint own = floating is float and _own_kernel() and T > 1 and N > 0 and H > 0
    cdef float* whp = NULL
    _check(xt.shape[0] == T and xt.shape[1] == N and w_ih.shape[0] == G and w_ih.shape[1] == F
           and w_hh.shape[0] == G and w_hh.shape[1] == H, "lstm_backward: shapes disagree")
    _check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H and cs.shape[0] == T + 1
           and tcs.shape[0] == T, "lstm_backward: state buffer shape")
    _check(not has_dy or (dy.shape[0] == N and dy.shape[1] == T and dy.shape[2] == H),
           "lstm_backward: dy shape")
    _check(dh_last is None or (dh_last.shape[0] == N and dh_last.shape[1] == H),
           "lstm_backward: dh_last shape")
    _check(dc_last is None or (dc_last.shape[0] == N and dc_last.shape[1] == H),
           "lstm_backward: dc_last shape")
    _check(dh_a.shape[0] == N and dh_a.shape[1] == H and dh_b.shape[0] == N and dh_b.shape[1] == H
           and dc.shape[0] == N and dc.shape[1] == H, "lstm_backward: scratch shape")
    _check(not has_dx or (dxt is not None and dxt.shape[0] == T and dxt.shape[1] == N
                          and dxt.shape[2] == F and dx.shape[0] == N and dx.shape[1] == T
                          and dx.shape[2] == F), "lstm_backward: dx shape")
    _check(dw_ih.shape[0] == G and dw_ih.shape[1] == F and dw_hh.shape[0] == G
           and dw_hh.shape[1] == H and db_ih.shape[0] == G and db_hh.shape[0] == G,
           "lstm_backward: gradient shapes")
    _check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "lstm_backward: mask shape")
    if own:
        whp = _pack_panels(&w_hh[0, 0], H, G, H, False)
        if whp == NULL:
            raise MemoryError()
    try:
        _lstm_backward_loop(xt, w_ih, w_hh, mask, gates, hs, cs, tcs, dy, dh_last, dc_last, dh_a,
                            dh_b, dc, dxt, dx, dw_ih, dw_hh, db_ih, db_hh, own, whp)
    finally:
        free(whp)


cdef void _lstm_backward_loop(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                              const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                              floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                              const floating[:, :, ::1] cs, const floating[:, :, ::1] tcs,
                              const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                              const floating[:, ::1] dc_last, floating[:, ::1] dh_a,
                              floating[:, ::1] dh_b, floating[:, ::1] dc, floating[:, :, ::1] dxt,
                              floating[:, :, ::1] dx, floating[:, ::1] dw_ih,
                              floating[:, ::1] dw_hh, floating[::1] db_ih, floating[::1] db_hh,
                              bint own, float* whp) noexcept:
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], G = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = G // 4
    cdef bint has_mask = mask is not None, has_dy = dy is not None
    cdef bint has_dx = dx is not None
    cdef Py_ssize_t t, n
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef const floating* dyp = NULL
    with nogil:
        memset(&db_ih[0], 0, G * sizeof(floating))
        if T == 0 or N == 0:
            memset(&dw_ih[0, 0], 0, G * F * sizeof(floating))
            memset(&dw_hh[0, 0], 0, G * H * sizeof(floating))
            memset(&db_hh[0], 0, G * sizeof(floating))
            if has_dx and N > 0 and F > 0 and T > 0:
                memset(&dx[0, 0, 0], 0, N * T * F * sizeof(floating))
        else:
            DH = &dh_a[0, 0]
            DH2 = &dh_b[0, 0]
            if dh_last is not None:
                memcpy(DH, &dh_last[0, 0], N * H * sizeof(floating))
            else:
                memset(DH, 0, N * H * sizeof(floating))
            if dc_last is not None:
                memcpy(&dc[0, 0], &dc_last[0, 0], N * H * sizeof(floating))
            else:
                memset(&dc[0, 0], 0, N * H * sizeof(floating))
            for t in range(T - 1, -1, -1):
                for n in range(N):
                    if has_mask and mask[n, t] == 0:
                        # carried state: dh and dc pass through, no gate gradient, dy ignored
                        memset(&gates[t, n, 0], 0, G * sizeof(floating))
                    else:
                        if has_dy:
                            dyp = &dy[n, t, 0]
                        _lstm_bwd_row(<int>H, &gates[t, n, 0], &cs[t, n, 0], &tcs[t, n, 0],
                                      DH + n * H, dyp, &dc[n, 0], &db_ih[0])
                if t > 0:
                    # dh_{t-1} (N, H) = dgates[t] (N, 4H) @ W_hh (4H, H)
                    _times_packed(own, &gates[t, 0, 0], N, G, whp, &w_hh[0, 0], False, H, DH2, False)
                    if has_mask:
                        for n in range(N):
                            if mask[n, t] == 0:
                                memcpy(DH2 + n * H, DH + n * H, H * sizeof(floating))
                    tmp = DH
                    DH = DH2
                    DH2 = tmp
            # one product each over all T*N rows
            # dW_hh (4H, H) = dgates^T (4H, T*N) @ hs[0:T] (T*N, H)
            _weight_grad(own, &gates[0, 0, 0], &hs[0, 0, 0], &dw_hh[0, 0], T * N, G, H)
            if F > 0:
                # dW_ih (4H, F) = dgates^T (4H, T*N) @ xt (T*N, F)
                _weight_grad(own, &gates[0, 0, 0], &xt[0, 0, 0], &dw_ih[0, 0], T * N, G, F)
                if has_dx:
                    # dxt (T*N, F) = dgates (T*N, 4H) @ W_ih (4H, F)
                    gemm(False, False, <int>(T * N), <int>F, <int>G, <floating>1,
                         &gates[0, 0, 0], <int>G, &w_ih[0, 0], <int>F, <floating>0,
                         &dxt[0, 0, 0], <int>F)
                    _to_batch_major(&dxt[0, 0, 0], &dx[0, 0, 0], N, T, F)
            memcpy(&db_hh[0], &db_ih[0], G * sizeof(floating))


# ---------------------------------------------------------------------------- simple RNN

def rnn_forward(const floating[:, :, ::1] x, const floating[:, ::1] w_ih,
                const floating[:, ::1] w_hh, const floating[::1] b_ih, const floating[::1] b_hh,
                const floating[:, ::1] h0, const unsigned char[:, ::1] mask, int act,
                floating[:, :, ::1] xt, floating[:, :, ::1] zs, floating[:, :, ::1] hs,
                floating[:, :, ::1] y):
    """Simple RNN forward over all steps: ``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``.

    Args:
        x: input ``(N, T, F)``; w_ih ``(H, F)``, w_hh ``(H, H)``, b_ih and b_hh ``(H,)``.
        h0: initial state ``(N, H)`` or None (zeros).  mask: ``(N, T)`` uint8 or None.
        act: activation id (0 identity, 1 relu, 2 tanh, 3 sigmoid).
        xt: scratch ``(T, N, F)`` (time-major ``x`` on return); zs: scratch ``(T, N, H)``.
        hs: ``(T + 1, N, H)`` states; y: ``(N, T, H)`` per-step output or None.
    """
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    cdef Py_ssize_t H = w_hh.shape[0]
    cdef bint has_h0 = h0 is not None, has_mask = mask is not None, has_y = y is not None
    cdef Py_ssize_t t, n, j
    cdef floating* b
    _check(act in (0, 1, 2, 3), "rnn_forward: activation must be identity, relu, tanh or sigmoid")
    _check(w_ih.shape[0] == H and w_ih.shape[1] == F and w_hh.shape[1] == H and b_ih.shape[0] == H
           and b_hh.shape[0] == H, "rnn_forward: weight shapes disagree")
    _check(xt.shape[0] == T and xt.shape[1] == N and xt.shape[2] == F, "rnn_forward: xt shape")
    _check(zs.shape[0] == T and zs.shape[1] == N and zs.shape[2] == H, "rnn_forward: zs shape")
    _check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H, "rnn_forward: hs shape")
    _check(not has_h0 or (h0.shape[0] == N and h0.shape[1] == H), "rnn_forward: h0 shape")
    _check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "rnn_forward: mask shape")
    _check(not has_y or (y.shape[0] == N and y.shape[1] == T and y.shape[2] == H),
           "rnn_forward: y shape")
    if N == 0 or H == 0:
        return
    cdef bint own = floating is float and _own_kernel()
    cdef float* whT = NULL
    b = <floating*>malloc(H * sizeof(floating))
    if b == NULL:
        raise MemoryError()
    if own:
        whT = _pack_panels(&w_hh[0, 0], H, H, H, True)
        if whT == NULL:
            free(b)
            raise MemoryError()
    try:
        with nogil:
            for j in range(H):
                b[j] = b_ih[j] + b_hh[j]
            if has_h0:
                memcpy(&hs[0, 0, 0], &h0[0, 0], N * H * sizeof(floating))
            else:
                memset(&hs[0, 0, 0], 0, N * H * sizeof(floating))
            if T > 0:
                if F > 0:
                    _to_time_major(&x[0, 0, 0], &xt[0, 0, 0], N, T, F)
                    _project_inputs(own, &xt[0, 0, 0], &w_ih[0, 0], &zs[0, 0, 0], T * N, F, H)
                else:
                    memset(&zs[0, 0, 0], 0, T * N * H * sizeof(floating))
            for t in range(T):
                if t > 0 or has_h0:
                    # zs[t] (N, H) += h_{t-1} (N, H) @ W_hh^T
                    _times_packed(own, &hs[t, 0, 0], N, H, whT, &w_hh[0, 0], True, H,
                                  &zs[t, 0, 0], True)
                for n in range(N):
                    if has_mask and mask[n, t] == 0:
                        memcpy(&hs[t + 1, n, 0], &hs[t, n, 0], H * sizeof(floating))
                        if has_y:
                            memset(&y[n, t, 0], 0, H * sizeof(floating))
                    else:
                        _rnn_fwd_row(<int>H, act, &zs[t, n, 0], b, &hs[t + 1, n, 0])
                        if has_y:
                            memcpy(&y[n, t, 0], &hs[t + 1, n, 0], H * sizeof(floating))
    finally:
        free(b)
        free(whT)


def rnn_backward(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                 const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask, int act,
                 const floating[:, :, ::1] hs, const floating[:, :, ::1] dy,
                 const floating[:, ::1] dh_last, floating[:, :, ::1] dz, floating[:, ::1] dh_a,
                 floating[:, ::1] dh_b, floating[:, :, ::1] dxt, floating[:, :, ::1] dx,
                 floating[:, ::1] dw_ih, floating[:, ::1] dw_hh, floating[::1] db_ih,
                 floating[::1] db_hh):
    """BPTT through the last :func:`rnn_forward`.

    Args:
        dy: ``(N, T, H)`` or None; dh_last: ``(N, H)`` or None.
        dz: scratch ``(T, N, H)`` (pre-activation gradients on return).
        dh_a, dh_b: scratch ``(N, H)``.  dxt ``(T, N, F)`` and dx ``(N, T, F)``, or both None.
        dw_ih, dw_hh, db_ih, db_hh: parameter gradients, overwritten.
    """
    cdef Py_ssize_t T = dz.shape[0], N = dz.shape[1], H = dz.shape[2], F = xt.shape[2]
    cdef bint has_mask = mask is not None, has_dy = dy is not None, has_dx = dx is not None
    cdef Py_ssize_t t, n
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef const floating* dyp = NULL
    cdef bint own = floating is float and _own_kernel() and T > 0 and N > 0 and H > 0
    cdef float* whp = NULL
    _check(xt.shape[0] == T and xt.shape[1] == N and w_ih.shape[0] == H and w_ih.shape[1] == F
           and w_hh.shape[0] == H and w_hh.shape[1] == H, "rnn_backward: shapes disagree")
    _check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H, "rnn_backward: hs shape")
    _check(not has_dy or (dy.shape[0] == N and dy.shape[1] == T and dy.shape[2] == H),
           "rnn_backward: dy shape")
    _check(dh_last is None or (dh_last.shape[0] == N and dh_last.shape[1] == H),
           "rnn_backward: dh_last shape")
    _check(dh_a.shape[0] == N and dh_a.shape[1] == H and dh_b.shape[0] == N and dh_b.shape[1] == H,
           "rnn_backward: scratch shape")
    _check(not has_dx or (dxt is not None and dxt.shape[0] == T and dxt.shape[1] == N
                          and dxt.shape[2] == F and dx.shape[0] == N and dx.shape[1] == T
                          and dx.shape[2] == F), "rnn_backward: dx shape")
    _check(dw_ih.shape[0] == H and dw_ih.shape[1] == F and dw_hh.shape[0] == H
           and dw_hh.shape[1] == H and db_ih.shape[0] == H and db_hh.shape[0] == H,
           "rnn_backward: gradient shapes")
    _check(act in (0, 1, 2, 3), "rnn_backward: bad activation id")
    _check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "rnn_backward: mask shape")
    if own:
        whp = _pack_panels(&w_hh[0, 0], H, H, H, False)
        if whp == NULL:
            raise MemoryError()
    try:
        _rnn_backward_loop(xt, w_ih, w_hh, mask, act, hs, dy, dh_last, dz, dh_a, dh_b, dxt, dx, dw_ih,
                           dw_hh, db_ih, db_hh, own, whp)
    finally:
        free(whp)


cdef void _rnn_backward_loop(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                             const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask, int act,
                             const floating[:, :, ::1] hs, const floating[:, :, ::1] dy,
                             const floating[:, ::1] dh_last, floating[:, :, ::1] dz,
                             floating[:, ::1] dh_a, floating[:, ::1] dh_b, floating[:, :, ::1] dxt,
                             floating[:, :, ::1] dx, floating[:, ::1] dw_ih, floating[:, ::1] dw_hh,
                             floating[::1] db_ih, floating[::1] db_hh, bint own,
                             float* whp) noexcept:
    cdef Py_ssize_t T = dz.shape[0], N = dz.shape[1], H = dz.shape[2], F = xt.shape[2]
    cdef bint has_mask = mask is not None, has_dy = dy is not None, has_dx = dx is not None
    cdef Py_ssize_t t, n
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef const floating* dyp = NULL
    with nogil:
        memset(&db_ih[0], 0, H * sizeof(floating))
        if T == 0 or N == 0:
            memset(&dw_ih[0, 0], 0, H * F * sizeof(floating))
            memset(&dw_hh[0, 0], 0, H * H * sizeof(floating))
            memset(&db_hh[0], 0, H * sizeof(floating))
            if has_dx and N > 0 and F > 0 and T > 0:
                memset(&dx[0, 0, 0], 0, N * T * F * sizeof(floating))
        else:
            DH = &dh_a[0, 0]
            DH2 = &dh_b[0, 0]
            if dh_last is not None:
                memcpy(DH, &dh_last[0, 0], N * H * sizeof(floating))
            else:
                memset(DH, 0, N * H * sizeof(floating))
            for t in range(T - 1, -1, -1):
                for n in range(N):
                    if has_mask and mask[n, t] == 0:
                        memset(&dz[t, n, 0], 0, H * sizeof(floating))
                    else:
                        if has_dy:
                            dyp = &dy[n, t, 0]
                        _rnn_bwd_row(<int>H, act, &hs[t + 1, n, 0], DH + n * H, dyp, &dz[t, n, 0],
                                     &db_ih[0])
                if t > 0:
                    # dh_{t-1} (N, H) = dz[t] (N, H) @ W_hh (H, H)
                    _times_packed(own, &dz[t, 0, 0], N, H, whp, &w_hh[0, 0], False, H, DH2, False)
                    if has_mask:
                        for n in range(N):
                            if mask[n, t] == 0:
                                memcpy(DH2 + n * H, DH + n * H, H * sizeof(floating))
                    tmp = DH
                    DH = DH2
                    DH2 = tmp
            # dW_hh (H, H) = dz^T (H, T*N) @ hs[0:T] (T*N, H);  dW_ih = dz^T @ xt
            _weight_grad(own, &dz[0, 0, 0], &hs[0, 0, 0], &dw_hh[0, 0], T * N, H, H)
            if F > 0:
                _weight_grad(own, &dz[0, 0, 0], &xt[0, 0, 0], &dw_ih[0, 0], T * N, H, F)
                if has_dx:
                    gemm(False, False, <int>(T * N), <int>F, <int>H, <floating>1, &dz[0, 0, 0],
                         <int>H, &w_ih[0, 0], <int>F, <floating>0, &dxt[0, 0, 0], <int>F)
                    _to_batch_major(&dxt[0, 0, 0], &dx[0, 0, 0], N, T, F)
            memcpy(&db_hh[0], &db_ih[0], H * sizeof(floating))


# ---------------------------------------------------------------------------- embedding

def embedding_forward(const long long[::1] ids, const floating[:, ::1] table, floating[:, ::1] out):
    """``out[k] = table[ids[k]]``; ids must already be checked to lie in ``[0, vocab)``."""
    cdef Py_ssize_t K = ids.shape[0], D = table.shape[1], k
    _check(out.shape[0] == K and out.shape[1] == D, "embedding_forward: out shape")
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
    _check(dy.shape[0] == K and dy.shape[1] == D, "embedding_backward: dy shape")
    if V == 0 or D == 0:
        return
    with nogil:
        memset(&dtable[0, 0], 0, V * D * sizeof(floating))
        for k in range(K):
            dst = &dtable[ids[k], 0]
            src = &dy[k, 0]
            for j in range(D):
                dst[j] = dst[j] + src[j]

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""GRU kernels: forward over all time steps and BPTT backward.

GRU formulas (as ``torch.nn.GRU``, gate order r, z, n; two biases ``b_ih`` and ``b_hh``)::

    r   = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z   = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n   = tanh(W_in x_t + b_in + r * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z) * n + z * h_{t-1}

Unlike the LSTM's, the candidate ``n`` needs the input and the recurrent products of its
block apart (the reset gate multiplies only the second), so each step's pre-activations are
kept in a row of ``4H`` values, ``[a_r, a_z, a_in, a_hn]``: ``a_r``, ``a_z`` hold both
products summed, ``a_in = W_in x_t`` and ``a_hn = W_hn h_{t-1}``.  After the step's gate row
the same places hold ``r, z, n`` and ``W_hn h_{t-1} + b_hn`` (what the backward needs), and in
the backward the gradients of the four pre-activations, from which

    dW_ih = [da_r, da_z, da_in]^T @ x      dW_hh = [da_r, da_z, da_hn]^T @ h_{t-1}
    dx    = [da_r, da_z, da_in] @ W_ih     dh_{t-1} = z * dh_t + [da_r, da_z, da_hn] @ W_hh

The layout otherwise follows :mod:`sparknet._recurrent` (time-major inside, ``hs (T + 1, N, H)``,
masks: a padded step carries the state, outputs zeros and adds nothing to any gradient;
truncated BPTT: no gradient into the initial state), whose transposes, panel packing and
buffer checks this module uses.

Float32 on AVX-512 or AVX2 CPUs (:func:`sparknet._recurrent.use_step_kernel`): every product
runs on the built-in panel kernel one time step at a time, as the LSTM's fused order does: the
weights are packed once per call, each forward step computes ``a_r, a_z`` as
``x_t @ W_i^T + h_{t-1} @ W_h^T`` in one pass over the row and ``a_in``, ``a_hn`` beside them,
and each backward step's gate gradients stay in an ``(N, 4H)`` scratch, in cache, for the
step's ``dh``, weight-gradient and ``dx`` products.  Float64, or other CPUs, use the BLAS:
one product for every step's input projection before the time loop, two per step for the
recurrence, one per weight gradient after the backward loop.  The gate rows are fused C
loops (``csrc/gru_kernels.h``; float32 16 units at a time on AVX-512, 8 on AVX2 + FMA) over
the float32 rational tanh/sigmoid of ``csrc/recurrent_kernels.h``.

bfloat16 (``bf16=True``, float32 only; :mod:`sparknet._bf16`): the products of the BLAS order
take bfloat16 operands and accumulate in float32, ``W_hh``'s blocks packed once per call.
"""
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from cython cimport floating

from sparknet._blas cimport gemm
from sparknet._bf16 cimport pack_alloc
from sparknet._recurrent cimport (
    check,
    check_forward_buffers,
    init_state,
    own_kernel,
    pack_panels,
    product,
    step_grad_scratch,
    to_batch_major,
    to_time_major,
)


cdef extern from "gru_kernels.h":
    void sn_gru_fwd_f(int H, float* a, const float* b, const float* h_prev, float* h) noexcept nogil
    void sn_gru_fwd_d(int H, double* a, const double* b, const double* h_prev,
                      double* h) noexcept nogil
    void sn_gru_fwd_f16(int H, float* a, const float* b, const float* h_prev,
                        float* h) noexcept nogil
    void sn_gru_bwd_f(int H, const float* a, float* da, const float* h_prev, const float* dh_rec,
                      const float* dy, float* dh_prev, float* db) noexcept nogil
    void sn_gru_bwd_f16(int H, const float* a, float* da, const float* h_prev,
                        const float* dh_rec, const float* dy, float* dh_prev, float* db) noexcept nogil
    void sn_gru_bwd_d(int H, const double* a, double* da, const double* h_prev,
                      const double* dh_rec, const double* dy, double* dh_prev,
                      double* db) noexcept nogil
    int sn_has_avx512() noexcept nogil
    int sn_has_avx2_fma() noexcept nogil
    void sn_gru_fwd_f8(int H, float* a, const float* b, const float* h_prev,
                       float* h) noexcept nogil
    void sn_gru_bwd_f8(int H, const float* a, float* da, const float* h_prev,
                       const float* dh_rec, const float* dy, float* dh_prev, float* db) noexcept nogil
    void sn_sgemm_panels(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                         float* C, int ldc, int acc) noexcept nogil
    void sn_sgemm_panels2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                          int K2, const float* A2, int lda2, const float* Bp2, float* C,
                          int ldc, int acc) noexcept nogil
    void sn_sgemm_panels_tn(int M, int Nc, int K, const float* At, int lda,
                            const float* Bp, float* C, int ldc, int acc) noexcept nogil
    void sn_pack_panels(const float* src, int ld, int K, int Nc, float* out) noexcept nogil


# the float32 gate rows 16 or 8 units at a time on AVX-512 or AVX2 CPUs (the same formulas)
cdef int _rows_width = 16 if sn_has_avx512() else (8 if sn_has_avx2_fma() else 1)


cdef inline void _gru_fwd_row(int H, floating* a, const floating* b, const floating* h_prev,
                              floating* h) noexcept nogil:
    if floating is float:
        if _rows_width == 16:
            sn_gru_fwd_f16(H, a, b, h_prev, h)
        elif _rows_width == 8:
            sn_gru_fwd_f8(H, a, b, h_prev, h)
        else:
            sn_gru_fwd_f(H, a, b, h_prev, h)
    else:
        sn_gru_fwd_d(H, a, b, h_prev, h)


cdef inline void _gru_bwd_row(int H, const floating* a, floating* da, const floating* h_prev,
                              const floating* dh_rec, const floating* dy, floating* dh_prev,
                              floating* db) noexcept nogil:
    if floating is float:
        if _rows_width == 16:
            sn_gru_bwd_f16(H, a, da, h_prev, dh_rec, dy, dh_prev, db)
        elif _rows_width == 8:
            sn_gru_bwd_f8(H, a, da, h_prev, dh_rec, dy, dh_prev, db)
        else:
            sn_gru_bwd_f(H, a, da, h_prev, dh_rec, dy, dh_prev, db)
    else:
        sn_gru_bwd_d(H, a, da, h_prev, dh_rec, dy, dh_prev, db)


# The float32 backward's gate gradients (N, 4H) are stored with rows 4H + _PAD floats apart:
# with 4H a multiple of 256 floats, the weight-gradient products' reads of one column block
# down the N rows fell on two of the L1's 64 sets.
cdef enum:
    _PAD = 16


cdef void _free_all(void** ptrs, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        free(ptrs[i])
        ptrs[i] = NULL


# ---------------------------------------------------------------------------- forward

def gru_forward(const floating[:, :, ::1] x, const floating[:, ::1] w_ih,
                const floating[:, ::1] w_hh, const floating[::1] b_ih, const floating[::1] b_hh,
                const floating[:, ::1] h0, const unsigned char[:, ::1] mask,
                floating[:, :, ::1] xt, floating[:, :, ::1] gates, floating[:, :, ::1] hs,
                floating[:, :, ::1] y, bint bf16=False):
    """GRU forward over all ``T`` steps.

    Args:
        x: input ``(N, T, F)``, ``F > 0``.
        w_ih, w_hh, b_ih, b_hh: ``(3H, F)``, ``(3H, H)``, ``(3H,)``, ``(3H,)`` (gates r, z, n).
        h0: initial state ``(N, H)`` or None (zeros).
        mask: ``(N, T)`` uint8 (0 = padded step) or None.
        xt: scratch ``(T, N, F)``; on return ``x`` time-major (kept for the backward).
        gates: ``(T, N, 4H)``; on return ``r, z, n, W_hn h_{t-1} + b_hn`` per step and row.
        hs: ``(T + 1, N, H)``; on return the states (``hs[0] = h0``, ``hs[t+1]`` after step t).
        y: ``(N, T, H)`` per-step output (zeros at masked steps), or None.
        bf16: the products take bfloat16 operands (float32 accumulation; float32 only).
    """
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    cdef Py_ssize_t H = w_hh.shape[1], G = 3 * H
    cdef bint has_h0 = h0 is not None
    check(not bf16 or floating is float, "gru_forward: bf16 needs float32")
    check(F > 0, "gru_forward: the input has no features (F == 0)")
    check(w_ih.shape[0] == G and w_ih.shape[1] == F and w_hh.shape[0] == G and b_ih.shape[0] == G
          and b_hh.shape[0] == G, "gru_forward: weight shapes disagree (want (3H, F), (3H, H), (3H,))")
    check_forward_buffers("gru_forward", x, xt, gates, "gates", hs, h0, mask, y, 4 * H, H)
    if N == 0 or H == 0 or T == 0:
        if N > 0 and H > 0:
            init_state(&hs[0, 0, 0], &h0[0, 0] if has_h0 else NULL, N * H)
        return
    cdef bint own = floating is float and own_kernel() and not bf16
    # [b_ir + b_hr, b_iz + b_hz, b_in, b_hn] and, when own, W_ih^T and W_hh^T in panels: the
    # r, z blocks (2H columns) and the n block (H columns) apart (bf16: W_hh^T's blocks in
    # bfloat16 panels, or NULL: then the BLAS)
    cdef void* bufs[5]
    cdef floating* b = <floating*>malloc(4 * H * sizeof(floating))
    cdef Py_ssize_t j
    bufs[0] = b
    bufs[1] = bufs[2] = bufs[3] = bufs[4] = NULL
    if own:
        bufs[1] = pack_panels(&w_ih[0, 0], F, F, 2 * H, True)
        bufs[2] = pack_panels(&w_ih[2 * H, 0], F, F, H, True)
        bufs[3] = pack_panels(&w_hh[0, 0], H, H, 2 * H, True)
        bufs[4] = pack_panels(&w_hh[2 * H, 0], H, H, H, True)
    elif bf16:
        bufs[3] = pack_alloc(<const float*>&w_hh[0, 0], H, True, H, 2 * H)
        bufs[4] = pack_alloc(<const float*>&w_hh[2 * H, 0], H, True, H, H)
    if b == NULL or (own and (bufs[1] == NULL or bufs[2] == NULL or bufs[3] == NULL
                              or bufs[4] == NULL)):
        _free_all(bufs, 5)
        raise MemoryError()
    try:
        with nogil:
            for j in range(2 * H):
                b[j] = b_ih[j] + b_hh[j]
            for j in range(H):
                b[2 * H + j] = b_ih[2 * H + j]
                b[3 * H + j] = b_hh[2 * H + j]
            init_state(&hs[0, 0, 0], &h0[0, 0] if has_h0 else NULL, N * H)
            to_time_major(&x[0, 0, 0], &xt[0, 0, 0], N, T, F)
            if not own:
                # gates[:, :, 0:3H] (T*N, 3H) = xt (T*N, F) @ W_ih^T, every step at once
                product(False, True, T * N, G, F, &xt[0, 0, 0], F, &w_ih[0, 0], F, NULL, bf16,
                         False, &gates[0, 0, 0], 4 * H)
            _gru_forward_loop(x, w_hh, mask, xt, gates, hs, y, b, own, bf16, has_h0,
                              <float*>bufs[1], <float*>bufs[2], <float*>bufs[3], <float*>bufs[4])
    finally:
        _free_all(bufs, 5)


cdef void _gru_forward_loop(const floating[:, :, ::1] x, const floating[:, ::1] w_hh,
                            const unsigned char[:, ::1] mask, floating[:, :, ::1] xt,
                            floating[:, :, ::1] gates, floating[:, :, ::1] hs,
                            floating[:, :, ::1] y, const floating* b, bint own, bint bf16,
                            bint has_h0,
                            const float* wi_rz, const float* wi_n, const float* wh_rz,
                            const float* wh_n) noexcept nogil:
    """The time loop of :func:`gru_forward`: each step's products into ``gates[t]`` (the input
    projection too when ``own``), then the gate row of every unmasked batch row.  With ``bf16``
    ``wh_rz``, ``wh_n`` are W_hh^T's blocks in bfloat16 panels (or NULL)."""
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    cdef Py_ssize_t H = w_hh.shape[1], W = 4 * H
    cdef bint has_mask = mask is not None, has_y = y is not None
    cdef bint rec
    cdef Py_ssize_t t, n
    cdef floating* g
    cdef floating* h
    for t in range(T):
        g = &gates[t, 0, 0]
        h = &hs[t, 0, 0]
        rec = t > 0 or has_h0        # else h_{t-1} = 0: no recurrent product
        if own:
            # [a_r, a_z] (N, 2H) = x_t (N, F) @ W_i[rz]^T + h_{t-1} (N, H) @ W_h[rz]^T
            sn_sgemm_panels2(<int>N, <int>(2 * H), <int>F, <float*>&xt[t, 0, 0], <int>F,
                             wi_rz, <int>H if rec else 0, <float*>h, <int>H, wh_rz,
                             <float*>g, <int>W, 0)
            # a_in (N, H) = x_t @ W_in^T
            sn_sgemm_panels(<int>N, <int>H, <int>F, <float*>&xt[t, 0, 0], <int>F, wi_n,
                            <float*>g + 2 * H, <int>W, 0)
            if rec:
                # a_hn (N, H) = h_{t-1} @ W_hn^T
                sn_sgemm_panels(<int>N, <int>H, <int>H, <float*>h, <int>H, wh_n,
                                <float*>g + 3 * H, <int>W, 0)
        elif rec:
            # [a_r, a_z] (N, 2H) += h_{t-1} (N, H) @ W_h[rz]^T;  a_hn (N, H) = h_{t-1} @ W_hn^T
            product(False, True, N, 2 * H, H, h, H, &w_hh[0, 0], H, wh_rz, bf16, True, g, W)
            product(False, True, N, H, H, h, H, &w_hh[2 * H, 0], H, wh_n, bf16, False,
                     g + 3 * H, W)
        if not rec:
            for n in range(N):
                memset(g + n * W + 3 * H, 0, H * sizeof(floating))
        for n in range(N):
            if has_mask and mask[n, t] == 0:
                memcpy(&hs[t + 1, n, 0], h + n * H, H * sizeof(floating))
                if has_y:
                    memset(&y[n, t, 0], 0, H * sizeof(floating))
            else:
                _gru_fwd_row(<int>H, g + n * W, b, h + n * H, &hs[t + 1, n, 0])
                if has_y:
                    memcpy(&y[n, t, 0], &hs[t + 1, n, 0], H * sizeof(floating))


# ---------------------------------------------------------------------------- backward

def gru_backward(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                 const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                 floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                 const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                 floating[:, ::1] dh_a, floating[:, ::1] dh_b, floating[:, :, ::1] dxt,
                 floating[:, :, ::1] dx, floating[:, ::1] dw_ih, floating[:, ::1] dw_hh,
                 floating[::1] db_ih, floating[::1] db_hh, bint bf16=False):
    """BPTT through the steps of the last :func:`gru_forward` (buffers as it left them).

    Args:
        gates: what the forward left; may be overwritten, step by step, with the gradients of
            the pre-activations (so a forward is backpropagated once).
        dy: gradient of the per-step output ``(N, T, H)``, or None.
        dh_last: gradient of the final state ``(N, H)``, or None.
        dh_a, dh_b: scratch ``(N, H)``.
        dxt: scratch ``(T, N, F)`` and dx ``(N, T, F)``: the input gradient, or both None.
        dw_ih, dw_hh, db_ih, db_hh: parameter gradients, overwritten.
        bf16: the products take bfloat16 operands (float32 accumulation; float32 only).
    """
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], W = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = W // 4, G = 3 * H
    check(not bf16 or floating is float, "gru_backward: bf16 needs float32")
    cdef bint has_dy = dy is not None, has_dx = dx is not None
    check(W == 4 * H and xt.shape[0] == T and xt.shape[1] == N and w_ih.shape[0] == G
          and w_ih.shape[1] == F and w_hh.shape[0] == G and w_hh.shape[1] == H,
          "gru_backward: shapes disagree")
    check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H,
          "gru_backward: hs shape")
    check(not has_dy or (dy.shape[0] == N and dy.shape[1] == T and dy.shape[2] == H),
          "gru_backward: dy shape")
    check(dh_last is None or (dh_last.shape[0] == N and dh_last.shape[1] == H),
          "gru_backward: dh_last shape")
    check(dh_a.shape[0] == N and dh_a.shape[1] == H and dh_b.shape[0] == N and dh_b.shape[1] == H,
          "gru_backward: scratch shape")
    check(not has_dx or (dxt is not None and dxt.shape[0] == T and dxt.shape[1] == N
                         and dxt.shape[2] == F and dx.shape[0] == N and dx.shape[1] == T
                         and dx.shape[2] == F), "gru_backward: dx shape")
    check(dw_ih.shape[0] == G and dw_ih.shape[1] == F and dw_hh.shape[0] == G
          and dw_hh.shape[1] == H and db_ih.shape[0] == G and db_hh.shape[0] == G,
          "gru_backward: gradient shapes")
    check(mask is None or (mask.shape[0] == N and mask.shape[1] == T), "gru_backward: mask shape")
    cdef bint own = (floating is float and own_kernel() and T > 0 and N > 0 and H > 0 and F > 0
                     and not bf16)
    # db (4H) summed over rows and steps; when own: W_hh's r, z rows (2H, H) and n rows (H, H)
    # in panels for every step's dh product, W_ih (3H, F) for its dx product, the step's
    # states and inputs in panels, and the step's pre-activation gradients (N, 4H)
    cdef void* bufs[6]
    cdef Py_ssize_t j
    bufs[0] = malloc(4 * H * sizeof(floating) + 8)
    bufs[1] = bufs[2] = bufs[3] = bufs[4] = bufs[5] = NULL
    if own:
        bufs[1] = pack_panels(&w_hh[0, 0], H, 2 * H, H, False)
        bufs[2] = pack_panels(&w_hh[2 * H, 0], H, H, H, False)
        if has_dx:
            bufs[3] = pack_panels(&w_ih[0, 0], F, G, F, False)
        bufs[4] = step_grad_scratch(N, F, H)
        bufs[5] = malloc(N * (4 * H + _PAD) * sizeof(float))
    elif bf16 and T > 1 and N > 0 and H > 0:
        # W_hh's r, z rows (2H, H) and n rows (H, H) in bfloat16 panels (NULL: the BLAS)
        bufs[1] = pack_alloc(<const float*>&w_hh[0, 0], H, False, 2 * H, H)
        bufs[2] = pack_alloc(<const float*>&w_hh[2 * H, 0], H, False, H, H)
    if bufs[0] == NULL or (own and (bufs[1] == NULL or bufs[2] == NULL or bufs[4] == NULL
                                    or bufs[5] == NULL or (has_dx and bufs[3] == NULL))):
        _free_all(bufs, 6)
        raise MemoryError()
    cdef floating* db = <floating*>bufs[0]
    try:
        with nogil:
            memset(db, 0, 4 * H * sizeof(floating))
            if T == 0 or N == 0 or H == 0:
                memset(&dw_ih[0, 0], 0, G * F * sizeof(floating))
                memset(&dw_hh[0, 0], 0, G * H * sizeof(floating))
                if has_dx and N > 0 and T > 0 and F > 0:
                    memset(&dx[0, 0, 0], 0, N * T * F * sizeof(floating))
            else:
                _gru_backward_loop(xt, w_ih, w_hh, mask, gates, hs, dy, dh_last, dh_a, dh_b, dxt,
                                   dw_ih, dw_hh, db, own, bf16, <float*>bufs[1], <float*>bufs[2],
                                   <float*>bufs[3] if has_dx else NULL, <float*>bufs[4],
                                   <floating*>bufs[5])
                if not own:
                    _backward_products(xt, w_ih, gates, hs, dxt, dw_ih, dw_hh, has_dx, bf16)
                if has_dx:
                    to_batch_major(&dxt[0, 0, 0], &dx[0, 0, 0], N, T, F)
            # b_ih's gradient is [da_r, da_z, da_in] summed, b_hh's [da_r, da_z, da_hn]
            if H > 0:
                memcpy(&db_ih[0], db, G * sizeof(floating))
                memcpy(&db_hh[0], db, 2 * H * sizeof(floating))
                memcpy(&db_hh[2 * H], db + 3 * H, H * sizeof(floating))
    finally:
        _free_all(bufs, 6)


cdef void _gru_backward_loop(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                             const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                             floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                             const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                             floating[:, ::1] dh_a, floating[:, ::1] dh_b,
                             floating[:, :, ::1] dxt, floating[:, ::1] dw_ih,
                             floating[:, ::1] dw_hh, floating* db, bint own, bint bf16,
                             const float* wh_rz,
                             const float* wh_n, const float* wip, float* scratch,
                             floating* dgs) noexcept nogil:
    """The time loop of :func:`gru_backward`.  When ``own`` step t's pre-activation gradients go
    to ``dgs`` and its weight and input gradients are accumulated right away; otherwise they
    overwrite ``gates[t]`` and :func:`_backward_products` follows the loop.  With ``bf16``
    ``wh_rz``, ``wh_n`` are W_hh's blocks in bfloat16 panels (or NULL)."""
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], W = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = W // 4
    cdef bint has_mask = mask is not None, has_dy = dy is not None
    cdef Py_ssize_t t, n
    cdef floating* DH = &dh_a[0, 0]
    cdef floating* DH2 = &dh_b[0, 0]
    cdef floating* tmp
    cdef floating* dg
    cdef const floating* dyp = NULL
    cdef float* xp = scratch + ((H + 31) // 32) * 32 * N if own else NULL
    # the row stride of the gradients: padded in the scratch (see _PAD)
    cdef Py_ssize_t S = W + _PAD if own else W
    init_state(DH, &dh_last[0, 0] if dh_last is not None else NULL, N * H)
    for t in range(T - 1, -1, -1):
        dg = dgs if own else &gates[t, 0, 0]
        for n in range(N):
            if has_mask and mask[n, t] == 0:
                # carried state: dh passes through, no gate gradient, dy ignored
                memset(dg + n * S, 0, W * sizeof(floating))
                memcpy(DH2 + n * H, DH + n * H, H * sizeof(floating))
            else:
                if has_dy:
                    dyp = &dy[n, t, 0]
                # DH2 = z * dh (the direct path), dg = the pre-activation gradients
                _gru_bwd_row(<int>H, &gates[t, n, 0], dg + n * S, &hs[t, n, 0], DH + n * H, dyp,
                             DH2 + n * H, db)
        if t > 0:
            # dh_{t-1} (N, H) += [da_r, da_z] (N, 2H) @ W_h[rz] (2H, H) + da_hn (N, H) @ W_hn
            if own:
                # two products on the kernel that cuts K in chunks that stay in L1 (one pass of
                # K = 3H over the panels ran up to 5% slower at H = 256)
                sn_sgemm_panels(<int>N, <int>H, <int>(2 * H), <float*>dg, <int>S, wh_rz,
                                <float*>DH2, <int>H, 1)
                sn_sgemm_panels(<int>N, <int>H, <int>H, <float*>dg + 3 * H, <int>S, wh_n,
                                <float*>DH2, <int>H, 1)
            else:
                product(False, False, N, H, 2 * H, dg, W, &w_hh[0, 0], H, wh_rz, bf16, True,
                         DH2, H)
                product(False, False, N, H, H, dg + 3 * H, W, &w_hh[2 * H, 0], H, wh_n, bf16,
                         True, DH2, H)
            tmp = DH
            DH = DH2
            DH2 = tmp
        if own:
            _step_weight_grads(<float*>dg, <float*>&hs[t, 0, 0], <float*>&xt[t, 0, 0],
                               <float*>&dw_ih[0, 0], <float*>&dw_hh[0, 0], scratch, xp, N, F, H,
                               <int>S, t < T - 1)
            if wip != NULL:
                # dx_t (N, F) = [da_r, da_z, da_in] (N, 3H) @ W_ih (3H, F)
                sn_sgemm_panels(<int>N, <int>F, <int>(3 * H), <float*>dg, <int>S, wip,
                                <float*>&dxt[t, 0, 0], <int>F, 0)


cdef void _step_weight_grads(const float* dg, const float* h, const float* x, float* dw_ih,
                             float* dw_hh, float* hp, float* xp, Py_ssize_t N, Py_ssize_t F,
                             Py_ssize_t H, int lda, bint accumulate) noexcept nogil:
    """One step's share of the weight gradients on the float32 panel kernel, ``dg (N, 4H)``
    still in cache: dW_hh[r, z] (+)= [da_r, da_z]^T @ h, dW_hh[n] (+)= da_hn^T @ h,
    dW_ih (+)= [da_r, da_z, da_in]^T @ x (``dg``'s row stride ``lda``; ``hp``, ``xp``: room
    for h and x in panels)."""
    cdef int W = lda, acc = 1 if accumulate else 0
    sn_pack_panels(h, <int>H, <int>N, <int>H, hp)
    sn_sgemm_panels_tn(<int>(2 * H), <int>H, <int>N, dg, W, hp, dw_hh, <int>H, acc)
    sn_sgemm_panels_tn(<int>H, <int>H, <int>N, dg + 3 * H, W, hp, dw_hh + 2 * H * H,
                       <int>H, acc)
    sn_pack_panels(x, <int>F, <int>N, <int>F, xp)
    sn_sgemm_panels_tn(<int>(3 * H), <int>F, <int>N, dg, W, xp, dw_ih, <int>F, acc)


cdef void _backward_products(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                             const floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                             floating[:, :, ::1] dxt, floating[:, ::1] dw_ih,
                             floating[:, ::1] dw_hh, bint has_dx, bint bf16) noexcept nogil:
    """After the BLAS path's loop, one product each over all ``T*N`` rows of the
    pre-activation gradients left in ``gates (T*N, 4H)`` (in bfloat16 when ``bf16``)."""
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], W = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = W // 4
    cdef int R = <int>(T * N)
    cdef const floating* dg = &gates[0, 0, 0]
    # dW_ih (3H, F) = [da_r, da_z, da_in]^T (3H, T*N) @ xt (T*N, F)
    product(True, False, 3 * H, F, R, dg, W, &xt[0, 0, 0], F, NULL, bf16, False, &dw_ih[0, 0], F)
    # dW_hh[r, z] (2H, H) = [da_r, da_z]^T @ hs[0:T];  dW_hh[n] (H, H) = da_hn^T @ hs[0:T]
    product(True, False, 2 * H, H, R, dg, W, &hs[0, 0, 0], H, NULL, bf16, False, &dw_hh[0, 0],
             H)
    product(True, False, H, H, R, dg + 3 * H, W, &hs[0, 0, 0], H, NULL, bf16, False,
             &dw_hh[2 * H, 0], H)
    if has_dx:
        # dxt (T*N, F) = [da_r, da_z, da_in] (T*N, 3H) @ W_ih (3H, F)
        product(False, False, R, F, 3 * H, dg, W, &w_ih[0, 0], F, NULL, bf16, False,
                 &dxt[0, 0, 0], F)

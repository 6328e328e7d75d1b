# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""LSTM kernels: forward over all time steps and BPTT backward.

LSTM formulas (as ``torch.nn.LSTM``, gate order i, f, g, o; two biases ``b_ih`` and ``b_hh``)::

    a = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          (4H values: blocks i, f, g, o)
    i = sigmoid(a_i)  f = sigmoid(a_f)  g = tanh(a_g)  o = sigmoid(a_o)
    c_t = f * c_{t-1} + i * g
    h_t = o * tanh(c_t)

The layout (time-major inside, one product for every step's input projection, one per step
for the recurrence, one per weight gradient), masks and the float32 AVX-512 products are
those of :mod:`sparknet._recurrent`, which holds the code the LSTM shares with the simple RNN;
in float32 its products may take bfloat16 operands (``bf16=True``, :mod:`sparknet._bf16`), in the
order of the BLAS path (one input projection over all steps, one product per step).
The gate rows themselves are fused C loops in ``csrc/recurrent_kernels.h``.
"""
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from cython cimport floating

from sparknet._bf16 cimport pack_alloc
from sparknet._recurrent cimport (
    ON_BF16,
    all_zero,
    ON_BLAS,
    ON_PANELS,
    backward_products,
    check,
    check_forward_buffers,
    forward_buffers,
    forward_prologue,
    fused_steps,
    init_state,
    own_kernel,
    pack_panels,
    product,
    step_grad_scratch,
    step_product,
    step_weight_grads,
    times_packed,
    zero_grads,
)


cdef extern from "recurrent_kernels.h":
    void sn_lstm_fwd_f(int H, float* a, const float* b, const float* c_prev, float* c,
                       float* tc, float* h) noexcept nogil
    void sn_lstm_fwd_d(int H, double* a, const double* b, const double* c_prev, double* c,
                       double* tc, double* h) noexcept nogil
    void sn_lstm_bwd_f(int H, const float* a, float* da, const float* c_prev, const float* tc,
                       const float* dh_rec, const float* dy, float* dc, float* db) noexcept nogil
    void sn_lstm_bwd_d(int H, const double* a, double* da, const double* c_prev,
                       const double* tc, const double* dh_rec, const double* dy, double* dc,
                       double* db) noexcept nogil
    void sn_sgemm_panels(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                         float* C, int ldc, int acc) noexcept nogil
    void sn_lstm_bwd_fv(int H, const float* a, float* da, const float* c_prev, const float* tc,
                        const float* dh_rec, const float* dy, float* dc, float* db) noexcept nogil
    void sn_lstm_fwd_fv(int H, float* a, const float* b, const float* c_prev, float* c,
                        float* tc, float* h) noexcept nogil
    void sn_prefetch_f32(const float* p, int n) noexcept nogil


cdef inline void _lstm_fwd_row(int H, floating* a, const floating* b, const floating* c_prev,
                               floating* c, floating* tc, floating* h) noexcept nogil:
    if floating is float:
        # 16 or 8 units at a time on AVX-512 or AVX2 CPUs (the same formulas)
        sn_lstm_fwd_fv(H, a, b, c_prev, c, tc, h)
    else:
        sn_lstm_fwd_d(H, a, b, c_prev, c, tc, h)


cdef inline void _lstm_bwd_row(int H, const floating* a, floating* da, const floating* c_prev,
                               const floating* tc, const floating* dh_rec, const floating* dy,
                               floating* dc, floating* db) noexcept nogil:
    if floating is float:
        sn_lstm_bwd_fv(H, a, da, c_prev, tc, dh_rec, dy, dc, db)
    else:
        sn_lstm_bwd_d(H, a, da, c_prev, tc, dh_rec, dy, dc, db)


def lstm_forward(const floating[:, :, ::1] x, const floating[:, ::1] w_ih,
                 const floating[:, ::1] w_hh, const floating[::1] b_ih, const floating[::1] b_hh,
                 const floating[:, ::1] h0, const floating[:, ::1] c0,
                 const unsigned char[:, ::1] mask,
                 floating[:, :, ::1] xt, floating[:, :, ::1] gates, floating[:, :, ::1] hs,
                 floating[:, :, ::1] cs, floating[:, :, ::1] tcs, floating[:, :, ::1] y,
                 bint bf16=False):
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
        bf16: the products take bfloat16 operands (float32 accumulation; float32 only).
    """
    cdef Py_ssize_t N = x.shape[0], T = x.shape[1], F = x.shape[2]
    cdef Py_ssize_t G = w_ih.shape[0], H = w_hh.shape[1]
    check(not bf16 or floating is float, "lstm_forward: bf16 needs float32")
    cdef bint has_h0 = h0 is not None, has_c0 = c0 is not None
    cdef bint has_mask = mask is not None, has_y = y is not None
    cdef Py_ssize_t t, n
    check(G == 4 * H and w_ih.shape[1] == F and w_hh.shape[0] == G and b_ih.shape[0] == G
          and b_hh.shape[0] == G, "lstm_forward: weight shapes disagree")
    check_forward_buffers("lstm_forward", x, xt, gates, "gates", hs, h0, mask, y, G, H)
    check(cs.shape[0] == T + 1 and cs.shape[1] == N and cs.shape[2] == H, "lstm_forward: cs shape")
    check(tcs.shape[0] == T and tcs.shape[1] == N and tcs.shape[2] == H, "lstm_forward: tcs shape")
    check(not has_c0 or (c0.shape[0] == N and c0.shape[1] == H), "lstm_forward: c0 shape")
    if N == 0 or H == 0:
        return
    cdef int own = ON_BF16 if bf16 else (ON_PANELS if floating is float and own_kernel()
                                         else ON_BLAS)
    # the input projection inside each step's product (float32 AVX-512 kernel, F > 0)
    cdef bint fuse = own == ON_PANELS and fused_steps() and F > 0
    cdef floating* b = NULL
    cdef float* whT = NULL
    cdef float* wiT = NULL
    if fuse:
        forward_buffers(own, &w_hh[0, 0], H, G, &b, &whT, &w_ih[0, 0], F, &wiT)
    else:
        forward_buffers(own, &w_hh[0, 0], H, G, &b, &whT)
    try:
        with nogil:
            forward_prologue(own, &x[0, 0, 0], &w_ih[0, 0], &b_ih[0], &b_hh[0],
                             &h0[0, 0] if has_h0 else NULL, b, &xt[0, 0, 0], &gates[0, 0, 0],
                             &hs[0, 0, 0], N, T, F, G, H, not fuse)
            init_state(&cs[0, 0, 0], &c0[0, 0] if has_c0 else NULL, N * H)
            for t in range(T):
                if fuse:
                    # gates[t] (N, 4H) = x_t (N, F) @ W_ih^T + h_{t-1} (N, H) @ W_hh^T
                    step_product(&xt[t, 0, 0], F, wiT, &hs[t, 0, 0] if t > 0 or has_h0 else NULL,
                                 H, whT, N, G, &gates[t, 0, 0])
                elif t > 0 or has_h0:
                    # gates[t] (N, 4H) += h_{t-1} (N, H) @ W_hh^T
                    times_packed(own, &hs[t, 0, 0], N, H, whT, &w_hh[0, 0], True, G,
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
        free(wiT)


def lstm_backward(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                  const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                  floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                  const floating[:, :, ::1] cs, const floating[:, :, ::1] tcs,
                  const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                  const floating[:, ::1] dc_last, floating[:, ::1] dh_a, floating[:, ::1] dh_b,
                  floating[:, ::1] dc, floating[:, :, ::1] dxt, floating[:, :, ::1] dx,
                  floating[:, ::1] dw_ih, floating[:, ::1] dw_hh, floating[::1] db_ih,
                  floating[::1] db_hh, bint bf16=False):
    """BPTT through the steps of the last :func:`lstm_forward` (buffers as it left them).

    Args:
        gates: the activated gates left by the forward; may be overwritten, step by step, with
            the gradients of the gate pre-activations (so a forward is backpropagated once).
        dy: gradient of the per-step output ``(N, T, H)``, or None.
        dh_last, dc_last: gradient of the final state ``(N, H)``, or None.
        dh_a, dh_b, dc: scratch ``(N, H)``.
        dxt: scratch ``(T, N, F)`` and dx ``(N, T, F)``: the input gradient, or both None.
        dw_ih, dw_hh, db_ih, db_hh: parameter gradients, overwritten.
        bf16: the products take bfloat16 operands (float32 accumulation; float32 only).
    """
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], G = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = G // 4
    cdef bint has_mask = mask is not None, has_dy = dy is not None
    cdef bint has_dx = dx is not None
    check(not bf16 or floating is float, "lstm_backward: bf16 needs float32")
    cdef bint steps = T > 1 and N > 0 and H > 0
    cdef int own = (ON_BF16 if bf16 else ON_PANELS if floating is float and own_kernel() and steps
                    else ON_BLAS)
    cdef float* whp = NULL
    cdef float* scratch = NULL
    check(xt.shape[0] == T and xt.shape[1] == N and w_ih.shape[0] == G and w_ih.shape[1] == F
          and w_hh.shape[0] == G and w_hh.shape[1] == H, "lstm_backward: shapes disagree")
    check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H and cs.shape[0] == T + 1
          and tcs.shape[0] == T, "lstm_backward: state buffer shape")
    check(not has_dy or (dy.shape[0] == N and dy.shape[1] == T and dy.shape[2] == H),
          "lstm_backward: dy shape")
    check(dh_last is None or (dh_last.shape[0] == N and dh_last.shape[1] == H),
          "lstm_backward: dh_last shape")
    check(dc_last is None or (dc_last.shape[0] == N and dc_last.shape[1] == H),
          "lstm_backward: dc_last shape")
    check(dh_a.shape[0] == N and dh_a.shape[1] == H and dh_b.shape[0] == N and dh_b.shape[1] == H
          and dc.shape[0] == N and dc.shape[1] == H, "lstm_backward: scratch shape")
    check(not has_dx or (dxt is not None and dxt.shape[0] == T and dxt.shape[1] == N
                         and dxt.shape[2] == F and dx.shape[0] == N and dx.shape[1] == T
                         and dx.shape[2] == F), "lstm_backward: dx shape")
    check(dw_ih.shape[0] == G and dw_ih.shape[1] == F and dw_hh.shape[0] == G
          and dw_hh.shape[1] == H and db_ih.shape[0] == G and db_hh.shape[0] == G,
          "lstm_backward: gradient shapes")
    check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "lstm_backward: mask shape")
    # the fused order (see use_fused_steps): per step, the gate gradients go to a scratch
    # (N, 4H) that stays in cache for the step's dh, weight-gradient and dx products
    cdef bint fuse = own == ON_PANELS and fused_steps()
    cdef float* wip = NULL
    cdef floating* dgs = NULL
    if own == ON_BF16:
        # W_hh (4H, H) and W_ih (4H, F) in bfloat16 panels for every step's dh and dx products
        # (NULL, out of memory: those products use the BLAS)
        if steps:
            whp = <float*>pack_alloc(<float*>&w_hh[0, 0], H, False, G, H)
        if has_dx and F > 0 and N > 0:
            wip = <float*>pack_alloc(<float*>&w_ih[0, 0], F, False, G, F)
    if own == ON_PANELS:
        # W_hh (4H, H) in panels, read in place by every step's dh product
        whp = pack_panels(&w_hh[0, 0], H, G, H, False)
        if fuse:
            scratch = step_grad_scratch(N, F, H)
            dgs = <floating*>malloc(N * G * sizeof(floating))
            if has_dx and F > 0:
                # W_ih (4H, F) in panels for every step's dx product
                wip = pack_panels(&w_ih[0, 0], F, G, F, False)
        if whp == NULL or (fuse and (scratch == NULL or dgs == NULL
                                     or (has_dx and F > 0 and wip == NULL))):
            free(whp)
            free(scratch)
            free(dgs)
            free(wip)
            raise MemoryError()
    try:
        _lstm_backward_loop(xt, w_ih, w_hh, mask, gates, hs, cs, tcs, dy, dh_last, dc_last, dh_a,
                            dh_b, dc, dxt, dx, dw_ih, dw_hh, db_ih, db_hh, own, whp, scratch, dgs,
                            wip)
    finally:
        free(whp)
        free(scratch)
        free(dgs)
        free(wip)


cdef void _lstm_backward_loop(const floating[:, :, ::1] xt, const floating[:, ::1] w_ih,
                              const floating[:, ::1] w_hh, const unsigned char[:, ::1] mask,
                              floating[:, :, ::1] gates, const floating[:, :, ::1] hs,
                              const floating[:, :, ::1] cs, const floating[:, :, ::1] tcs,
                              const floating[:, :, ::1] dy, const floating[:, ::1] dh_last,
                              const floating[:, ::1] dc_last, floating[:, ::1] dh_a,
                              floating[:, ::1] dh_b, floating[:, ::1] dc, floating[:, :, ::1] dxt,
                              floating[:, :, ::1] dx, floating[:, ::1] dw_ih,
                              floating[:, ::1] dw_hh, floating[::1] db_ih, floating[::1] db_hh,
                              int own, float* whp, float* scratch, floating* dgs,
                              float* wip) noexcept:
    """The time loop of :func:`lstm_backward`.  With ``dgs`` (the fused order) step t's gate
    gradients go to ``dgs`` and its weight and input gradients are accumulated right away;
    otherwise they overwrite ``gates[t]`` and the products over all steps come after the loop,
    except in bfloat16 (``ON_BF16``): its weight and input gradients are also accumulated step by
    step, while ``gates[t]`` is in cache (``wip``: W_ih in bfloat16 panels, or NULL)."""
    cdef Py_ssize_t T = gates.shape[0], N = gates.shape[1], G = gates.shape[2]
    cdef Py_ssize_t F = xt.shape[2], H = G // 4
    cdef bint has_mask = mask is not None, has_dy = dy is not None
    cdef bint has_dx = dx is not None
    cdef bint has_dh = dh_last is not None, has_dc = dc_last is not None
    cdef bint fuse = dgs != NULL
    cdef bint steps16 = own == ON_BF16
    cdef bint h0_zero = False
    cdef Py_ssize_t t, n
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef floating* dg
    cdef const floating* dyp = NULL
    with nogil:
        memset(&db_ih[0], 0, G * sizeof(floating))
        if T == 0 or N == 0:
            zero_grads(&dw_ih[0, 0], &dw_hh[0, 0], &db_hh[0], F, G, H)
        else:
            DH = &dh_a[0, 0]
            DH2 = &dh_b[0, 0]
            init_state(DH, &dh_last[0, 0] if has_dh else NULL, N * H)
            init_state(&dc[0, 0], &dc_last[0, 0] if has_dc else NULL, N * H)
            if (fuse or steps16) and F == 0:
                memset(&dw_ih[0, 0], 0, G * F * sizeof(floating))
            # a zero initial state (no h0, not stateful) adds nothing to dW_hh at step 0
            h0_zero = fuse and all_zero(&hs[0, 0, 0], N * H)
            for t in range(T - 1, -1, -1):
                dg = dgs if fuse else &gates[t, 0, 0]
                for n in range(N):
                    if has_mask and mask[n, t] == 0:
                        # carried state: dh and dc pass through, no gate gradient, dy ignored
                        memset(dg + n * G, 0, G * sizeof(floating))
                    else:
                        if has_dy:
                            dyp = &dy[n, t, 0]
                        if floating is float and n + 1 < N:
                            # the next row's gates and cell states, from L3, during this row
                            sn_prefetch_f32(&gates[t, n + 1, 0], <int>G)
                            sn_prefetch_f32(&cs[t, n + 1, 0], <int>H)
                            sn_prefetch_f32(&tcs[t, n + 1, 0], <int>H)
                        _lstm_bwd_row(<int>H, &gates[t, n, 0], dg + n * G, &cs[t, n, 0],
                                      &tcs[t, n, 0], DH + n * H, dyp, &dc[n, 0], &db_ih[0])
                if t > 0:
                    # dh_{t-1} (N, H) = dgates[t] (N, 4H) @ W_hh (4H, H)
                    times_packed(own, dg, N, G, whp, &w_hh[0, 0], False, H, DH2, False)
                    if has_mask:
                        for n in range(N):
                            if mask[n, t] == 0:
                                memcpy(DH2 + n * H, DH + n * H, H * sizeof(floating))
                    tmp = DH
                    DH = DH2
                    DH2 = tmp
                if fuse:
                    # dW_hh += dgates[t]^T @ h_{t-1}, dW_ih += dgates[t]^T @ x_t (dgates[t] in cache)
                    step_weight_grads(dg, &hs[t, 0, 0], &xt[t, 0, 0], &dw_hh[0, 0], &dw_ih[0, 0],
                                      scratch, N, F, G, H, t < T - 1, t == 0 and h0_zero)
                    if wip != NULL:
                        # dx_t (N, F) = dgates[t] (N, 4H) @ W_ih (4H, F)
                        sn_sgemm_panels(<int>N, <int>F, <int>G, <float*>dg, <int>G, wip,
                                        <float*>&dxt[t, 0, 0], <int>F, 0)
                elif steps16:
                    # dW_hh (+)= dgates[t]^T @ h_{t-1}, dW_ih (+)= dgates[t]^T @ x_t and
                    # dx_t = dgates[t] @ W_ih, in bfloat16
                    product(True, False, G, H, N, dg, G, &hs[t, 0, 0], H, NULL, True, t < T - 1,
                            &dw_hh[0, 0], H)
                    if F > 0:
                        product(True, False, G, F, N, dg, G, &xt[t, 0, 0], F, NULL, True,
                                t < T - 1, &dw_ih[0, 0], F)
                        if has_dx:
                            product(False, False, N, F, G, dg, G, &w_ih[0, 0], F, wip, True,
                                    False, &dxt[t, 0, 0], F)
            backward_products(own, &gates[0, 0, 0], &hs[0, 0, 0], &xt[0, 0, 0], &w_ih[0, 0],
                              &dw_ih[0, 0], &dw_hh[0, 0], &db_ih[0], &db_hh[0],
                              &dxt[0, 0, 0] if has_dx else NULL, &dx[0, 0, 0] if has_dx else NULL,
                              N, T, F, G, H, fuse or steps16)

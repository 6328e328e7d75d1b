# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Simple RNN kernels: forward over all time steps and BPTT backward.

``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)`` (as ``torch.nn.RNN``), with ``act`` one of
identity, relu, tanh, sigmoid.

The layout (time-major inside, one product for every step's input projection, one per step
for the recurrence, one per weight gradient), masks and the float32 AVX-512 products are
those of :mod:`sparknet._recurrent`, which holds the code the RNN shares with the LSTM.
The activation rows themselves are fused C loops in ``csrc/recurrent_kernels.h``.
"""
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from cython cimport floating

from sparknet._recurrent cimport (
    backward_products,
    check,
    check_forward_buffers,
    forward_buffers,
    forward_prologue,
    init_state,
    own_kernel,
    pack_panels,
    times_packed,
    zero_grads,
)


cdef extern from "recurrent_kernels.h":
    void sn_rnn_fwd_f(int H, int act, const float* z, const float* b, float* h) noexcept nogil
    void sn_rnn_fwd_d(int H, int act, const double* z, const double* b, double* h) noexcept nogil
    void sn_rnn_bwd_f(int H, int act, const float* h, const float* dh_rec, const float* dy,
                      float* dz, float* db) noexcept nogil
    void sn_rnn_bwd_d(int H, int act, const double* h, const double* dh_rec, const double* dy,
                      double* dz, double* db) noexcept nogil


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
    cdef Py_ssize_t t, n
    check(act in (0, 1, 2, 3), "rnn_forward: activation must be identity, relu, tanh or sigmoid")
    check(w_ih.shape[0] == H and w_ih.shape[1] == F and w_hh.shape[1] == H and b_ih.shape[0] == H
          and b_hh.shape[0] == H, "rnn_forward: weight shapes disagree")
    check_forward_buffers("rnn_forward", x, xt, zs, "zs", hs, h0, mask, y, H, H)
    if N == 0 or H == 0:
        return
    cdef bint own = floating is float and own_kernel()
    cdef floating* b = NULL
    cdef float* whT = NULL
    forward_buffers(own, &w_hh[0, 0], H, H, &b, &whT)
    try:
        with nogil:
            forward_prologue(own, &x[0, 0, 0], &w_ih[0, 0], &b_ih[0], &b_hh[0],
                             &h0[0, 0] if has_h0 else NULL, b, &xt[0, 0, 0], &zs[0, 0, 0],
                             &hs[0, 0, 0], N, T, F, H, H)
            for t in range(T):
                if t > 0 or has_h0:
                    # zs[t] (N, H) += h_{t-1} (N, H) @ W_hh^T
                    times_packed(own, &hs[t, 0, 0], N, H, whT, &w_hh[0, 0], True, H,
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
    cdef bint own = floating is float and own_kernel() and T > 0 and N > 0 and H > 0
    cdef float* whp = NULL
    check(xt.shape[0] == T and xt.shape[1] == N and w_ih.shape[0] == H and w_ih.shape[1] == F
          and w_hh.shape[0] == H and w_hh.shape[1] == H, "rnn_backward: shapes disagree")
    check(hs.shape[0] == T + 1 and hs.shape[1] == N and hs.shape[2] == H, "rnn_backward: hs shape")
    check(not has_dy or (dy.shape[0] == N and dy.shape[1] == T and dy.shape[2] == H),
          "rnn_backward: dy shape")
    check(dh_last is None or (dh_last.shape[0] == N and dh_last.shape[1] == H),
          "rnn_backward: dh_last shape")
    check(dh_a.shape[0] == N and dh_a.shape[1] == H and dh_b.shape[0] == N and dh_b.shape[1] == H,
          "rnn_backward: scratch shape")
    check(not has_dx or (dxt is not None and dxt.shape[0] == T and dxt.shape[1] == N
                         and dxt.shape[2] == F and dx.shape[0] == N and dx.shape[1] == T
                         and dx.shape[2] == F), "rnn_backward: dx shape")
    check(dw_ih.shape[0] == H and dw_ih.shape[1] == F and dw_hh.shape[0] == H
          and dw_hh.shape[1] == H and db_ih.shape[0] == H and db_hh.shape[0] == H,
          "rnn_backward: gradient shapes")
    check(act in (0, 1, 2, 3), "rnn_backward: bad activation id")
    check(not has_mask or (mask.shape[0] == N and mask.shape[1] == T), "rnn_backward: mask shape")
    if own:
        # W_hh (H, H) in panels, read in place by every step's dh product
        whp = pack_panels(&w_hh[0, 0], H, H, H, False)
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
    cdef bint has_dh = dh_last is not None
    cdef Py_ssize_t t, n
    cdef floating* DH
    cdef floating* DH2
    cdef floating* tmp
    cdef const floating* dyp = NULL
    with nogil:
        memset(&db_ih[0], 0, H * sizeof(floating))
        if T == 0 or N == 0:
            zero_grads(&dw_ih[0, 0], &dw_hh[0, 0], &db_hh[0], F, H, H)
        else:
            DH = &dh_a[0, 0]
            DH2 = &dh_b[0, 0]
            init_state(DH, &dh_last[0, 0] if has_dh else NULL, N * H)
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
                    times_packed(own, &dz[t, 0, 0], N, H, whp, &w_hh[0, 0], False, H, DH2, False)
                    if has_mask:
                        for n in range(N):
                            if mask[n, t] == 0:
                                memcpy(DH2 + n * H, DH + n * H, H * sizeof(floating))
                    tmp = DH
                    DH = DH2
                    DH2 = tmp
            backward_products(own, &dz[0, 0, 0], &hs[0, 0, 0], &xt[0, 0, 0], &w_ih[0, 0],
                              &dw_ih[0, 0], &dw_hh[0, 0], &db_ih[0], &db_hh[0],
                              &dxt[0, 0, 0] if has_dx else NULL, &dx[0, 0, 0] if has_dx else NULL,
                              N, T, F, H, H)

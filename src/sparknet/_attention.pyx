# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Multi-head scaled dot-product attention kernels: the per-(sample, head) products with
BLAS and a fused masked softmax (with attention dropout) in nogil loops.

Shapes (row-major), for N samples of T tokens, H heads of width dk, D = H dk:

- ``QKV`` (N T, 3 D): the projected queries, keys and values of every token, as one
  ``x @ in_proj_weight.T + in_proj_bias`` (``torch.nn.MultiheadAttention``'s layout:
  Q in columns ``[0, D)``, K in ``[D, 2 D)``, V in ``[2 D, 3 D)``, head h at ``h dk``).
  Each head's Q, K and V are read in place as (T, dk) blocks with leading dimension 3 D.
- ``P`` (N, H, T, T): the attention weights ``softmax(scale Q K^T + masks)``.
- ``Pd`` (N, H, T, T) or None: on entry uniforms in [0, 1); on return the weights after
  dropout, ``P * [u < keep] / keep`` (what multiplies V).
- ``A`` (N T, D): the heads' outputs ``Pd V`` side by side, the input of the output
  projection.

Masks: ``mask`` (N, T), 1 for a real token, or None.  A padded key gets weight 0; a padded
query's row of weights is 0 (so its output row is 0); with ``causal`` query i sees keys
j <= i only.  A query that sees no key at all gets a row of zeros (PyTorch would give NaN).
"""
from cython cimport floating
from sparknet._blas cimport gemm
# sn_expf, sn_self, sn_seld are called from the C code below
from sparknet._activations cimport sn_expf, sn_self, sn_seld

cdef extern from *:
    """
    #include <math.h>
    #include <string.h>
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
        && (__GNUC__ >= 11)
    #define SN_ATT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", \
                                                       "default")))
    #else
    #define SN_ATT_CLONES
    #endif

    /* Rows of attention weights.  Reductions run in 8 lanes (so they vectorise too).
       softmax: row[0:lim] holds scores on entry and the softmax over the keys j < lim with
       m[j] != 0 (all when m is NULL) on exit, the other entries of row[0:n] become 0;
       returns 0 (with a zero row) when no key is seen.
       softmax_back: g <- scale * p * (g' - <g', p>), with g' = g, or g [pd != 0] / keep
       through dropout (pd not NULL, inv_keep = 1 / keep). */
    #define SN_ATT_ROWS(T, S, EXP)                                                          \
    SN_ATT_CLONES static int sn_att_softmax_##S(T* restrict row, int lim, int n,            \
                                                const unsigned char* restrict m) {          \
        T lane[8], mx, s;                                                                   \
        int j, k, seen = lim > 0;                                                           \
        if (m) {                                                                            \
            seen = 0;                                                                       \
            for (j = 0; j < lim; j++) {                                                     \
                seen |= m[j];                                                               \
                row[j] = m[j] ? row[j] : -INFINITY;                                         \
            }                                                                               \
        }                                                                                   \
        if (!seen) {                                                                        \
            memset(row, 0, (size_t)n * sizeof(T));                                          \
            return 0;                                                                       \
        }                                                                                   \
        for (k = 0; k < 8; k++) lane[k] = -INFINITY;                                        \
        for (j = 0; j + 8 <= lim; j += 8)                                                   \
            for (k = 0; k < 8; k++) lane[k] = row[j + k] > lane[k] ? row[j + k] : lane[k];  \
        mx = -INFINITY;                                                                     \
        for (k = 0; k < 8; k++) mx = lane[k] > mx ? lane[k] : mx;                           \
        for (; j < lim; j++) mx = row[j] > mx ? row[j] : mx;                                \
        for (j = 0; j < lim; j++) row[j] = EXP(row[j] - mx);    /* masked: e^-inf = 0 */     \
        for (k = 0; k < 8; k++) lane[k] = 0;                                                \
        for (j = 0; j + 8 <= lim; j += 8)                                                   \
            for (k = 0; k < 8; k++) lane[k] += row[j + k];                                  \
        s = 0;                                                                              \
        for (k = 0; k < 8; k++) s += lane[k];                                               \
        for (; j < lim; j++) s += row[j];                                                   \
        s = 1 / s;                                                                          \
        for (j = 0; j < lim; j++) row[j] *= s;                                              \
        for (j = lim; j < n; j++) row[j] = 0;                                               \
        return 1;                                                                           \
    }                                                                                       \
    SN_ATT_CLONES static void sn_att_softmax_back_##S(T* restrict g, const T* restrict p,   \
                                                      const T* restrict pd, int n,          \
                                                      T inv_keep, T scale) {                \
        T lane[8], s;                                                                       \
        int j, k;                                                                           \
        if (pd)                                                                             \
            for (j = 0; j < n; j++) g[j] = sn_sel##S(pd[j] != 0, g[j] * inv_keep, 0);     \
        for (k = 0; k < 8; k++) lane[k] = 0;                                                \
        for (j = 0; j + 8 <= n; j += 8)                                                     \
            for (k = 0; k < 8; k++) lane[k] += g[j + k] * p[j + k];                         \
        s = 0;                                                                              \
        for (k = 0; k < 8; k++) s += lane[k];                                               \
        for (; j < n; j++) s += g[j] * p[j];                                                \
        for (j = 0; j < n; j++) g[j] = scale * p[j] * (g[j] - s);                           \
    }
    SN_ATT_ROWS(float, f, sn_expf)      /* sn_expf: _activations.pxd */
    SN_ATT_ROWS(double, d, exp)
    """
    int sn_att_softmax_f(float* row, int lim, int n, const unsigned char* m) noexcept nogil
    int sn_att_softmax_d(double* row, int lim, int n, const unsigned char* m) noexcept nogil
    void sn_att_softmax_back_f(float* g, const float* p, const float* pd, int n,
                               float inv_keep, float scale) noexcept nogil
    void sn_att_softmax_back_d(double* g, const double* p, const double* pd, int n,
                               double inv_keep, double scale) noexcept nogil


cdef inline void _softmax_row(floating* row, Py_ssize_t lim, Py_ssize_t n,
                              const unsigned char* m) noexcept nogil:
    if floating is float:
        sn_att_softmax_f(row, <int>lim, <int>n, m)
    else:
        sn_att_softmax_d(row, <int>lim, <int>n, m)


cdef void _masked_softmax(floating* S, Py_ssize_t T, const unsigned char* m, bint causal,
                          floating* R, floating keep) noexcept nogil:
    """Rows of the (T, T) scores ``S`` become attention weights, in place.

    ``m`` (T,) is the sample's token mask or NULL.  ``R`` (T, T), when not NULL, holds
    uniforms and becomes the weights after dropout with keep probability ``keep``."""
    cdef Py_ssize_t i, j
    cdef floating inv_keep = 1 / keep
    cdef floating* row
    cdef floating* r
    for i in range(T):
        row = S + i * T
        if m != NULL and not m[i]:                    # a padded query attends to nothing
            for j in range(T):
                row[j] = 0
        else:
            # p_j = exp(s_j - max) / sum_k exp(s_k - max) over the keys the query sees
            _softmax_row(row, i + 1 if causal else T, T, m)
        if R != NULL:
            # dropout: pd_j = p_j [u_j < keep] / keep
            r = R + i * T
            for j in range(T):
                if floating is float:
                    r[j] = sn_self(r[j] < keep, row[j] * inv_keep, 0)
                else:
                    r[j] = sn_seld(r[j] < keep, row[j] * inv_keep, 0)


def forward(const floating[:, ::1] QKV, const unsigned char[:, ::1] mask, bint causal,
            floating scale, floating[:, :, :, ::1] P, floating[:, :, :, ::1] Pd,
            floating keep, floating[:, ::1] A):
    """Attention weights ``P`` (and ``Pd`` after dropout, when given) and the heads'
    outputs ``A``; see the module docstring for the shapes.  ``scale`` multiplies the
    scores (``1 / sqrt(dk)``); ``mask`` may be None."""
    cdef Py_ssize_t N = P.shape[0], H = P.shape[1], T = P.shape[2]
    cdef Py_ssize_t D = A.shape[1], dk, n, h, D3
    cdef bint has_m = mask is not None
    cdef bint has_d = Pd is not None
    cdef const unsigned char* m = NULL
    cdef floating* S
    cdef floating* W
    cdef floating* R = NULL
    cdef const floating* base
    if H == 0 or D % H or P.shape[3] != T or A.shape[0] != N * T:
        raise ValueError("attention forward: P must be (N, H, T, T) and A (N T, H dk)")
    dk = D // H
    D3 = 3 * D
    if QKV.shape[0] != N * T or QKV.shape[1] != D3:
        raise ValueError(f"attention forward: QKV must be ({N * T}, {D3}), got "
                         f"({QKV.shape[0]}, {QKV.shape[1]})")
    if has_m and (mask.shape[0] != N or mask.shape[1] != T):
        raise ValueError(f"attention forward: mask must be ({N}, {T})")
    if has_d and (Pd.shape[0] != N or Pd.shape[1] != H or Pd.shape[2] != T or Pd.shape[3] != T):
        raise ValueError("attention forward: Pd must have the shape of P")
    if has_d and not (0 < keep <= 1):
        raise ValueError(f"attention forward: keep must be in (0, 1], got {keep}")
    if N == 0 or T == 0 or dk == 0:
        return
    with nogil:
        for n in range(N):
            base = &QKV[n * T, 0]
            if has_m:
                m = &mask[n, 0]
            for h in range(H):
                S = &P[n, h, 0, 0]
                # S (T, T) = scale * Q_h (T, dk) @ K_h^T (dk, T)
                gemm(False, True, <int>T, <int>T, <int>dk, scale, base + h * dk, <int>D3,
                     base + D + h * dk, <int>D3, 0, S, <int>T)
                if has_d:
                    R = &Pd[n, h, 0, 0]
                _masked_softmax(S, T, m, causal, R, keep)
                W = R if has_d else S
                # A[:, h] (T, dk) = W (T, T) @ V_h (T, dk)
                gemm(False, False, <int>T, <int>dk, <int>T, 1, W, <int>T,
                     base + 2 * D + h * dk, <int>D3, 0, &A[n * T, h * dk], <int>D)


def backward(const floating[:, ::1] QKV, floating scale, const floating[:, :, :, ::1] P,
             const floating[:, :, :, ::1] Pd, floating keep, const floating[:, ::1] dA,
             floating[:, ::1] dQKV, floating[:, ::1] scratch):
    """Backward of :func:`forward`: ``dQKV`` (N T, 3 D) from ``dA`` (N T, D), overwritten.

    Per sample and head, with W the weights that multiplied V (``Pd`` or ``P``):
    ``dV = W^T dO``, ``dW = dO V^T``, through dropout ``dP = dW [Pd != 0] / keep``, through
    the softmax ``dS = P (dP - rowsum(dP P)) scale``, ``dQ = dS K``, ``dK = dS^T Q``.  The
    masks need no argument: masked weights are 0, so they pass no gradient.  ``scratch``
    is a (T, T) buffer."""
    cdef Py_ssize_t N = P.shape[0], H = P.shape[1], T = P.shape[2]
    cdef Py_ssize_t D = dA.shape[1], dk, n, h, i, D3
    cdef bint has_d = Pd is not None
    cdef floating inv_keep = 1 / keep
    cdef floating* G
    cdef const floating* pd
    cdef const floating* W
    cdef const floating* base
    cdef floating* dbase
    if H == 0 or D % H or P.shape[3] != T or dA.shape[0] != N * T:
        raise ValueError("attention backward: P must be (N, H, T, T) and dA (N T, H dk)")
    dk = D // H
    D3 = 3 * D
    if (QKV.shape[0] != N * T or QKV.shape[1] != D3 or dQKV.shape[0] != N * T
            or dQKV.shape[1] != D3):
        raise ValueError(f"attention backward: QKV and dQKV must be ({N * T}, {D3})")
    if scratch.shape[0] != T or scratch.shape[1] != T:
        raise ValueError(f"attention backward: scratch must be ({T}, {T})")
    if has_d and (Pd.shape[0] != N or Pd.shape[1] != H or Pd.shape[2] != T or Pd.shape[3] != T):
        raise ValueError("attention backward: Pd must have the shape of P")
    if N == 0 or T == 0 or dk == 0:
        return
    G = &scratch[0, 0]
    with nogil:
        for n in range(N):
            base = &QKV[n * T, 0]
            dbase = &dQKV[n * T, 0]
            for h in range(H):
                W = &Pd[n, h, 0, 0] if has_d else &P[n, h, 0, 0]
                # dV_h (T, dk) = W^T (T, T) @ dO_h (T, dk)
                gemm(True, False, <int>T, <int>dk, <int>T, 1, W, <int>T,
                     &dA[n * T, h * dk], <int>D, 0, dbase + 2 * D + h * dk, <int>D3)
                # G (T, T) = dO_h (T, dk) @ V_h^T (dk, T)
                gemm(False, True, <int>T, <int>T, <int>dk, 1, &dA[n * T, h * dk], <int>D,
                     base + 2 * D + h * dk, <int>D3, 0, G, <int>T)
                for i in range(T):
                    # through dropout, dP = dW [pd != 0] / keep, and through the softmax,
                    # dS = scale * P (dP - <dP, P>)
                    pd = &Pd[n, h, i, 0] if has_d else NULL
                    if floating is float:
                        sn_att_softmax_back_f(G + i * T, &P[n, h, i, 0], pd, <int>T,
                                              inv_keep, scale)
                    else:
                        sn_att_softmax_back_d(G + i * T, &P[n, h, i, 0], pd, <int>T,
                                              inv_keep, scale)
                # dQ_h (T, dk) = dS (T, T) @ K_h (T, dk)
                gemm(False, False, <int>T, <int>dk, <int>T, 1, G, <int>T,
                     base + D + h * dk, <int>D3, 0, dbase + h * dk, <int>D3)
                # dK_h (T, dk) = dS^T (T, T) @ Q_h (T, dk)
                gemm(True, False, <int>T, <int>dk, <int>T, 1, G, <int>T,
                     base + h * dk, <int>D3, 0, dbase + D + h * dk, <int>D3)

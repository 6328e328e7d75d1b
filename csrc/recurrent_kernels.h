/* Recurrent-layer kernels in plain C, included by src/sparknet/_recurrent.pyx, _rnn.pyx and _lstm.pyx:
 * the fused LSTM/RNN gate rows (forward and backward, float and double), branch-free
 * float32 tanh/sigmoid, and a float32 AVX-512 GEMM over B packed in 32-column panels
 * (the recurrent weights are packed once per call and reused at every time step),
 * chosen at run time; other CPUs use the BLAS.
 */
#ifndef SPARKNET_RECURRENT_KERNELS_H
#define SPARKNET_RECURRENT_KERNELS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && (__GNUC__ >= 11)
#define SN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SN_CLONES
#endif
/* each including module uses some of these static functions, not all */
#if defined(__GNUC__)
#define SN_UNUSED __attribute__((unused))
#else
#define SN_UNUSED
#endif
/* the gate blocks of one row are H apart and never overlap: let the compiler vectorise */
#if defined(__GNUC__) && !defined(__clang__)
#define SN_IVDEP _Pragma("GCC ivdep")
#else
#define SN_IVDEP
#endif

/* float32 tanh: odd/even rational approximation on [-7.905, 7.905] (clamped outside),
   max abs error 3.5e-7; branch free, so loops over it vectorise.  SN_TANH_RATIONAL is its
   body for an x already clamped, of type T: float here, a 16-float vector in sn_tanh16
   (GCC's vector arithmetic takes the scalar constants), so the two give the same bits. */
#define SN_TANH_RATIONAL(T, x)                                              \
    T x2 = x * x;                                                           \
    T p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;             \
    p = x2 * p + -8.60467152213735e-11f;                                    \
    p = x2 * p + 5.12229709037114e-08f;                                     \
    p = x2 * p + 1.48572235717979e-05f;                                     \
    p = x2 * p + 6.37261928875436e-04f;                                     \
    p = x2 * p + 4.89352455891786e-03f;                                     \
    p = x * p;                                                              \
    T q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;             \
    q = x2 * q + 2.26843463243900e-03f;                                     \
    q = x2 * q + 4.89352518554385e-03f;                                     \
    return p / q;
static inline float sn_tanh_f(float x) {
    const float lim = 7.90531110763549805f;
    x = x > lim ? lim : x;
    x = x < -lim ? -lim : x;
    SN_TANH_RATIONAL(float, x)
}
static inline float sn_sigm_f(float x) { return 0.5f + 0.5f * sn_tanh_f(0.5f * x); }
static inline double sn_tanh_d(double x) { return tanh(x); }
static inline double sn_sigm_d(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

/* The LSTM backward step's gate gradients for unit j, given its hidden-state gradient dh
 * (one body for both loops of SN_DEFINE's LSTM backward, with and without an output
 * gradient dy, so that neither loop branches per unit). */
#define SN_LSTM_GATE_GRADS(T) {                                                            \
    T i = ai[j], f = af[j], g = ag[j], o = ao[j], t = tc[j];                               \
    T dcj = dc[j] + dh * o * (1 - t * t);                                                  \
    T d_o = dh * t * o * (1 - o);                                                          \
    T d_i = dcj * g * i * (1 - i);                                                         \
    T d_g = dcj * i * (1 - g * g);                                                         \
    T d_f = dcj * c_prev[j] * f * (1 - f);                                                 \
    dc[j] = dcj * f;                                                                       \
    dai[j] = d_i; daf[j] = d_f; dag[j] = d_g; dao[j] = d_o;                                \
    dbi[j] += d_i; dbf[j] += d_f; dbg[j] += d_g; dbo[j] += d_o;                            \
}

/* Ask for the n floats at p in the L1 cache (one hint per 64-byte line; a hint never faults).
   The LSTM backward reads each row's gates, written by the forward long before and fallen to
   L3: the next row's, asked for while this row computes, arrive in time (a row's four gate
   loads waited on L3 for over half of the backward gate row's time on a Zen 5). */
SN_UNUSED static inline void sn_prefetch_f32(const float* p, int n) {
    for (int k = 0; k < n; k += 16) __builtin_prefetch(p + k, 0, 3);
}

/* activation ids as in _activations.pxd: 0 identity, 1 relu, 2 tanh, 3 sigmoid */
#define SN_DEFINE(T, S, ATTR)                                                              \
/* LSTM forward of one row: a (4H) holds W_ih x + W_hh h (without bias) on entry and     \
   i, f, g, o on exit; writes c, tanh(c), h. */                                            \
ATTR SN_UNUSED static void sn_lstm_fwd_##S(int H, T* restrict a, const T* restrict b,               \
                                 const T* restrict c_prev, T* restrict c,                  \
                                 T* restrict tc, T* restrict h) {                          \
    T* restrict ai = a; T* restrict af = a + H; T* restrict ag = a + 2 * H;                \
    T* restrict ao = a + 3 * H;                                                            \
    const T* restrict bi = b; const T* restrict bf = b + H;                                \
    const T* restrict bg = b + 2 * H; const T* restrict bo = b + 3 * H;                    \
    SN_IVDEP for (int j = 0; j < H; j++) {                                                          \
        T i = sn_sigm_##S(ai[j] + bi[j]);                                                  \
        T f = sn_sigm_##S(af[j] + bf[j]);                                                  \
        T g = sn_tanh_##S(ag[j] + bg[j]);                                                  \
        T o = sn_sigm_##S(ao[j] + bo[j]);                                                  \
        T cj = f * c_prev[j] + i * g;                                                      \
        T t = sn_tanh_##S(cj);                                                             \
        ai[j] = i; af[j] = f; ag[j] = g; ao[j] = o;                                        \
        c[j] = cj; tc[j] = t; h[j] = o * t;                                                \
    }                                                                                      \
}                                                                                          \
/* LSTM backward of one row: a (4H) holds the gates i, f, g, o; their pre-activation       \
   gradients go to da (4H), which may be a itself (each j reads its four gates before     \
   writing).  dh = dh_rec + dy (dy may be NULL); dc in/out (d/dc_t on entry, d/dc_{t-1}   \
   on exit); the gate gradients are added to db. */                                        \
ATTR SN_UNUSED static void sn_lstm_bwd_##S(int H, const T* a, T* da, const T* restrict c_prev,      \
                                 const T* restrict tc, const T* restrict dh_rec,           \
                                 const T* restrict dy, T* restrict dc, T* restrict db) {   \
    const T* ai = a; const T* af = a + H; const T* ag = a + 2 * H; const T* ao = a + 3 * H; \
    T* dai = da; T* daf = da + H; T* dag = da + 2 * H; T* dao = da + 3 * H;                \
    T* restrict dbi = db; T* restrict dbf = db + H; T* restrict dbg = db + 2 * H;          \
    T* restrict dbo = db + 3 * H;                                                          \
    if (dy) {                                                                              \
        SN_IVDEP for (int j = 0; j < H; j++) {                                                      \
            T dh = dh_rec[j] + dy[j];                                                      \
            SN_LSTM_GATE_GRADS(T)                                                          \
        }                                                                                  \
    } else {                                                                               \
        SN_IVDEP for (int j = 0; j < H; j++) {                                                      \
            T dh = dh_rec[j];                                                              \
            SN_LSTM_GATE_GRADS(T)                                                          \
        }                                                                                  \
    }                                                                                      \
}                                                                                          \
/* RNN forward of one row: z (H) = W_ih x + W_hh h on entry; h = act(z + b) written. */    \
ATTR SN_UNUSED static void sn_rnn_fwd_##S(int H, int act, const T* restrict z, const T* restrict b, \
                                T* restrict h) {                                           \
    int j;                                                                                 \
    if (act == 2) { SN_IVDEP for (j = 0; j < H; j++) h[j] = sn_tanh_##S(z[j] + b[j]); }              \
    else if (act == 1) { SN_IVDEP for (j = 0; j < H; j++) { T v = z[j] + b[j]; h[j] = v > 0 ? v : 0; } } \
    else if (act == 3) { SN_IVDEP for (j = 0; j < H; j++) h[j] = sn_sigm_##S(z[j] + b[j]); }         \
    else { SN_IVDEP for (j = 0; j < H; j++) h[j] = z[j] + b[j]; }                                   \
}                                                                                          \
/* RNN backward of one row: dz = (dh_rec + dy) * act'(.) through the output h;           \
   writes dz and adds it to db. */                                                         \
ATTR SN_UNUSED static void sn_rnn_bwd_##S(int H, int act, const T* restrict h,                      \
                                const T* restrict dh_rec, const T* restrict dy,            \
                                T* restrict dz, T* restrict db) {                          \
    int j;                                                                                 \
    if (dy) { SN_IVDEP for (j = 0; j < H; j++) dz[j] = dh_rec[j] + dy[j]; }                          \
    else { SN_IVDEP for (j = 0; j < H; j++) dz[j] = dh_rec[j]; }                                     \
    if (act == 2) { SN_IVDEP for (j = 0; j < H; j++) dz[j] *= 1 - h[j] * h[j]; }                     \
    else if (act == 1) { SN_IVDEP for (j = 0; j < H; j++) dz[j] = h[j] > 0 ? dz[j] : 0; }           \
    else if (act == 3) { SN_IVDEP for (j = 0; j < H; j++) dz[j] *= h[j] * (1 - h[j]); }              \
    SN_IVDEP for (j = 0; j < H; j++) db[j] += dz[j];                                                \
}

SN_DEFINE(float, f, SN_CLONES)
SN_DEFINE(double, d, )

/* ---- float32 products of the recurrent steps, without packing, for AVX-512 CPUs ----
   C[M x Nc] (+)= A[M x K] @ B[K x Nc], all row-major with leading dimensions.  The
   per-step recurrent product re-reads the same weight matrix T times; a BLAS packs it
   again at every call, this kernel reads it in place (kept in L1/L2 across steps).
   Register block: 8 rows x 32 columns (16 zmm accumulators); masked edge columns. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SN_HAVE_AVX512 1
#define SN_ROW_FMA(r) { __m512 a_ = _mm512_set1_ps(A[(r) * lda + k]);                \
                        c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                    \
                        c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1); }
#define SN_ROW_LOAD(r) { if (acc) { c##r##0 = _mm512_maskz_loadu_ps(m0, C + (r) * ldc);      \
                                   c##r##1 = _mm512_maskz_loadu_ps(m1, C + (r) * ldc + 16); } \
                         else { c##r##0 = _mm512_setzero_ps(); c##r##1 = _mm512_setzero_ps(); } }
#define SN_ROW_STORE(r) { _mm512_mask_storeu_ps(C + (r) * ldc, m0, c##r##0);               \
                          _mm512_mask_storeu_ps(C + (r) * ldc + 16, m1, c##r##1); }

/* One 8 x 32 block of C over two products, A (K rows) @ B then A2 (K2 rows) @ B2 (K2 may be
   0), so that a recurrent step's input and state products share one pass over C. */
__attribute__((target("avx512f")))
static void sn_block8_avx512(int K, const float* A, int lda, const float* B, int K2,
                             const float* A2, int lda2, const float* B2, float* C, int ldc,
                             int acc, __mmask16 m0, __mmask16 m1) {
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71;
    if (acc) {  /* the next row block's C: fetched while this block computes */
        for (int r = 8; r < 16; r++) {
            _mm_prefetch((const char*)(C + (size_t)r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char*)(C + (size_t)r * ldc + 16), _MM_HINT_T0);
        }
    }
    SN_ROW_LOAD(0) SN_ROW_LOAD(1) SN_ROW_LOAD(2) SN_ROW_LOAD(3)
    SN_ROW_LOAD(4) SN_ROW_LOAD(5) SN_ROW_LOAD(6) SN_ROW_LOAD(7)
    for (int k = 0; k < K; k++) {
        const float* bk = B + (size_t)k * 32;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
        SN_ROW_FMA(0) SN_ROW_FMA(1) SN_ROW_FMA(2) SN_ROW_FMA(3)
        SN_ROW_FMA(4) SN_ROW_FMA(5) SN_ROW_FMA(6) SN_ROW_FMA(7)
    }
    A = A2; lda = lda2;
    for (int k = 0; k < K2; k++) {
        const float* bk = B2 + (size_t)k * 32;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
        SN_ROW_FMA(0) SN_ROW_FMA(1) SN_ROW_FMA(2) SN_ROW_FMA(3)
        SN_ROW_FMA(4) SN_ROW_FMA(5) SN_ROW_FMA(6) SN_ROW_FMA(7)
    }
    SN_ROW_STORE(0) SN_ROW_STORE(1) SN_ROW_STORE(2) SN_ROW_STORE(3)
    SN_ROW_STORE(4) SN_ROW_STORE(5) SN_ROW_STORE(6) SN_ROW_STORE(7)
}

__attribute__((target("avx512f")))
static void sn_block1_avx512(int K, const float* A, const float* B, int K2, const float* A2,
                             const float* B2, float* C, int acc, __mmask16 m0, __mmask16 m1) {
    __m512 c00, c01;
    int lda = 0, ldc = 0;
    (void)lda; (void)ldc;
    SN_ROW_LOAD(0)
    for (int k = 0; k < K; k++) {
        const float* bk = B + (size_t)k * 32;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
        SN_ROW_FMA(0)
    }
    A = A2;
    for (int k = 0; k < K2; k++) {
        const float* bk = B2 + (size_t)k * 32;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
        SN_ROW_FMA(0)
    }
    SN_ROW_STORE(0)
}

/* B packed in panels of 32 columns: panel p holds B[0:K, 32p:32p+32] as K contiguous rows
   of 32 floats (zero padded), so a panel is one contiguous block whatever B's row stride
   (a power-of-two stride would map a panel's rows onto a few L1 sets).
   C[M x Nc] (+)= A[M x K] @ B + A2[M x K2] @ B2 (B2 in panels too; K2 may be 0). */
__attribute__((target("avx512f"), unused))
static void sn_sgemm_panels2_avx512(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                    int K2, const float* A2, int lda2, const float* Bp2,
                                    float* C, int ldc, int acc) {
    for (int j = 0; j < Nc; j += 32) {
        int w = Nc - j;
        const float* B = Bp + (size_t)(j / 32) * K * 32;
        const float* B2 = K2 > 0 ? Bp2 + (size_t)(j / 32) * K2 * 32 : B;
        __mmask16 m0 = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
        __mmask16 m1 = w >= 32 ? (__mmask16)0xFFFF : (w > 16 ? (__mmask16)((1u << (w - 16)) - 1u) : (__mmask16)0);
        int i = 0;
        for (; i + 8 <= M; i += 8)
            sn_block8_avx512(K, A + (size_t)i * lda, lda, B, K2, A2 + (size_t)i * lda2, lda2, B2,
                             C + (size_t)i * ldc + j, ldc, acc, m0, m1);
        for (; i < M; i++)
            sn_block1_avx512(K, A + (size_t)i * lda, B, K2, A2 + (size_t)i * lda2, B2,
                             C + (size_t)i * ldc + j, acc, m0, m1);
    }
}
/* C[M x Nc] (+)= A[M x K] @ B.  A long K is cut in chunks of 128 rows, so that the chunk of a
   panel that all row blocks read (16 KiB) stays in L1 with room for A's rows, on 32 KiB L1s
   too (the LSTM backward's dh = dgates @ W_hh has K = 4H: its 64 KiB panels, read whole, ran
   at 107 GFLOP/s on a 48 KiB-L1 Xeon, 126-128 in chunks of 128 or 256 rows). */
__attribute__((target("avx512f"), unused))
static void sn_sgemm_panels_avx512(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                            float* C, int ldc, int acc) {
    const int Kc = 128;
    if (K <= Kc + Kc / 2) {
        sn_sgemm_panels2_avx512(M, Nc, K, A, lda, Bp, 0, A, lda, Bp, C, ldc, acc);
        return;
    }
    for (int j = 0; j < Nc; j += 32) {
        int w = Nc - j < 32 ? Nc - j : 32;
        for (int k0 = 0; k0 < K; k0 += Kc) {
            int kc = K - k0 < Kc ? K - k0 : Kc;
            /* panel j/32 of B, rows k0..k0+kc: kc rows of 32 floats */
            const float* Bk = Bp + ((size_t)(j / 32) * K + k0) * 32;
            sn_sgemm_panels2_avx512(M, w, kc, A + k0, lda, Bk, 0, A, lda, Bk, C + j, ldc,
                                    acc || k0 > 0);
        }
    }
}
/* C[M x Nc] (+)= At^T @ B with At (K x M) row-major (row stride lda): the weight
   gradients dW = dgates^T @ inputs over all T*N rows.  The 8 rows of a block are 8
   consecutive entries of one row of At. */
#define SN_ROWT_FMA(r) { __m512 a_ = _mm512_set1_ps(ak[r]);                              \
                         c##r##0 = _mm512_fmadd_ps(a_, b0, c##r##0);                    \
                         c##r##1 = _mm512_fmadd_ps(a_, b1, c##r##1); }
__attribute__((target("avx512f")))
static void sn_blockt8_avx512(int K, const float* At, int lda, const float* B, float* C,
                              int ldc, int acc, __mmask16 m0, __mmask16 m1) {
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71;
    SN_ROW_LOAD(0) SN_ROW_LOAD(1) SN_ROW_LOAD(2) SN_ROW_LOAD(3)
    SN_ROW_LOAD(4) SN_ROW_LOAD(5) SN_ROW_LOAD(6) SN_ROW_LOAD(7)
    for (int k = 0; k < K; k++) {
        const float* ak = At + (size_t)k * lda;
        const float* bk = B + (size_t)k * 32;
        __m512 b0 = _mm512_loadu_ps(bk);
        __m512 b1 = _mm512_loadu_ps(bk + 16);
        SN_ROWT_FMA(0) SN_ROWT_FMA(1) SN_ROWT_FMA(2) SN_ROWT_FMA(3)
        SN_ROWT_FMA(4) SN_ROWT_FMA(5) SN_ROWT_FMA(6) SN_ROWT_FMA(7)
    }
    SN_ROW_STORE(0) SN_ROW_STORE(1) SN_ROW_STORE(2) SN_ROW_STORE(3)
    SN_ROW_STORE(4) SN_ROW_STORE(5) SN_ROW_STORE(6) SN_ROW_STORE(7)
}
__attribute__((target("avx512f")))
static void sn_blockt1_avx512(int K, const float* At, int lda, const float* B, float* C,
                              int acc, __mmask16 m0, __mmask16 m1) {
    __m512 c00, c01;
    int ldc = 0;
    (void)ldc;
    SN_ROW_LOAD(0)
    for (int k = 0; k < K; k++) {
        const float* ak = At + (size_t)k * lda;
        const float* bk = B + (size_t)k * 32;
        __m512 b0 = _mm512_loadu_ps(bk);
        __m512 b1 = _mm512_loadu_ps(bk + 16);
        SN_ROWT_FMA(0)
    }
    SN_ROW_STORE(0)
}
/* K is cut in chunks so that a chunk of a B panel (Kc x 32 floats) stays in L1/L2 while
   all row blocks of C accumulate over it. */
__attribute__((target("avx512f"), unused))
static void sn_sgemm_panels_tn_avx512(int M, int Nc, int K, const float* At, int lda, const float* Bp,
                               float* C, int ldc, int acc) {
    const int Kc = 256;
    for (int j = 0; j < Nc; j += 32) {
        int w = Nc - j;
        const float* B = Bp + (size_t)(j / 32) * K * 32;
        __mmask16 m0 = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
        __mmask16 m1 = w >= 32 ? (__mmask16)0xFFFF : (w > 16 ? (__mmask16)((1u << (w - 16)) - 1u) : (__mmask16)0);
        for (int k0 = 0; k0 < K; k0 += Kc) {
            int kc = K - k0 < Kc ? K - k0 : Kc;
            int a = acc || k0 > 0;
            int i = 0;
            for (; i + 8 <= M; i += 8)
                sn_blockt8_avx512(kc, At + (size_t)k0 * lda + i, lda, B + (size_t)k0 * 32,
                                  C + (size_t)i * ldc + j, ldc, a, m0, m1);
            for (; i < M; i++)
                sn_blockt1_avx512(kc, At + (size_t)k0 * lda + i, lda, B + (size_t)k0 * 32,
                                  C + (size_t)i * ldc + j, a, m0, m1);
        }
    }
}
/* Panels of 32 columns of src (K x Nc, row stride ld) as sn_sgemm_panels_avx512 reads them
   (panel p: K rows of 32 floats, zero padded): masked 32-wide copies, for packing one time
   step's states (N x H) or inputs (N x F) right before they are used. */
__attribute__((target("avx512f"), unused))
static void sn_pack_panels_avx512(const float* src, int ld, int K, int Nc, float* out) {
    for (int j = 0; j < Nc; j += 32) {
        int w = Nc - j;
        __mmask16 m0 = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
        __mmask16 m1 = w >= 32 ? (__mmask16)0xFFFF : (w > 16 ? (__mmask16)((1u << (w - 16)) - 1u) : (__mmask16)0);
        float* dst = out + (size_t)(j / 32) * K * 32;
        for (int k = 0; k < K; k++) {
            const float* s = src + (size_t)k * ld + j;
            _mm512_storeu_ps(dst + (size_t)k * 32, _mm512_maskz_loadu_ps(m0, s));
            _mm512_storeu_ps(dst + (size_t)k * 32 + 16, _mm512_maskz_loadu_ps(m1, s + 16));
        }
    }
}
/* The LSTM forward gate row of sn_lstm_fwd_f (same contract, formulas and results) 16 units
   at a time in zmm registers: the x86-64-v4 clone of the loop above uses 256-bit vectors, and
   the five rational functions per unit make this loop compute bound (1.6 -> 1.3 ms a
   28 x 128 x 128 forward on a Xeon; the backward row is memory bound and gains nothing). */
__attribute__((target("avx512f,fma"), unused))
static inline __m512 sn_tanh16(__m512 x) {
    const __m512 lim = _mm512_set1_ps(7.90531110763549805f);
    x = _mm512_min_ps(_mm512_max_ps(x, -lim), lim);
    SN_TANH_RATIONAL(__m512, x)
}
__attribute__((target("avx512f,fma"), unused))
static inline __m512 sn_sigm16(__m512 x) { return 0.5f + 0.5f * sn_tanh16(0.5f * x); }
__attribute__((target("avx512f,fma"), unused))
static void sn_lstm_fwd_f16(int H, float* a, const float* b, const float* c_prev, float* c,
                            float* tc, float* h) {
    for (int j = 0; j < H; j += 16) {
        __mmask16 m = H - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - j)) - 1u);
#define SN_PRE(q) (_mm512_maskz_loadu_ps(m, a + (q) * H + j) + _mm512_maskz_loadu_ps(m, b + (q) * H + j))
        __m512 i = sn_sigm16(SN_PRE(0)), f = sn_sigm16(SN_PRE(1));
        __m512 g = sn_tanh16(SN_PRE(2)), o = sn_sigm16(SN_PRE(3));
#undef SN_PRE
        __m512 cj = f * _mm512_maskz_loadu_ps(m, c_prev + j) + i * g;
        __m512 t = sn_tanh16(cj);
        _mm512_mask_storeu_ps(a + j, m, i); _mm512_mask_storeu_ps(a + H + j, m, f);
        _mm512_mask_storeu_ps(a + 2 * H + j, m, g); _mm512_mask_storeu_ps(a + 3 * H + j, m, o);
        _mm512_mask_storeu_ps(c + j, m, cj); _mm512_mask_storeu_ps(tc + j, m, t);
        _mm512_mask_storeu_ps(h + j, m, o * t);
    }
}

/* SPARKNET_STEP_ISA=avx2 (or =blas) keeps the step kernels below what the CPU has, to test and
   measure the narrower paths on a wider CPU; unset, or any other value, leaves the CPU's best. */
SN_UNUSED static int sn_step_isa_cap(void) {
    static int cap = -1;
    if (cap < 0) {
        const char* e = getenv("SPARKNET_STEP_ISA");
        cap = e && !strcmp(e, "avx2") ? 1 : (e && !strcmp(e, "blas") ? 0 : 2);
    }
    return cap;
}
SN_UNUSED static int sn_has_avx512(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && sn_step_isa_cap() >= 2 ? 1 : 0;
    }
    return has;
}

/* ---- the same on AVX2 + FMA CPUs: products in step_gemm_avx2.h, the LSTM forward gate row
   8 units at a time (GCC's x86-64-v3 clone of sn_lstm_fwd_f stays scalar: 11 of a 53 ms
   training step of a 28 x 128 x 128 LSTM on a Zen 3) ---- */
#include "step_gemm_avx2.h"
__attribute__((target("avx2,fma"), unused))
static inline __m256 sn_tanh8(__m256 x) {
    const __m256 lim = _mm256_set1_ps(7.90531110763549805f);
    x = _mm256_min_ps(_mm256_max_ps(x, -lim), lim);
    SN_TANH_RATIONAL(__m256, x)
}
__attribute__((target("avx2,fma"), unused))
static inline __m256 sn_sigm8(__m256 x) { return 0.5f + 0.5f * sn_tanh8(0.5f * x); }
/* 8 units at j: full loads and stores, or masked ones for the last units of a row (a constant
   once inlined; masked stores are slow on some cores, so whole blocks avoid them) */
#define SN_LD8(p) (masked ? _mm256_maskload_ps((p), m) : _mm256_loadu_ps(p))
#define SN_ST8(p, v) { if (masked) _mm256_maskstore_ps((p), m, (v)); else _mm256_storeu_ps((p), (v)); }
__attribute__((target("avx2,fma"), always_inline))
static inline void sn_lstm_fwd8_at(const int masked, int j, int H, float* a, const float* b,
                                   const float* c_prev, float* c, float* tc, float* h) {
    const __m256i m = sn_mask8(H - j);
#define SN_PRE(q) (SN_LD8(a + (q) * H + j) + SN_LD8(b + (q) * H + j))
    __m256 i = sn_sigm8(SN_PRE(0)), f = sn_sigm8(SN_PRE(1));
    __m256 g = sn_tanh8(SN_PRE(2)), o = sn_sigm8(SN_PRE(3));
#undef SN_PRE
    __m256 cj = f * SN_LD8(c_prev + j) + i * g;
    __m256 t = sn_tanh8(cj);
    SN_ST8(a + j, i) SN_ST8(a + H + j, f) SN_ST8(a + 2 * H + j, g) SN_ST8(a + 3 * H + j, o)
    SN_ST8(c + j, cj) SN_ST8(tc + j, t) SN_ST8(h + j, o * t)
}
/* sn_lstm_fwd_f's contract and formulas, 8 units at a time */
__attribute__((target("avx2,fma"), unused))
static void sn_lstm_fwd_f8(int H, float* a, const float* b, const float* c_prev, float* c,
                           float* tc, float* h) {
    int j = 0;
    for (; j + 8 <= H; j += 8) sn_lstm_fwd8_at(0, j, H, a, b, c_prev, c, tc, h);
    if (j < H) sn_lstm_fwd8_at(1, j, H, a, b, c_prev, c, tc, h);
}
/* sn_lstm_bwd_f's contract and formulas (SN_LSTM_GATE_GRADS), 8 units at a time: da may be a */
__attribute__((target("avx2,fma"), always_inline))
static inline void sn_lstm_bwd8_at(const int masked, int j, int H, const float* a, float* da,
                                   const float* c_prev, const float* tc, const float* dh_rec,
                                   const float* dy, float* dc, float* db) {
    const __m256i m = sn_mask8(H - j);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 dh = SN_LD8(dh_rec + j);
    if (dy) dh = dh + SN_LD8(dy + j);
    __m256 i = SN_LD8(a + j), f = SN_LD8(a + H + j), g = SN_LD8(a + 2 * H + j);
    __m256 o = SN_LD8(a + 3 * H + j), t = SN_LD8(tc + j);
    __m256 dcj = SN_LD8(dc + j) + dh * o * (one - t * t);
    __m256 d_o = dh * t * o * (one - o);
    __m256 d_i = dcj * g * i * (one - i);
    __m256 d_g = dcj * i * (one - g * g);
    __m256 d_f = dcj * SN_LD8(c_prev + j) * f * (one - f);
    SN_ST8(dc + j, dcj * f)
    SN_ST8(da + j, d_i) SN_ST8(da + H + j, d_f) SN_ST8(da + 2 * H + j, d_g) SN_ST8(da + 3 * H + j, d_o)
    SN_ST8(db + j, SN_LD8(db + j) + d_i) SN_ST8(db + H + j, SN_LD8(db + H + j) + d_f)
    SN_ST8(db + 2 * H + j, SN_LD8(db + 2 * H + j) + d_g)
    SN_ST8(db + 3 * H + j, SN_LD8(db + 3 * H + j) + d_o)
}
__attribute__((target("avx2,fma"), unused))
static void sn_lstm_bwd_f8(int H, const float* a, float* da, const float* c_prev, const float* tc,
                           const float* dh_rec, const float* dy, float* dc, float* db) {
    int j = 0;
    for (; j + 8 <= H; j += 8) sn_lstm_bwd8_at(0, j, H, a, da, c_prev, tc, dh_rec, dy, dc, db);
    if (j < H) sn_lstm_bwd8_at(1, j, H, a, da, c_prev, tc, dh_rec, dy, dc, db);
}
#undef SN_LD8
#undef SN_ST8
SN_UNUSED static int sn_has_avx2_fma(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
              && sn_step_isa_cap() >= 1 ? 1 : 0;
    }
    return has;
}

/* The step kernels' instruction set: 2 AVX-512F, 1 AVX2 and FMA, 0 neither (the BLAS then
   runs every product).  The functions below run on the best one; call them only when
   sn_step_isa() > 0. */
SN_UNUSED static int sn_step_isa(void) { return sn_has_avx512() ? 2 : (sn_has_avx2_fma() ? 1 : 0); }
/* An empty inner dimension: C = 0 (an empty sum), or C as it was when accumulating; every
   instruction set answers the same (the kernels' own loops would differ). */
static inline int sn_empty_product(int M, int Nc, int K, float* C, int ldc, int acc) {
    if (K > 0) return 0;
    if (!acc)
        for (int i = 0; i < M; i++) memset(C + (long)i * ldc, 0, sizeof(float) * (size_t)(Nc > 0 ? Nc : 0));
    return 1;
}
SN_UNUSED static void sn_sgemm_panels2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                       int K2, const float* A2, int lda2, const float* Bp2,
                                       float* C, int ldc, int acc) {
    if (sn_empty_product(M, Nc, K > K2 ? K : K2, C, ldc, acc)) return;
    if (sn_has_avx512()) sn_sgemm_panels2_avx512(M, Nc, K, A, lda, Bp, K2, A2, lda2, Bp2, C, ldc, acc);
    else sn_sgemm_panels2_avx2(M, Nc, K, A, lda, Bp, K2, A2, lda2, Bp2, C, ldc, acc);
}
SN_UNUSED static void sn_sgemm_panels(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                      float* C, int ldc, int acc) {
    if (sn_empty_product(M, Nc, K, C, ldc, acc)) return;
    if (sn_has_avx512()) sn_sgemm_panels_avx512(M, Nc, K, A, lda, Bp, C, ldc, acc);
    else sn_sgemm_panels_avx2(M, Nc, K, A, lda, Bp, C, ldc, acc);
}
SN_UNUSED static void sn_sgemm_panels_tn(int M, int Nc, int K, const float* At, int lda,
                                         const float* Bp, float* C, int ldc, int acc) {
    if (sn_empty_product(M, Nc, K, C, ldc, acc)) return;
    if (sn_has_avx512()) sn_sgemm_panels_tn_avx512(M, Nc, K, At, lda, Bp, C, ldc, acc);
    else sn_sgemm_panels_tn_avx2(M, Nc, K, At, lda, Bp, C, ldc, acc);
}
SN_UNUSED static void sn_pack_panels(const float* src, int ld, int K, int Nc, float* out) {
    if (sn_has_avx512()) sn_pack_panels_avx512(src, ld, K, Nc, out);
    else sn_pack_panels_c(src, ld, K, Nc, out);
}
/* the LSTM forward gate row on the widest vectors the CPU has */
SN_UNUSED static void sn_lstm_fwd_fv(int H, float* a, const float* b, const float* c_prev, float* c,
                                     float* tc, float* h) {
    if (sn_has_avx512()) sn_lstm_fwd_f16(H, a, b, c_prev, c, tc, h);
    else if (sn_has_avx2_fma()) sn_lstm_fwd_f8(H, a, b, c_prev, c, tc, h);
    else sn_lstm_fwd_f(H, a, b, c_prev, c, tc, h);
}
/* the LSTM backward gate row: 8 units at a time on AVX2 (and AVX-512) CPUs */
SN_UNUSED static void sn_lstm_bwd_fv(int H, const float* a, float* da, const float* c_prev,
                                     const float* tc, const float* dh_rec, const float* dy,
                                     float* dc, float* db) {
    if (sn_has_avx2_fma()) sn_lstm_bwd_f8(H, a, da, c_prev, tc, dh_rec, dy, dc, db);
    else sn_lstm_bwd_f(H, a, da, c_prev, tc, dh_rec, dy, dc, db);
}
#else
#define SN_HAVE_AVX512 0
SN_UNUSED static void sn_sgemm_panels_avx512(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                            float* C, int ldc, int acc) { }
SN_UNUSED SN_UNUSED static int sn_has_avx512(void) { return 0; }
SN_UNUSED static void sn_sgemm_panels_tn_avx512(int M, int Nc, int K, const float* At, int lda, const float* Bp,
                               float* C, int ldc, int acc) { }
SN_UNUSED static void sn_pack_panels_avx512(const float* src, int ld, int K, int Nc, float* out) { }
SN_UNUSED static void sn_lstm_fwd_f16(int H, float* a, const float* b, const float* c_prev, float* c,
                                      float* tc, float* h) { }
SN_UNUSED static void sn_sgemm_panels2_avx512(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                              int K2, const float* A2, int lda2, const float* Bp2,
                                              float* C, int ldc, int acc) { }
SN_UNUSED static int sn_has_avx2_fma(void) { return 0; }
SN_UNUSED static int sn_step_isa(void) { return 0; }
SN_UNUSED static void sn_sgemm_panels2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                       int K2, const float* A2, int lda2, const float* Bp2,
                                       float* C, int ldc, int acc) { }
SN_UNUSED static void sn_sgemm_panels(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                      float* C, int ldc, int acc) { }
SN_UNUSED static void sn_sgemm_panels_tn(int M, int Nc, int K, const float* At, int lda,
                                         const float* Bp, float* C, int ldc, int acc) { }
SN_UNUSED static void sn_pack_panels(const float* src, int ld, int K, int Nc, float* out) { }
SN_UNUSED static void sn_lstm_fwd_fv(int H, float* a, const float* b, const float* c_prev, float* c,
                                     float* tc, float* h) { sn_lstm_fwd_f(H, a, b, c_prev, c, tc, h); }
SN_UNUSED static void sn_lstm_bwd_fv(int H, const float* a, float* da, const float* c_prev,
                                     const float* tc, const float* dh_rec, const float* dy,
                                     float* dc, float* db) {
    sn_lstm_bwd_f(H, a, da, c_prev, tc, dh_rec, dy, dc, db);
}
#endif

#endif

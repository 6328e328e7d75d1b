/* GRU gate rows in plain C, included by src/sparknet/_gru.pyx: forward and backward of one
 * row (float and double; the float ones also 16 units at a time on AVX-512 and 8 on AVX2 + FMA,
 * chosen by the caller), beside the recurrent kernels they share (recurrent_kernels.h).
 */
#ifndef SPARKNET_GRU_KERNELS_H
#define SPARKNET_GRU_KERNELS_H

#include "recurrent_kernels.h"
/* GRU forward of one row: a (4H) = [a_r, a_z, a_in, a_hn] (products, no bias) on entry,
   [r, z, n, a_hn + b_hn] on exit; b (4H) = [b_ir + b_hr, b_iz + b_hz, b_in, b_hn];
   h = (1 - z) * n + z * h_prev.
   GRU backward of one row: a (4H) holds [r, z, n, hn]; the pre-activation gradients
   [da_r, da_z, da_in, da_hn] go to da (4H), which may be a itself (each j reads its four
   values before writing); dh = dh_rec + dy (dy may be NULL); dh_prev = z * dh, the
   direct path (the caller adds the recurrent product); da is added to db (4H). */
#define SN_GRU_BLOCKS(T, p) T* restrict p##r = p; T* restrict p##z = p + H;              \
    T* restrict p##n = p + 2 * H; T* restrict p##hn = p + 3 * H;
#define SN_GRU_CBLOCKS(T, p) const T* restrict p##r = p; const T* restrict p##z = p + H;  \
    const T* restrict p##n = p + 2 * H; const T* restrict p##hn = p + 3 * H;
/* the backward gate gradients of unit j given its state gradient dh (one body for the
   loops with and without dy, so that neither branches per unit) */
#define SN_GRU_GRADS(T) {                                                               \
    T r = ar[j], z = az[j], n = an[j], hn = ahn[j];                                     \
    T dnp = dh * (1 - z) * (1 - n * n);        /* d(n's pre-activation) */              \
    T d_r = dnp * hn * r * (1 - r);                                                     \
    T d_z = dh * (h_prev[j] - n) * z * (1 - z);                                         \
    T d_hn = dnp * r;                                                                   \
    dh_prev[j] = dh * z;                                                                \
    dar[j] = d_r; daz[j] = d_z; dan[j] = dnp; dahn[j] = d_hn;                           \
    dbr[j] += d_r; dbz[j] += d_z; dbn[j] += dnp; dbhn[j] += d_hn;                       \
}
#define SN_GRU_DEFINE(T, S, ATTR)                                                       \
ATTR SN_UNUSED static void sn_gru_fwd_##S(int H, T* a, const T* b,                      \
                                          const T* restrict h_prev, T* restrict h) {    \
    SN_GRU_BLOCKS(T, a) SN_GRU_CBLOCKS(T, b)                                            \
    SN_IVDEP for (int j = 0; j < H; j++) {                                              \
        T r = sn_sigm_##S(ar[j] + br[j]);                                               \
        T z = sn_sigm_##S(az[j] + bz[j]);                                               \
        T hn = ahn[j] + bhn[j];                                                         \
        T n = sn_tanh_##S(an[j] + bn[j] + r * hn);                                      \
        ar[j] = r; az[j] = z; an[j] = n; ahn[j] = hn;                                   \
        h[j] = n + z * (h_prev[j] - n);                                                 \
    }                                                                                   \
}                                                                                       \
ATTR SN_UNUSED static void sn_gru_bwd_##S(int H, const T* a, T* da,                     \
                                          const T* restrict h_prev,                     \
                                          const T* restrict dh_rec, const T* restrict dy, \
                                          T* restrict dh_prev, T* db) {                 \
    const T* ar = a; const T* az = a + H; const T* an = a + 2 * H; const T* ahn = a + 3 * H; \
    T* dar = da; T* daz = da + H; T* dan = da + 2 * H; T* dahn = da + 3 * H;            \
    SN_GRU_BLOCKS(T, db)                                                                \
    if (dy) {                                                                           \
        SN_IVDEP for (int j = 0; j < H; j++) { T dh = dh_rec[j] + dy[j]; SN_GRU_GRADS(T) } \
    } else {                                                                            \
        SN_IVDEP for (int j = 0; j < H; j++) { T dh = dh_rec[j]; SN_GRU_GRADS(T) }      \
    }                                                                                   \
}
SN_GRU_DEFINE(float, f, SN_CLONES)
SN_GRU_DEFINE(double, d, )
#if SN_HAVE_AVX512
/* sn_gru_fwd_f and sn_gru_bwd_f 16 units at a time in zmm registers (same contracts,
   formulas and results; the compiler's clones of the loops above mix 256-bit vectors,
   gathers and scatters) */
#define SN_LD(p) _mm512_maskz_loadu_ps(m, (p) + j)
#define SN_ST(p, v) _mm512_mask_storeu_ps((p) + j, m, (v))
#define SN_MASK16 __mmask16 m = H - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - j)) - 1u);
__attribute__((target("avx512f,fma"), unused))
static void sn_gru_fwd_f16(int H, float* a, const float* b, const float* h_prev, float* h) {
    for (int j = 0; j < H; j += 16) {
        SN_MASK16
        __m512 r = sn_sigm16(SN_LD(a) + SN_LD(b));
        __m512 z = sn_sigm16(SN_LD(a + H) + SN_LD(b + H));
        __m512 hn = SN_LD(a + 3 * H) + SN_LD(b + 3 * H);
        __m512 n = sn_tanh16(SN_LD(a + 2 * H) + SN_LD(b + 2 * H) + r * hn);
        __m512 hp = SN_LD(h_prev);
        SN_ST(a, r); SN_ST(a + H, z); SN_ST(a + 2 * H, n); SN_ST(a + 3 * H, hn);
        SN_ST(h, n + z * (hp - n));
    }
}
__attribute__((target("avx512f,fma"), unused))
static void sn_gru_bwd_f16(int H, const float* a, float* da, const float* h_prev,
                           const float* dh_rec, const float* dy, float* dh_prev, float* db) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int j = 0; j < H; j += 16) {
        SN_MASK16
        __m512 dh = SN_LD(dh_rec);
        if (dy) dh = dh + SN_LD(dy);
        __m512 r = SN_LD(a), z = SN_LD(a + H), n = SN_LD(a + 2 * H), hn = SN_LD(a + 3 * H);
        __m512 dnp = dh * (one - z) * (one - n * n);
        __m512 d_r = dnp * hn * r * (one - r);
        __m512 d_z = dh * (SN_LD(h_prev) - n) * z * (one - z);
        __m512 d_hn = dnp * r;
        SN_ST(dh_prev, dh * z);
        SN_ST(da, d_r); SN_ST(da + H, d_z); SN_ST(da + 2 * H, dnp); SN_ST(da + 3 * H, d_hn);
        SN_ST(db, SN_LD(db) + d_r); SN_ST(db + H, SN_LD(db + H) + d_z);
        SN_ST(db + 2 * H, SN_LD(db + 2 * H) + dnp); SN_ST(db + 3 * H, SN_LD(db + 3 * H) + d_hn);
    }
}
#undef SN_LD
#undef SN_ST
#undef SN_MASK16
/* the same 8 units at a time on AVX2 + FMA CPUs; full loads and stores but for the last
   units of a row (masked is a constant once inlined) */
#define SN_LD8(p) (masked ? _mm256_maskload_ps((p) + j, m) : _mm256_loadu_ps((p) + j))
#define SN_ST8(p, v) { if (masked) _mm256_maskstore_ps((p) + j, m, (v));                  \
                       else _mm256_storeu_ps((p) + j, (v)); }
__attribute__((target("avx2,fma"), always_inline))
static inline void sn_gru_fwd8_at(const int masked, int j, int H, float* a, const float* b,
                                  const float* h_prev, float* h) {
    const __m256i m = sn_mask8(H - j);
    __m256 r = sn_sigm8(SN_LD8(a) + SN_LD8(b));
    __m256 z = sn_sigm8(SN_LD8(a + H) + SN_LD8(b + H));
    __m256 hn = SN_LD8(a + 3 * H) + SN_LD8(b + 3 * H);
    __m256 n = sn_tanh8(SN_LD8(a + 2 * H) + SN_LD8(b + 2 * H) + r * hn);
    __m256 hp = SN_LD8(h_prev);
    SN_ST8(a, r) SN_ST8(a + H, z) SN_ST8(a + 2 * H, n) SN_ST8(a + 3 * H, hn)
    SN_ST8(h, n + z * (hp - n))
}
__attribute__((target("avx2,fma"), unused))
static void sn_gru_fwd_f8(int H, float* a, const float* b, const float* h_prev, float* h) {
    int j = 0;
    for (; j + 8 <= H; j += 8) sn_gru_fwd8_at(0, j, H, a, b, h_prev, h);
    if (j < H) sn_gru_fwd8_at(1, j, H, a, b, h_prev, h);
}
__attribute__((target("avx2,fma"), always_inline))
static inline void sn_gru_bwd8_at(const int masked, int j, int H, const float* a, float* da,
                                  const float* h_prev, const float* dh_rec, const float* dy,
                                  float* dh_prev, float* db) {
    const __m256i m = sn_mask8(H - j);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 dh = SN_LD8(dh_rec);
    if (dy) dh = dh + SN_LD8(dy);
    __m256 r = SN_LD8(a), z = SN_LD8(a + H), n = SN_LD8(a + 2 * H), hn = SN_LD8(a + 3 * H);
    __m256 dnp = dh * (one - z) * (one - n * n);
    __m256 d_r = dnp * hn * r * (one - r);
    __m256 d_z = dh * (SN_LD8(h_prev) - n) * z * (one - z);
    __m256 d_hn = dnp * r;
    SN_ST8(dh_prev, dh * z)
    SN_ST8(da, d_r) SN_ST8(da + H, d_z) SN_ST8(da + 2 * H, dnp) SN_ST8(da + 3 * H, d_hn)
    SN_ST8(db, SN_LD8(db) + d_r) SN_ST8(db + H, SN_LD8(db + H) + d_z)
    SN_ST8(db + 2 * H, SN_LD8(db + 2 * H) + dnp) SN_ST8(db + 3 * H, SN_LD8(db + 3 * H) + d_hn)
}
__attribute__((target("avx2,fma"), unused))
static void sn_gru_bwd_f8(int H, const float* a, float* da, const float* h_prev,
                          const float* dh_rec, const float* dy, float* dh_prev, float* db) {
    int j = 0;
    for (; j + 8 <= H; j += 8) sn_gru_bwd8_at(0, j, H, a, da, h_prev, dh_rec, dy, dh_prev, db);
    if (j < H) sn_gru_bwd8_at(1, j, H, a, da, h_prev, dh_rec, dy, dh_prev, db);
}
#undef SN_LD8
#undef SN_ST8
#else
SN_UNUSED static void sn_gru_fwd_f16(int H, float* a, const float* b, const float* h_prev,
                                     float* h) { sn_gru_fwd_f(H, a, b, h_prev, h); }
SN_UNUSED static void sn_gru_bwd_f16(int H, const float* a, float* da, const float* h_prev,
                                     const float* dh_rec, const float* dy, float* dh_prev,
                                     float* db) {
    sn_gru_bwd_f(H, a, da, h_prev, dh_rec, dy, dh_prev, db);
}
SN_UNUSED static void sn_gru_fwd_f8(int H, float* a, const float* b, const float* h_prev,
                                    float* h) { sn_gru_fwd_f(H, a, b, h_prev, h); }
SN_UNUSED static void sn_gru_bwd_f8(int H, const float* a, float* da, const float* h_prev,
                                    const float* dh_rec, const float* dy, float* dh_prev,
                                    float* db) {
    sn_gru_bwd_f(H, a, da, h_prev, dh_rec, dy, dh_prev, db);
}
#endif

#endif

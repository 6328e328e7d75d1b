/* A small single-precision GEMM for the shapes of convolution layers, written with
 * AVX-512 intrinsics and compiled for AVX-512 whatever the build's target (the caller
 * checks ``sn_cpu_has_avx512()`` at run time and falls back to BLAS otherwise).
 *
 *   C[i, j] = (accumulate ? C[i, j] : 0) + sum_p A(i, p) * B(p, j)
 *
 * with A(i, p) = A[i * ars + p * aps] (any strides: a row-major A has ars = lda, aps = 1;
 * a transposed one ars = 1, aps = lda) and B(p, j) = B[p * ldb + j] (row-major).  No
 * packing: a 12 x 32 tile of C lives in 24 zmm registers while the kernel streams over
 * p, broadcasting A and loading one 32-wide row of B per step.  The inner dimension is
 * split into blocks of ``kc`` so that the slice of B (and of a transposed A) being
 * reused stays in the L2 cache.
 */
#ifndef SPARKNET_SGEMM_AVX512_H
#define SPARKNET_SGEMM_AVX512_H

#include <stddef.h>
#include <stdlib.h>

/* floats of scratch a thread keeps (sn_scratch_f32); dense weights up to it take the kernel */
#define SN_SCRATCH_KEEP ((size_t)1 << 21)

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define SN_HAVE_AVX512_KERNEL 1
#include <immintrin.h>

#define SN_AVX512 __attribute__((target("avx512f,fma"), unused))

__attribute__((unused)) static int sn_cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}

/* Accumulators are named variables (an array of __m512 would be spilled to the stack
 * on every step by GCC). */
#define SN_REP1(X) X(0)
#define SN_REP4(X) X(0) X(1) X(2) X(3)
#define SN_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define SN_DECL(r) __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
#define SN_FMA2(r) { __m512 av = _mm512_set1_ps(a[(r) * ars]);                               \
                     c0_##r = _mm512_fmadd_ps(av, b0, c0_##r);                              \
                     c1_##r = _mm512_fmadd_ps(av, b1, c1_##r); }
#define SN_FMA1(r) c0_##r = _mm512_fmadd_ps(_mm512_set1_ps(a[(r) * ars]), b0, c0_##r);
#define SN_STORE(r) { float *c = C + (r) * ldc;                                              \
                      if (accumulate) {                                                     \
                          c0_##r = _mm512_add_ps(c0_##r, _mm512_maskz_loadu_ps(m0, c));      \
                          c1_##r = _mm512_add_ps(c1_##r, _mm512_maskz_loadu_ps(m1, c + 16)); \
                      }                                                                     \
                      _mm512_mask_storeu_ps(c, m0, c0_##r);                                 \
                      if (m1) _mm512_mask_storeu_ps(c + 16, m1, c1_##r); }

/* One MR x nc tile of C (nc <= 32 columns, masked) over kc steps of the inner dimension. */
#define SN_TILE(MR)                                                                           \
SN_AVX512 static void sn_tile_##MR(ptrdiff_t kc, const float *A, ptrdiff_t ars,              \
                                   ptrdiff_t aps, const float *B, ptrdiff_t ldb, float *C,    \
                                   ptrdiff_t ldc, int nc, int accumulate)                     \
{                                                                                             \
    __mmask16 m0 = nc >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1u);               \
    __mmask16 m1 = nc >= 32 ? (__mmask16)0xFFFF                                               \
                 : nc <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nc - 16)) - 1u);             \
    ptrdiff_t p;                                                                              \
    SN_REP##MR(SN_DECL)                                                                       \
    if (m1) {                                                                                 \
        for (p = 0; p < kc; p++) {                                                            \
            const float *b = B + p * ldb, *a = A + p * aps;                                   \
            __m512 b0 = _mm512_maskz_loadu_ps(m0, b);                                         \
            __m512 b1 = _mm512_maskz_loadu_ps(m1, b + 16);                                    \
            SN_REP##MR(SN_FMA2)                                                               \
        }                                                                                     \
    } else {                                                                                  \
        for (p = 0; p < kc; p++) {                                                            \
            const float *a = A + p * aps;                                                     \
            __m512 b0 = _mm512_maskz_loadu_ps(m0, B + p * ldb);                               \
            SN_REP##MR(SN_FMA1)                                                               \
        }                                                                                     \
    }                                                                                         \
    SN_REP##MR(SN_STORE)                                                                      \
}

SN_TILE(12)
SN_TILE(4)
SN_TILE(1)

/* C (M x N, row stride ldc) (+)= A(i, p) B(p, j) over p < K; see the file comment. */
SN_AVX512 static void sn_sgemm_avx512(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, const float *A,
                                      ptrdiff_t ars, ptrdiff_t aps, const float *B,
                                      ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate,
                                      ptrdiff_t kc_max)
{
    ptrdiff_t pc, jc, ic, kc;
    int nc, acc;
    if (K == 0) {
        if (!accumulate)
            for (ic = 0; ic < M; ic++)
                for (jc = 0; jc < N; jc++) C[ic * ldc + jc] = 0.0f;
        return;
    }
    for (pc = 0; pc < K; pc += kc_max) {
        kc = K - pc < kc_max ? K - pc : kc_max;
        acc = accumulate || pc > 0;
        for (jc = 0; jc < N; jc += 32) {
            const float *b = B + pc * ldb + jc;
            nc = (int)(N - jc < 32 ? N - jc : 32);
            for (ic = 0; ic + 12 <= M; ic += 12)
                sn_tile_12(kc, A + ic * ars + pc * aps, ars, aps, b, ldb, C + ic * ldc + jc, ldc,
                           nc, acc);
            for (; ic + 4 <= M; ic += 4)
                sn_tile_4(kc, A + ic * ars + pc * aps, ars, aps, b, ldb, C + ic * ldc + jc, ldc,
                          nc, acc);
            for (; ic < M; ic++)
                sn_tile_1(kc, A + ic * ars + pc * aps, ars, aps, b, ldb, C + ic * ldc + jc, ldc,
                          nc, acc);
        }
    }
}

/* r[i][j] -> r[j][i] for 16 x 16 32-bit words: unpack words and word pairs within 128-bit
 * lanes, then move the lanes (a 4 x 4 transpose of lanes).  The bfloat16 packing
 * (bf16_gemm.h, bf16_amx.h) transposes its pair words with it too. */
SN_AVX512 static inline void sn_transpose16_epi32(__m512i *r)
{
    __m512i s[16], u0, u1, u2, u3;
    int g, m;
    for (g = 0; g < 4; g++) {
        __m512i a0 = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
        __m512i a1 = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
        __m512i a2 = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
        __m512i a3 = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
        /* s[4g + m] lane l = rows 4g..4g+3, word 4l + m */
        s[4 * g] = _mm512_unpacklo_epi64(a0, a2);
        s[4 * g + 1] = _mm512_unpackhi_epi64(a0, a2);
        s[4 * g + 2] = _mm512_unpacklo_epi64(a1, a3);
        s[4 * g + 3] = _mm512_unpackhi_epi64(a1, a3);
    }
    for (m = 0; m < 4; m++) {
        /* word 4l + m of every row: lane l of s[m], s[4 + m], s[8 + m], s[12 + m] */
        u0 = _mm512_shuffle_i32x4(s[m], s[4 + m], 0x44);
        u1 = _mm512_shuffle_i32x4(s[m], s[4 + m], 0xEE);
        u2 = _mm512_shuffle_i32x4(s[8 + m], s[12 + m], 0x44);
        u3 = _mm512_shuffle_i32x4(s[8 + m], s[12 + m], 0xEE);
        r[m] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        r[8 + m] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
}

/* Scratch space of n <= SN_SCRATCH_KEEP floats (8 MiB) for the calling thread, kept for its
 * next call (a dense layer's weight, transposed once per forward, would otherwise cost a
 * malloc and its page faults at every step; larger weights stay on the BLAS).  NULL when n
 * is larger or memory is out. */
__attribute__((unused)) static float *sn_scratch_f32(size_t n)
{
    static __thread float *kept = NULL;
    static __thread size_t kept_n = 0;
    if (n > SN_SCRATCH_KEEP) return NULL;
    if (n > kept_n) {
        free(kept);
        kept_n = n < SN_SCRATCH_KEEP / 4 ? SN_SCRATCH_KEEP / 4 : SN_SCRATCH_KEEP;
        kept = (float *)malloc(kept_n * sizeof(float));
        if (kept == NULL) kept_n = 0;
    }
    return kept;
}

/* dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: 16 x 16 blocks transposed in
 * registers (masked at the edges).  The dense layer's forward hands sn_sgemm_avx512 its
 * weight as W^T, since the kernel reads B by rows. */
SN_AVX512 static void sn_transpose_avx512(ptrdiff_t rows, ptrdiff_t cols, const float *src,
                                          ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    ptrdiff_t i0, j0, r;
    for (i0 = 0; i0 < rows; i0 += 16) {
        ptrdiff_t ni = rows - i0 < 16 ? rows - i0 : 16;
        __mmask16 mi = ni >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ni) - 1u);
        for (j0 = 0; j0 < cols; j0 += 16) {
            ptrdiff_t nj = cols - j0 < 16 ? cols - j0 : 16;
            __mmask16 mj = nj >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nj) - 1u);
            __m512i v[16];
            for (r = 0; r < 16; r++)
                v[r] = r < ni ? _mm512_maskz_loadu_epi32(mj, src + (i0 + r) * lds + j0)
                              : _mm512_setzero_si512();
            sn_transpose16_epi32(v);
            for (r = 0; r < nj; r++) _mm512_mask_storeu_epi32(dst + (j0 + r) * ldd + i0, mi, v[r]);
        }
    }
}

/* Copy (add) n floats with 16-wide masked loads and stores: no scalar tail, so the
 * short spans of few-channel images (5 floats for a 5-wide kernel on one channel) cost
 * one instruction pair. */
SN_AVX512 static inline void sn_copy16(float *dst, const float *src, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, _mm512_loadu_ps(src + j));
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_maskz_loadu_ps(m, src + j));
    }
}

SN_AVX512 static inline void sn_zero16(float *dst, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(dst + j, _mm512_setzero_ps());
    if (j < n) _mm512_mask_storeu_ps(dst + j, (__mmask16)((1u << (n - j)) - 1u), _mm512_setzero_ps());
}

SN_AVX512 static inline void sn_add16(float *dst, const float *src, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(dst + j, _mm512_add_ps(_mm512_loadu_ps(dst + j), _mm512_loadu_ps(src + j)));
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + j),
                                                        _mm512_maskz_loadu_ps(m, src + j)));
    }
}

/* The body of an im2col of column rows r0 <= r < r1 into dst, with ZERO(d, n) zeroing n
 * columns and COPY(d, s, n) writing n floats of X into them: the float32 columns below and
 * the bfloat16 ones of bf16_gemm.h (sn_im2col_rows_bf16) share it. */
#define SN_IM2COL_ROWS_BODY(ZERO, COPY)                                                      \
{                                                                                             \
    ptrdiff_t KWC = KW * C, ohw = OH * OW, r, kh, kw;                                         \
    ptrdiff_t n = r0 / ohw, oh = (r0 % ohw) / OW, ow = r0 % OW;                               \
    for (r = r0; r < r1; r++) {                                                               \
        const float *xn = X + n * H * W * C;                                                  \
        ptrdiff_t iw0 = ow * sw - pw;                                                         \
        int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;                                    \
        for (kh = 0; kh < KH; kh++) {                                                         \
            ptrdiff_t ih = oh * sh - ph + kh * dh;                                            \
            if (ih < 0 || ih >= H) {                                                          \
                ZERO(dst, KWC);                                                               \
            } else if (inside) {                                                              \
                COPY(dst, xn + (ih * W + iw0) * C, KWC);                                      \
            } else {                                                                          \
                for (kw = 0; kw < KW; kw++) {                                                 \
                    ptrdiff_t iw = iw0 + kw * dw;                                             \
                    if (iw < 0 || iw >= W) ZERO(dst + kw * C, C);                             \
                    else COPY(dst + kw * C, xn + (ih * W + iw) * C, C);                       \
                }                                                                             \
            }                                                                                 \
            dst += KWC;                                                                       \
        }                                                                                     \
        if (++ow == OW) { ow = 0; if (++oh == OH) { oh = 0; n++; } }                          \
    }                                                                                         \
}

/* im2col / col2im of column rows r0 <= r < r1, float32, AVX-512 (same contract as
 * sn_im2col_rows_f / sn_col2im_rows_f in conv_kernels.h). */
SN_AVX512 static void sn_im2col_rows_avx512(const float *X, ptrdiff_t H, ptrdiff_t W,
                                            ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,
                                            ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t sh,
                                            ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,
                                            ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0,
                                            ptrdiff_t r1, float *dst)
SN_IM2COL_ROWS_BODY(sn_zero16, sn_copy16)

SN_AVX512 static void sn_col2im_rows_avx512(float *dX, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C,
                                            ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t KH,
                                            ptrdiff_t KW, ptrdiff_t sh, ptrdiff_t sw,
                                            ptrdiff_t ph, ptrdiff_t pw, ptrdiff_t dh,
                                            ptrdiff_t dw, ptrdiff_t r0, ptrdiff_t r1,
                                            const float *src)
{
    ptrdiff_t KWC = KW * C, ohw = OH * OW, r, kh, kw;
    ptrdiff_t n = r0 / ohw, oh = (r0 % ohw) / OW, ow = r0 % OW;
    for (r = r0; r < r1; r++) {
        float *xn = dX + n * H * W * C;
        ptrdiff_t iw0 = ow * sw - pw;
        int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;
        for (kh = 0; kh < KH; kh++) {
            ptrdiff_t ih = oh * sh - ph + kh * dh;
            if (ih >= 0 && ih < H) {
                if (inside) {
                    sn_add16(xn + (ih * W + iw0) * C, src, KWC);
                } else {
                    for (kw = 0; kw < KW; kw++) {
                        ptrdiff_t iw = iw0 + kw * dw;
                        if (iw >= 0 && iw < W) sn_add16(xn + (ih * W + iw) * C, src + kw * C, C);
                    }
                }
            }
            src += KWC;
        }
        if (++ow == OW) { ow = 0; if (++oh == OH) { oh = 0; n++; } }
    }
}

#else
#define SN_HAVE_AVX512_KERNEL 0
static int sn_cpu_has_avx512(void) { return 0; }
static float *sn_scratch_f32(size_t n)
{
    (void)n;
    return NULL;
}
static void sn_transpose_avx512(ptrdiff_t rows, ptrdiff_t cols, const float *src,
                                ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    (void)rows; (void)cols; (void)src; (void)lds; (void)dst; (void)ldd;
}
static void sn_sgemm_avx512(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, const float *A,
                            ptrdiff_t ars, ptrdiff_t aps, const float *B, ptrdiff_t ldb,
                            float *C, ptrdiff_t ldc, int accumulate, ptrdiff_t kc_max)
{
    (void)M; (void)N; (void)K; (void)A; (void)ars; (void)aps; (void)B; (void)ldb; (void)C;
    (void)ldc; (void)accumulate; (void)kc_max;
}
static void sn_im2col_rows_avx512(const float *X, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C,
                                  ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t KH, ptrdiff_t KW,
                                  ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,
                                  ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0, ptrdiff_t r1,
                                  float *dst)
{
    (void)X; (void)H; (void)W; (void)C; (void)OH; (void)OW; (void)KH; (void)KW; (void)sh;
    (void)sw; (void)ph; (void)pw; (void)dh; (void)dw; (void)r0; (void)r1; (void)dst;
}
static void sn_col2im_rows_avx512(float *dX, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C,
                                  ptrdiff_t OH, ptrdiff_t OW, ptrdiff_t KH, ptrdiff_t KW,
                                  ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,
                                  ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0, ptrdiff_t r1,
                                  const float *src)
{
    (void)dX; (void)H; (void)W; (void)C; (void)OH; (void)OW; (void)KH; (void)KW; (void)sh;
    (void)sw; (void)ph; (void)pw; (void)dh; (void)dw; (void)r0; (void)r1; (void)src;
}
#endif

#endif

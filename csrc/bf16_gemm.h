/* A bfloat16 GEMM with float32 accumulation on AVX512-BF16 (``vdpbf16ps``), and the
 * float32 -> bfloat16 conversions it needs.
 *
 *   C[i, j] = (accumulate ? C[i, j] : 0) + sum_k bf16(A(i, k)) * bf16(B(k, j))
 *
 * where bf16(x) rounds a float32 to bfloat16 (round to nearest even; a bfloat16 source is
 * read as is).  Products of two bfloat16 values are exact in float32, and every sum is a
 * float32 addition: the result is that of a float32 GEMM on the rounded operands, up to
 * the order of the additions.
 *
 * All code that needs the instructions is compiled for them with function attributes,
 * whatever the build's target; the caller asks ``sn_bf16_cpu_ok()`` once and uses another
 * path when it is 0.
 *
 * Layout.  ``vdpbf16ps`` multiplies *pairs*: lane j of the accumulator gains
 * a[2j] * b[2j] + a[2j+1] * b[2j+1].  So the inner dimension k is taken two at a time,
 * and one 32-bit word holds the pair (k = 2q, k = 2q + 1) of one row of A or one column
 * of B, the even k in the low half.
 *
 * - B is packed once into panels of 32 columns: word ``Bp[(p * Kq + q) * 32 + c]`` is the
 *   pair q of column ``32 p + c``, with ``Kq = ceil(K / 2)``; zeros pad an odd K and the
 *   columns past N.  A weight matrix is packed once per optimizer step and read by every
 *   product of that step (``sn_bf16_pack_b``).
 * - A is converted block by block (``SN_BF16_MC`` rows x ``SN_BF16_KQ`` pairs, sized for
 *   the L2 cache) as the product runs: a row-major A into bfloat16 rows (the pair of a row
 *   is then one aligned word, broadcast as is), a transposed A into micro-panels of ``mr``
 *   rows (word ``q * mr + r``), both read by the same micro-kernel through two strides.
 * - The micro-kernel keeps a 12 x 32 tile of C in 24 zmm accumulators; per pair q it loads
 *   two vectors of B (32 columns) and broadcasts one word of each of the 12 rows of A:
 *   24 ``vdpbf16ps``, 768 multiply-adds, for 14 loads.  The panel of B it streams
 *   (``SN_BF16_KQ`` pairs x 32 columns, 24 KiB) stays in the L1 cache while the tiles of
 *   the block of A pass under it.
 *
 * On a CPU with AMX tiles, bf16_amx.h (included at the end) runs the same products on the
 * same packed B with ``tdpbf16ps``; the caller chooses per product.
 */
#ifndef SPARKNET_BF16_GEMM_H
#define SPARKNET_BF16_GEMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define SN_BF16_UNUSED __attribute__((unused))
#else
#define SN_BF16_UNUSED
#endif

/* rows of A per block, pairs of k per block (see the file comment) */
#define SN_BF16_MC 240
#define SN_BF16_KQ 192

/* float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN, and a denormal
 * becomes a zero of its sign, as the AVX512-BF16 conversion does. */
static inline uint16_t sn_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float sn_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Portable conversions (any CPU). */
SN_BF16_UNUSED static void sn_f32_to_bf16_scalar(const float *x, uint16_t *y, ptrdiff_t n)
{
    ptrdiff_t i;
    for (i = 0; i < n; i++) y[i] = sn_f32_to_bf16(x[i]);
}

SN_BF16_UNUSED static void sn_bf16_to_f32_scalar(const uint16_t *x, float *y, ptrdiff_t n)
{
    ptrdiff_t i;
    for (i = 0; i < n; i++) y[i] = sn_bf16_to_f32(x[i]);
}

/* Bytes of B (K x N) packed in panels by sn_bf16_pack_b. */
SN_BF16_UNUSED static size_t sn_bf16_packed_bytes(ptrdiff_t K, ptrdiff_t N)
{
    return (size_t)((N + 31) / 32) * (size_t)((K + 1) / 2) * 32u * 4u + 64u;
}

/* CPU features read with cpuid (leaf 7): bit 0 AVX512-BF16 usable (with AVX512F/BW/VL and
 * the OS saving the zmm state), bit 1 AMX-BF16 present (AMX-TILE too). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#include <immintrin.h>
#include "sgemm_avx512.h" /* sn_transpose16_epi32 */
#define SN_HAVE_BF16_KERNEL 1

SN_BF16_UNUSED static int sn_bf16_cpu_features(void)
{
    unsigned a, b, c, d, xlo = 0, xhi = 0, out = 0;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) return 0;                       /* OSXSAVE */
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    __cpuid_count(7, 0, a, b, c, d);
    if ((d & (1u << 22)) && (d & (1u << 24))) out |= 2u;   /* AMX-BF16, AMX-TILE */
    if ((xlo & 0xe6u) != 0xe6u) return (int)out;           /* XMM, YMM, opmask, ZMM state */
    if (!(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31))) return (int)out; /* F BW VL */
    __cpuid_count(7, 1, a, b, c, d);
    if (a & (1u << 5)) out |= 1u;                          /* AVX512_BF16 */
    (void)xhi;
    return (int)out;
}

SN_BF16_UNUSED static int sn_bf16_cpu_ok(void) { return sn_bf16_cpu_features() & 1; }

#define SN_BF16_TARGET __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,fma"), unused))

static inline __mmask16 sn_bf16_mask(ptrdiff_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* 16 values from a float32 (bf16 == 0) or bfloat16 source as float32, masked. */
SN_BF16_TARGET static inline __m512 sn_bf16_ld16(const void *src, int bf16, ptrdiff_t off,
                                                 __mmask16 m)
{
    if (bf16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + off);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_maskz_loadu_ps(m, (const float *)src + off);
}

/* 32 float32 -> 32 bfloat16 (lo first), round to nearest even. */
SN_BF16_TARGET static inline __m512i sn_bf16_cvt32(__m512 lo, __m512 hi)
{
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

SN_BF16_TARGET static void sn_f32_to_bf16_avx512(const float *x, uint16_t *y, ptrdiff_t n)
{
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(y + i, sn_bf16_cvt32(_mm512_loadu_ps(x + i),
                                                 _mm512_loadu_ps(x + i + 16)));
    if (i < n) {
        __m512i v = sn_bf16_cvt32(_mm512_maskz_loadu_ps(sn_bf16_mask(n - i), x + i),
                                  _mm512_maskz_loadu_ps(sn_bf16_mask(n - i - 16), x + i + 16));
        _mm512_mask_storeu_epi16(y + i, (__mmask32)(((uint64_t)1 << (n - i)) - 1u), v);
    }
}

/* Interleave the bfloat16 of two rows (k even: x, k odd: y) of 16 values each into 16
 * pair words. */
SN_BF16_TARGET static inline __m512i sn_bf16_pairs16(__m512 x, __m512 y)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, sn_bf16_cvt32(x, y));
}

/* Pair words of one row segment: out[q] = (s[2q], s[2q + 1]) for q < nq, reading n values
 * of s (zeros past n). */
SN_BF16_TARGET static void sn_bf16_row_pairs(const void *s, int bf16, ptrdiff_t off, ptrdiff_t n,
                                             ptrdiff_t nq, int32_t *out)
{
    ptrdiff_t q;
    for (q = 0; q < nq; q += 16) {
        ptrdiff_t k = 2 * q;
        __m512i v = sn_bf16_cvt32(sn_bf16_ld16(s, bf16, off + k, sn_bf16_mask(n - k)),
                                  sn_bf16_ld16(s, bf16, off + k + 16, sn_bf16_mask(n - k - 16)));
        _mm512_mask_storeu_epi32(out + q, sn_bf16_mask(nq - q), v);
    }
}

/* The part of sn_bf16_pack_b's output that rows lo <= r < hi of the source determine,
 * written where the whole packing has it: rows k of B (lo even), or when trans_b columns j of
 * B, which are the source's rows (lo a multiple of 32, so whole panels).  A caller that has
 * just written those rows (the optimizer, block by block) packs them while they are in cache. */
SN_BF16_TARGET static void sn_bf16_pack_b_part(ptrdiff_t K, ptrdiff_t N, const void *B,
                                               int b_bf16, ptrdiff_t ldb, int trans_b,
                                               ptrdiff_t lo, ptrdiff_t hi, int32_t *out)
{
    ptrdiff_t Kq = (K + 1) / 2, p, q, c;
    ptrdiff_t p_lo = trans_b ? lo / 32 : 0, p_hi = trans_b ? (hi + 31) / 32 : (N + 31) / 32;
    ptrdiff_t q_lo = trans_b ? 0 : lo / 2, q_hi = trans_b ? Kq : (hi + 1) / 2;
    for (p = p_lo; p < p_hi; p++) {
        ptrdiff_t j0 = 32 * p, nc = N - j0 < 32 ? N - j0 : 32;
        int32_t *panel = out + p * Kq * 32;
        if (!trans_b) {
            /* rows 2q and 2q + 1 are contiguous over the panel's columns */
            __mmask16 m0 = sn_bf16_mask(nc), m1 = sn_bf16_mask(nc - 16);
            for (q = q_lo; q < q_hi; q++) {
                ptrdiff_t k = 2 * q;
                const __m512 z = _mm512_setzero_ps();
                __m512 x0 = sn_bf16_ld16(B, b_bf16, k * ldb + j0, m0);
                __m512 x1 = sn_bf16_ld16(B, b_bf16, k * ldb + j0 + 16, m1);
                __m512 y0 = k + 1 < K ? sn_bf16_ld16(B, b_bf16, (k + 1) * ldb + j0, m0) : z;
                __m512 y1 = k + 1 < K ? sn_bf16_ld16(B, b_bf16, (k + 1) * ldb + j0 + 16, m1) : z;
                _mm512_storeu_si512(panel + q * 32, sn_bf16_pairs16(x0, y0));
                _mm512_storeu_si512(panel + q * 32 + 16, sn_bf16_pairs16(x1, y1));
            }
        } else {
            /* column j is row j of the source, contiguous over k: the pair words of 16
             * columns x 16 pairs are converted as 16 rows and transposed in registers */
            ptrdiff_t c0;
            for (c0 = 0; c0 < 32; c0 += 16) {
                for (q = 0; q < Kq; q += 16) {
                    ptrdiff_t nq = Kq - q < 16 ? Kq - q : 16, k = 2 * q;
                    __m512i r[16];
                    for (c = 0; c < 16; c++) {
                        ptrdiff_t off = (j0 + c0 + c) * ldb + k;
                        r[c] = c0 + c < nc
                            ? sn_bf16_cvt32(sn_bf16_ld16(B, b_bf16, off, sn_bf16_mask(K - k)),
                                            sn_bf16_ld16(B, b_bf16, off + 16,
                                                         sn_bf16_mask(K - k - 16)))
                            : _mm512_setzero_si512();
                    }
                    sn_transpose16_epi32(r);
                    for (c = 0; c < nq; c++) _mm512_storeu_si512(panel + (q + c) * 32 + c0, r[c]);
                }
            }
        }
    }
}

/* Pack B (K x N) in panels of 32 columns (file comment).  B(k, j) = B[k * ldb + j], or
 * B[j * ldb + k] when trans_b; float32 or bfloat16 (b_bf16). */
SN_BF16_TARGET static void sn_bf16_pack_b(ptrdiff_t K, ptrdiff_t N, const void *B, int b_bf16,
                                          ptrdiff_t ldb, int trans_b, int32_t *out)
{
    sn_bf16_pack_b_part(K, N, B, b_bf16, ldb, trans_b, 0, trans_b ? N : K, out);
}

/* One mr x 32 tile of C (nc <= 32 columns stored, masked) over nq pairs: A's pair word of
 * row r and pair q is A[r * ars + q * aps], B is a panel (32 words per pair). */
#define SN_BF_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define SN_BF_REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define SN_BF_REP4(X) X(0) X(1) X(2) X(3)
#define SN_BF_REP2(X) X(0) X(1)
#define SN_BF_REP1(X) X(0)
#define SN_BF_DECL(r) __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
#define SN_BF_DP2(r) { __m512bh av = (__m512bh)_mm512_set1_epi32(a[(r) * ars]);                \
                       c0_##r = _mm512_dpbf16_ps(c0_##r, av, b0);                             \
                       c1_##r = _mm512_dpbf16_ps(c1_##r, av, b1); }
#define SN_BF_DP1(r) c0_##r = _mm512_dpbf16_ps(c0_##r,                                      \
                                               (__m512bh)_mm512_set1_epi32(a[(r) * ars]), b0);
#define SN_BF_STORE(r) { float *cr = C + (r) * ldc;                                           \
                         if (acc) {                                                          \
                             c0_##r = _mm512_add_ps(c0_##r, _mm512_maskz_loadu_ps(m0, cr));  \
                             if (m1) c1_##r = _mm512_add_ps(c1_##r,                          \
                                                            _mm512_maskz_loadu_ps(m1, cr + 16)); \
                         }                                                                   \
                         _mm512_mask_storeu_ps(cr, m0, c0_##r);                              \
                         if (m1) _mm512_mask_storeu_ps(cr + 16, m1, c1_##r); }
#define SN_BF_TILE(MR)                                                                        \
SN_BF16_TARGET static void sn_bf16_tile_##MR(ptrdiff_t nq, const int32_t *A, ptrdiff_t ars,   \
                                             ptrdiff_t aps, const int32_t *B, float *C,       \
                                             ptrdiff_t ldc, ptrdiff_t nc, int acc)            \
{                                                                                             \
    __mmask16 m0 = sn_bf16_mask(nc), m1 = sn_bf16_mask(nc - 16);                              \
    ptrdiff_t q;                                                                              \
    SN_BF_REP##MR(SN_BF_DECL)                                                                 \
    if (m1) {                                                                                 \
        for (q = 0; q < nq; q++) {                                                            \
            const int32_t *a = A + q * aps;                                                   \
            __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + q * 32);                           \
            __m512bh b1 = (__m512bh)_mm512_loadu_si512(B + q * 32 + 16);                      \
            SN_BF_REP##MR(SN_BF_DP2)                                                          \
        }                                                                                     \
    } else {                                                                                  \
        for (q = 0; q < nq; q++) {                                                            \
            const int32_t *a = A + q * aps;                                                   \
            __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + q * 32);                           \
            SN_BF_REP##MR(SN_BF_DP1)                                                          \
        }                                                                                     \
    }                                                                                         \
    (void)c1_0;                                                                               \
    SN_BF_REP##MR(SN_BF_STORE)                                                                \
}

SN_BF_TILE(12)
SN_BF_TILE(8)
SN_BF_TILE(4)
SN_BF_TILE(2)
SN_BF_TILE(1)

/* the tile height for the rows left: 12 while it fits, then 8, 4, 2, 1 */
static inline ptrdiff_t sn_bf16_mr(ptrdiff_t left)
{
    return left >= 12 ? 12 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

/* im2col of column rows r0 <= r < r1 (the contract and the loops of sn_im2col_rows_avx512
 * in sgemm_avx512.h: SN_IM2COL_ROWS_BODY) written in bfloat16: a convolution's bf16 products read their columns as
 * bfloat16 anyway, and the columns, written and read twice a step, are half the bytes.  Each
 * value is rounded as the packing would round it, so the products are the same. */
SN_BF16_TARGET static inline void sn_bf16_cvt_copy(uint16_t *dst, const float *src, ptrdiff_t n)
{
    ptrdiff_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(dst + j),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + j)));
    if (j < n) {
        __mmask16 m = sn_bf16_mask(n - j);
        _mm256_mask_storeu_epi16(dst + j, m,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + j)));
    }
}

static inline void sn_bf16_zero(uint16_t *dst, ptrdiff_t n)
{
    memset(dst, 0, (size_t)n * sizeof(uint16_t));
}

SN_BF16_TARGET static void sn_im2col_rows_bf16(const float *X, ptrdiff_t H, ptrdiff_t W,
                                               ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,
                                               ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t sh,
                                               ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,
                                               ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0,
                                               ptrdiff_t r1, uint16_t *dst)
SN_IM2COL_ROWS_BODY(sn_bf16_zero, sn_bf16_cvt_copy)

/* Convert rows i0 <= i < i0 + mb, pairs q0 <= q < q0 + nq of A into buf (see the file
 * comment: bfloat16 rows of nq words for a row-major A, micro-panels for a transposed one,
 * tile t of mr rows starting at word t_row0 * nq either way). */
SN_BF16_TARGET static void sn_bf16_pack_a(const void *A, int a_bf16, ptrdiff_t lda, int trans_a,
                                          ptrdiff_t K, ptrdiff_t i0, ptrdiff_t mb, ptrdiff_t q0,
                                          ptrdiff_t nq, int32_t *buf)
{
    ptrdiff_t r, q, ii, mr;
    if (!trans_a) {
        for (r = 0; r < mb; r++)
            sn_bf16_row_pairs(A, a_bf16, (i0 + r) * lda + 2 * q0, K - 2 * q0, nq, buf + r * nq);
        return;
    }
    /* A(i, k) = A[k * lda + i]: rows 2q and 2q + 1 of the source are contiguous over i */
    for (q = 0; q < nq; q++) {
        ptrdiff_t k = 2 * (q0 + q);
        for (ii = 0; ii < mb; ii += mr) {
            __mmask16 m;
            __m512 x, y;
            mr = sn_bf16_mr(mb - ii);
            m = sn_bf16_mask(mr);
            x = sn_bf16_ld16(A, a_bf16, k * lda + i0 + ii, m);
            y = k + 1 < K ? sn_bf16_ld16(A, a_bf16, (k + 1) * lda + i0 + ii, m)
                          : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(buf + ii * nq + q * mr, m, sn_bf16_pairs16(x, y));
        }
    }
}

/* C (M x N, row stride ldc) (+)= A(i, k) B(k, j) with B packed by sn_bf16_pack_b.
 * A(i, k) = A[i * lda + k], or A[k * lda + i] when trans_a; float32 or bfloat16 (a_bf16).
 * Returns 0, or -1 when out of memory (C untouched). */
SN_BF16_TARGET static int sn_bf16_gemm_packed(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K,
                                              const void *A, int a_bf16, ptrdiff_t lda,
                                              int trans_a, const int32_t *Bp, float *C,
                                              ptrdiff_t ldc, int accumulate)
{
    ptrdiff_t Kq = (K + 1) / 2, q0, i0, p, ii, mr;
    int32_t *buf;
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        if (!accumulate)
            for (i0 = 0; i0 < M; i0++) memset(C + i0 * ldc, 0, (size_t)N * sizeof(float));
        return 0;
    }
    buf = (int32_t *)malloc((size_t)SN_BF16_MC * SN_BF16_KQ * sizeof(int32_t) + 64);
    if (buf == NULL) return -1;
    for (q0 = 0; q0 < Kq; q0 += SN_BF16_KQ) {
        ptrdiff_t nq = Kq - q0 < SN_BF16_KQ ? Kq - q0 : SN_BF16_KQ;
        int acc = accumulate || q0 > 0;
        for (i0 = 0; i0 < M; i0 += SN_BF16_MC) {
            ptrdiff_t mb = M - i0 < SN_BF16_MC ? M - i0 : SN_BF16_MC;
            sn_bf16_pack_a(A, a_bf16, lda, trans_a, K, i0, mb, q0, nq, buf);
            for (p = 0; p < (N + 31) / 32; p++) {
                const int32_t *bp = Bp + (p * Kq + q0) * 32;
                ptrdiff_t nc = N - 32 * p < 32 ? N - 32 * p : 32;
                float *cp = C + i0 * ldc + 32 * p;
                for (ii = 0; ii < mb; ii += mr) {
                    const int32_t *a = buf + ii * nq;
                    mr = sn_bf16_mr(mb - ii);
                    /* row-major rows: pair q of row r at r * nq + q; panels: q * mr + r */
                    ptrdiff_t ars = trans_a ? 1 : nq, aps = trans_a ? mr : 1;
                    float *c = cp + ii * ldc;
                    switch (mr) {
                    case 12: sn_bf16_tile_12(nq, a, ars, aps, bp, c, ldc, nc, acc); break;
                    case 8: sn_bf16_tile_8(nq, a, ars, aps, bp, c, ldc, nc, acc); break;
                    case 4: sn_bf16_tile_4(nq, a, ars, aps, bp, c, ldc, nc, acc); break;
                    case 2: sn_bf16_tile_2(nq, a, ars, aps, bp, c, ldc, nc, acc); break;
                    default: sn_bf16_tile_1(nq, a, ars, aps, bp, c, ldc, nc, acc); break;
                    }
                }
            }
        }
    }
    free(buf);
    return 0;
}

/* The same product with B given as a matrix (packed here, for one use): B(k, j) =
 * B[k * ldb + j], or B[j * ldb + k] when trans_b.  Returns 0, or -1 when out of memory. */
SN_BF16_TARGET static int sn_bf16_gemm(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, const void *A,
                                       int a_bf16, ptrdiff_t lda, int trans_a, const void *B,
                                       int b_bf16, ptrdiff_t ldb, int trans_b, float *C,
                                       ptrdiff_t ldc, int accumulate)
{
    int32_t *bp;
    int rc;
    if (M <= 0 || N <= 0) return 0;
    bp = (int32_t *)malloc(sn_bf16_packed_bytes(K, N));
    if (bp == NULL) return -1;
    sn_bf16_pack_b(K, N, B, b_bf16, ldb, trans_b, bp);
    rc = sn_bf16_gemm_packed(M, N, K, A, a_bf16, lda, trans_a, bp, C, ldc, accumulate);
    free(bp);
    return rc;
}

/* the same products on AMX tiles, over the same packed B */
#include "bf16_amx.h"

#else
#define SN_HAVE_BF16_KERNEL 0
SN_BF16_UNUSED static int sn_bf16_cpu_features(void) { return 0; }
SN_BF16_UNUSED static int sn_bf16_cpu_ok(void) { return 0; }
SN_BF16_UNUSED static void sn_f32_to_bf16_avx512(const float *x, uint16_t *y, ptrdiff_t n)
{
    sn_f32_to_bf16_scalar(x, y, n);
}
SN_BF16_UNUSED static void sn_bf16_pack_b(ptrdiff_t K, ptrdiff_t N, const void *B, int b_bf16,
                                          ptrdiff_t ldb, int trans_b, int32_t *out)
{
    (void)K; (void)N; (void)B; (void)b_bf16; (void)ldb; (void)trans_b; (void)out;
}
SN_BF16_UNUSED static void sn_bf16_pack_b_part(ptrdiff_t K, ptrdiff_t N, const void *B,
                                               int b_bf16, ptrdiff_t ldb, int trans_b,
                                               ptrdiff_t lo, ptrdiff_t hi, int32_t *out)
{
    (void)K; (void)N; (void)B; (void)b_bf16; (void)ldb; (void)trans_b; (void)lo; (void)hi;
    (void)out;
}
SN_BF16_UNUSED static void sn_im2col_rows_bf16(const float *X, ptrdiff_t H, ptrdiff_t W,
                                               ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,
                                               ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t sh,
                                               ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,
                                               ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0,
                                               ptrdiff_t r1, uint16_t *dst)
{
    (void)X; (void)H; (void)W; (void)C; (void)OH; (void)OW; (void)KH; (void)KW; (void)sh;
    (void)sw; (void)ph; (void)pw; (void)dh; (void)dw; (void)r0; (void)r1; (void)dst;
}
SN_BF16_UNUSED static int sn_bf16_gemm_packed(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K,
                                              const void *A, int a_bf16, ptrdiff_t lda,
                                              int trans_a, const int32_t *Bp, float *C,
                                              ptrdiff_t ldc, int accumulate)
{
    (void)M; (void)N; (void)K; (void)A; (void)a_bf16; (void)lda; (void)trans_a; (void)Bp;
    (void)C; (void)ldc; (void)accumulate;
    return -1;
}
SN_BF16_UNUSED static int sn_bf16_gemm(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K, const void *A,
                                       int a_bf16, ptrdiff_t lda, int trans_a, const void *B,
                                       int b_bf16, ptrdiff_t ldb, int trans_b, float *C,
                                       ptrdiff_t ldc, int accumulate)
{
    (void)M; (void)N; (void)K; (void)A; (void)a_bf16; (void)lda; (void)trans_a; (void)B;
    (void)b_bf16; (void)ldb; (void)trans_b; (void)C; (void)ldc; (void)accumulate;
    return -1;
}
#define SN_AMX_OK 1
#define SN_AMX_NO_CPU -1
#define SN_AMX_NO_OS -2
#define SN_AMX_NOT_LINUX -3
#define SN_AMX_REFUSED -4
SN_BF16_UNUSED static int sn_amx_status(void) { return SN_AMX_NO_CPU; }
SN_BF16_UNUSED static int sn_amx_worth(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K)
{
    (void)M; (void)N; (void)K;
    return 0;
}
SN_BF16_UNUSED static int sn_amx_errno(void) { return 0; }
SN_BF16_UNUSED static int sn_amx_gemm_packed(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K,
                                             const void *A, int a_bf16, ptrdiff_t lda,
                                             int trans_a, const int32_t *Bp, float *C,
                                             ptrdiff_t ldc, int accumulate)
{
    (void)M; (void)N; (void)K; (void)A; (void)a_bf16; (void)lda; (void)trans_a; (void)Bp;
    (void)C; (void)ldc; (void)accumulate;
    return -1;
}
#endif

#endif

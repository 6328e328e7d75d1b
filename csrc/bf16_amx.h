/* The bfloat16 GEMM of bf16_gemm.h on AMX tiles (AMX-BF16 ``tdpbf16ps``): the same product,
 *
 *   C[i, j] = (accumulate ? C[i, j] : 0) + sum_k bf16(A(i, k)) * bf16(B(k, j)),
 *
 * the same packed B, float32 accumulation.  Included by bf16_gemm.h (x86-64 with GCC or
 * Clang); everything that needs the instructions is compiled for them with function
 * attributes, whatever the build's target.
 *
 * Arithmetic.  ``tdpbf16ps`` takes an A tile of 16 rows x 16 pairs (16 x 32 bfloat16) and a
 * B tile of 16 pair-rows x 16 columns and adds to each float32 C[i, j] of a 16 x 16 tile,
 * pair by pair, a[i][2q] * b[q][2j] + a[i][2q + 1] * b[q][2j + 1] (exact products of two
 * bfloat16, float32 sums, as ``vdpbf16ps``): the result is a float32 GEMM on the rounded
 * operands up to the order of the additions, like the AVX512-BF16 kernel's.
 *
 * Layout.
 * - B is bf16_gemm.h's packed B unchanged: in a panel of 32 columns, pair-row q is 32 words
 *   (128 bytes), so the B tile of pairs q .. q + 15 and columns 0-15 (or 16-31) of the panel is
 *   16 rows of 64 bytes at stride 128 bytes, read in place.  When the pairs of a K block are
 *   not a multiple of 16, the last (partial) tile of each panel is copied, zero-padded, to a
 *   16 x 32-word scratch: a tile never reads past the panel, and padding pairs are zeros on
 *   both sides (never 0 * inf).
 * - A is converted block by block (``SN_AMX_MC`` rows x ``SN_AMX_KQ`` pairs) into bfloat16
 *   pair rows of ``nqp`` words (the block's pairs rounded up to 16, zeros past them; rows
 *   rounded up to 16, zero rows past M): the A tile of rows i .. i + 15 and pairs q .. q + 15
 *   is 16 rows of 64 bytes at stride 4 nqp bytes.  A transposed A is converted 16 pairs x 16
 *   rows at a time and transposed in registers.
 * - The micro-kernel keeps a 32 x 32 block of C in four accumulator tiles (tmm0-3); per 16
 *   pairs it loads two A tiles (tmm4-5) and two B tiles (tmm6-7) and issues four
 *   ``tdpbf16ps``: 32 x 32 x 32 multiply-adds for 4 KiB of loads.  A block at an edge of C
 *   (fewer than 32 rows or columns left) uses one A tile or one B tile when 16 suffice, and
 *   goes through a 32 x 32 float32 scratch that is copied to or from C under masks.
 * - Per K block and block of A, the panels of B are the outer loop and the 32-row blocks of
 *   C the inner one: a panel's slab (``SN_AMX_KQ`` pairs x 128 bytes, 32 KiB) stays in the
 *   L1 cache while the block of A (128 KiB) is read from L2.
 *
 * One tile configuration (every tile 16 rows x 64 bytes) is loaded per call and released at
 * its end (``tilerelease``: the thread leaves no tile state behind for context switches).
 *
 * Permission.  Linux hands the tile state (XTILEDATA, 8 KiB) to a process only after
 * ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; the permission holds for all the
 * threads of the process and is inherited by fork() (cleared by exec).  It is refused
 * (ENOSPC) while a thread has an alternate signal stack too small for the larger signal
 * frame.  ``sn_amx_status()`` asks once per process, the first time it is called, and keeps
 * the answer (an atomic int: threads racing on the first call make the same idempotent
 * request).
 */
#ifndef SPARKNET_BF16_AMX_H
#define SPARKNET_BF16_AMX_H

#include <errno.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#if !defined(_DEFAULT_SOURCE) && !defined(_GNU_SOURCE)
long syscall(long number, ...);     /* <unistd.h> declares it only then (strict -std=c11) */
#endif
#endif

/* rows of A per block (a multiple of 32), pairs of k per block (a multiple of 16) */
#ifndef SN_AMX_MC
#define SN_AMX_MC 128
#endif
#ifndef SN_AMX_KQ
#define SN_AMX_KQ 256
#endif

/* sn_amx_status(): 1 usable; 0 not asked yet (internal); else why not */
#define SN_AMX_OK 1
#define SN_AMX_NO_CPU -1       /* cpuid: no AMX-BF16/AMX-TILE, or no AVX512-BF16 to pack with */
#define SN_AMX_NO_OS -2        /* XCR0: the OS does not manage the tile state */
#define SN_AMX_NOT_LINUX -3    /* no arch_prctl to ask for the tile state */
#define SN_AMX_REFUSED -4      /* arch_prctl refused: errno in sn_amx_errno() */

static int sn_amx_state_v;
static int sn_amx_errno_v;

SN_BF16_UNUSED static int sn_amx_errno(void)
{
    return __atomic_load_n(&sn_amx_errno_v, __ATOMIC_ACQUIRE);
}

/* Whether the AMX kernel can run in this process; the first call asks Linux for the tile
 * state (file comment). */
SN_BF16_UNUSED static int sn_amx_status(void)
{
    int s = __atomic_load_n(&sn_amx_state_v, __ATOMIC_ACQUIRE);
    unsigned xlo = 0, xhi = 0;
    if (s != 0) return s;
    if ((sn_bf16_cpu_features() & 3) != 3) {
        s = SN_AMX_NO_CPU;
    } else {
        __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
        (void)xhi;
        if ((xlo & (3u << 17)) != (3u << 17)) {            /* XTILECFG, XTILEDATA */
            s = SN_AMX_NO_OS;
        } else {
#if defined(__linux__) && defined(SYS_arch_prctl)
            /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 */
            if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) {
                s = SN_AMX_OK;
            } else {
                __atomic_store_n(&sn_amx_errno_v, errno, __ATOMIC_RELEASE);
                s = SN_AMX_REFUSED;
            }
#else
            s = SN_AMX_NOT_LINUX;
#endif
        }
    }
    __atomic_store_n(&sn_amx_state_v, s, __ATOMIC_RELEASE);
    return s;
}

/* Whether a product of this shape is faster on AMX than on the AVX512-BF16 kernel.  A tile
 * pads rows to 16 and pairs to 16, and each call configures and releases the tiles (~0.3 us):
 * measured on a Xeon with AMX-BF16 (a VM, one thread, 2026-12, benchmarks/bench_gemm_bf16.py and
 * a C loop), AMX lost with M <= 2 (M = 1, N = 512, K = 784: 0.97x), K <= 8 (M = 64, N = 512,
 * K = 4: 0.79x) or M N K <= 16384 (8 x 32 x 64: 0.88x), and won everywhere else it was tried
 * (M = 4, N = 512, K = 784: 2.0x; 8 x 10 x 256: 1.4x; 128 x 256 x 10: 1.4x; the nets'
 * products 1.4x to 8x). */
SN_BF16_UNUSED static int sn_amx_worth(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K)
{
    return M >= 4 && K > 8 && M * N * K >= 20000;
}

#define SN_AMX_TARGET                                                                        \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl,fma"), unused))

/* The tile configuration (palette 1): tmm0-7 all 16 rows x 64 bytes. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} sn_amx_config;

static const sn_amx_config sn_amx_cfg __attribute__((aligned(64))) = {
    1, 0, {0},
    {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}};

/* The tile instructions are asm statements that do not tell the compiler what memory they
 * read: a barrier before the loads makes the stores that fill their source happen first. */
#define SN_AMX_BARRIER() __asm__ volatile("" ::: "memory")

/* Convert rows i0 <= i < i0 + mb, pairs q0 <= q < q0 + nq of A into pair rows of nqp words
 * (file comment), rows rounded up to 16; zeros pad the pairs past nq and the rows past mb. */
SN_AMX_TARGET static void sn_amx_pack_a(const void *A, int a_bf16, ptrdiff_t lda, int trans_a,
                                        ptrdiff_t K, ptrdiff_t i0, ptrdiff_t mb, ptrdiff_t q0,
                                        ptrdiff_t nq, ptrdiff_t nqp, int32_t *buf)
{
    ptrdiff_t mbp = (mb + 15) & ~(ptrdiff_t)15, r, q, t, ii;
    if (!trans_a) {
        /* the values of the block's pairs only: 2 nq of them, or fewer at the end of K */
        ptrdiff_t n = K - 2 * q0 < 2 * nq ? K - 2 * q0 : 2 * nq;
        for (r = 0; r < mb; r++)
            sn_bf16_row_pairs(A, a_bf16, (i0 + r) * lda + 2 * q0, n, nqp, buf + r * nqp);
        for (; r < mbp; r++) memset(buf + r * nqp, 0, (size_t)nqp * sizeof(int32_t));
        return;
    }
    /* A(i, k) = A[k * lda + i]: 16 pairs of 16 rows as 16 vectors over i (word c of vector t
     * is pair q + t of row ii + c), then transposed to 16 rows of 16 pairs */
    for (q = 0; q < nqp; q += 16) {
        for (ii = 0; ii < mbp; ii += 16) {
            __mmask16 m = sn_bf16_mask(mb - ii);
            __m512i v[16];
            for (t = 0; t < 16; t++) {
                ptrdiff_t k = 2 * (q0 + q + t);
                const __m512 z = _mm512_setzero_ps();
                __m512 x = q + t < nq ? sn_bf16_ld16(A, a_bf16, k * lda + i0 + ii, m) : z;
                __m512 y = q + t < nq && k + 1 < K
                    ? sn_bf16_ld16(A, a_bf16, (k + 1) * lda + i0 + ii, m) : z;
                v[t] = sn_bf16_pairs16(x, y);
            }
            sn_transpose16_epi32(v);
            for (t = 0; t < 16; t++) _mm512_storeu_si512(buf + (ii + t) * nqp + q, v[t]);
        }
    }
}

/* C (rows x cols, row stride ld) <-> a 32 x 32 scratch (row stride 32), under masks. */
SN_AMX_TARGET static void sn_amx_to_scratch(const float *C, ptrdiff_t ld, ptrdiff_t rows,
                                            ptrdiff_t cols, float *s)
{
    __mmask16 m0 = sn_bf16_mask(cols), m1 = sn_bf16_mask(cols - 16);
    ptrdiff_t r;
    for (r = 0; r < rows; r++) {
        _mm512_storeu_ps(s + r * 32, _mm512_maskz_loadu_ps(m0, C + r * ld));
        _mm512_storeu_ps(s + r * 32 + 16, _mm512_maskz_loadu_ps(m1, C + r * ld + 16));
    }
}

SN_AMX_TARGET static void sn_amx_from_scratch(const float *s, ptrdiff_t rows, ptrdiff_t cols,
                                              float *C, ptrdiff_t ld)
{
    __mmask16 m0 = sn_bf16_mask(cols), m1 = sn_bf16_mask(cols - 16);
    ptrdiff_t r;
    for (r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(C + r * ld, m0, _mm512_loadu_ps(s + r * 32));
        if (m1) _mm512_mask_storeu_ps(C + r * ld + 16, m1, _mm512_loadu_ps(s + r * 32 + 16));
    }
}

/* One block of C: MA A tiles (16 rows each) x NB B tiles (16 columns each), over ns full
 * steps of 16 pairs read from a (pair rows, stride as bytes) and b (a panel, 32 words per
 * pair), then one step from bt when bt is not NULL (the zero-padded last pairs).  C at c,
 * row stride cs bytes; acc: C is added to, else overwritten. */
#define SN_AMX_BLOCK(MA, NB)                                                                  \
SN_AMX_TARGET static void sn_amx_block_##MA##NB(ptrdiff_t ns, const int32_t *a, ptrdiff_t as, \
                                                const int32_t *b, const int32_t *bt, float *c, \
                                                ptrdiff_t cs, int acc)                        \
{                                                                                             \
    const int32_t *a1 = a + 16 * (as / 4);                                                    \
    ptrdiff_t s;                                                                              \
    SN_AMX_BARRIER();                                                                         \
    if (acc) {                                                                                \
        _tile_loadd(0, c, cs);                                                                \
        if (NB == 2) _tile_loadd(1, c + 16, cs);                                              \
        if (MA == 2) _tile_loadd(2, c + 16 * (cs / 4), cs);                                   \
        if (MA == 2 && NB == 2) _tile_loadd(3, c + 16 * (cs / 4) + 16, cs);                   \
    } else {                                                                                  \
        _tile_zero(0);                                                                        \
        if (NB == 2) _tile_zero(1);                                                           \
        if (MA == 2) _tile_zero(2);                                                           \
        if (MA == 2 && NB == 2) _tile_zero(3);                                                \
    }                                                                                         \
    for (s = 0; s <= ns; s++) {                                                               \
        const int32_t *bs = s < ns ? b + s * 512 : bt;                                        \
        if (bs == NULL) break;                                                                \
        _tile_loadd(6, bs, 128);                                                              \
        if (NB == 2) _tile_loadd(7, bs + 16, 128);                                            \
        _tile_loadd(4, a + s * 16, as);                                                       \
        _tile_dpbf16ps(0, 4, 6);                                                              \
        if (NB == 2) _tile_dpbf16ps(1, 4, 7);                                                 \
        if (MA == 2) {                                                                        \
            _tile_loadd(5, a1 + s * 16, as);                                                  \
            _tile_dpbf16ps(2, 5, 6);                                                          \
            if (NB == 2) _tile_dpbf16ps(3, 5, 7);                                             \
        }                                                                                     \
    }                                                                                         \
    _tile_stored(0, c, cs);                                                                   \
    if (NB == 2) _tile_stored(1, c + 16, cs);                                                 \
    if (MA == 2) _tile_stored(2, c + 16 * (cs / 4), cs);                                      \
    if (MA == 2 && NB == 2) _tile_stored(3, c + 16 * (cs / 4) + 16, cs);                      \
}

SN_AMX_BLOCK(2, 2)
SN_AMX_BLOCK(2, 1)
SN_AMX_BLOCK(1, 2)
SN_AMX_BLOCK(1, 1)

/* The block of C at rows ii .. ii + mr - 1 (mr <= 32) and the nc <= 32 columns of a panel:
 * in place when it fills its tiles, else through the scratch cs. */
SN_AMX_TARGET static void sn_amx_block(ptrdiff_t ns, const int32_t *a, ptrdiff_t nqp,
                                       const int32_t *b, const int32_t *bt, float *c,
                                       ptrdiff_t ldc, ptrdiff_t mr, ptrdiff_t nc, int acc,
                                       float *scratch)
{
    int ma = mr > 16 ? 2 : 1, nb = nc > 16 ? 2 : 1;
    int direct = mr == 16 * ma && nc == 16 * nb;
    float *dst = direct ? c : scratch;
    ptrdiff_t cs = direct ? ldc * (ptrdiff_t)sizeof(float) : 32 * (ptrdiff_t)sizeof(float);
    ptrdiff_t as = nqp * (ptrdiff_t)sizeof(int32_t);
    if (!direct && acc) sn_amx_to_scratch(c, ldc, mr, nc, scratch);
    switch (ma * 2 + nb) {
    case 6: sn_amx_block_22(ns, a, as, b, bt, dst, cs, acc); break;
    case 5: sn_amx_block_21(ns, a, as, b, bt, dst, cs, acc); break;
    case 4: sn_amx_block_12(ns, a, as, b, bt, dst, cs, acc); break;
    default: sn_amx_block_11(ns, a, as, b, bt, dst, cs, acc); break;
    }
    if (!direct) sn_amx_from_scratch(scratch, mr, nc, c, ldc);
}

/* C (M x N, row stride ldc) (+)= A(i, k) B(k, j) with B packed by sn_bf16_pack_b, as
 * sn_bf16_gemm_packed; the caller has checked sn_amx_status() == SN_AMX_OK.  Returns 0, or
 * -1 when out of memory (C untouched). */
SN_AMX_TARGET static int sn_amx_gemm_packed(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K,
                                            const void *A, int a_bf16, ptrdiff_t lda,
                                            int trans_a, const int32_t *Bp, float *C,
                                            ptrdiff_t ldc, int accumulate)
{
    ptrdiff_t Kq = (K + 1) / 2, q0, i0, p, ii;
    ptrdiff_t rows = M < SN_AMX_MC ? (M + 15) & ~(ptrdiff_t)15 : SN_AMX_MC;
    ptrdiff_t words = Kq < SN_AMX_KQ ? (Kq + 15) & ~(ptrdiff_t)15 : SN_AMX_KQ;
    size_t abytes = (size_t)rows * (size_t)words * sizeof(int32_t);
    int32_t *buf, *bt;
    float *scratch;
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        if (!accumulate)
            for (i0 = 0; i0 < M; i0++) memset(C + i0 * ldc, 0, (size_t)N * sizeof(float));
        return 0;
    }
    /* A block, the last partial B tile (16 x 32 words), the C scratch (32 x 32 floats) */
    buf = (int32_t *)aligned_alloc(64, abytes + 16 * 32 * 4 + 32 * 32 * 4);
    if (buf == NULL) return -1;
    bt = buf + abytes / sizeof(int32_t);
    scratch = (float *)(bt + 16 * 32);
    _tile_loadconfig(&sn_amx_cfg);
    for (q0 = 0; q0 < Kq; q0 += SN_AMX_KQ) {
        ptrdiff_t nq = Kq - q0 < SN_AMX_KQ ? Kq - q0 : SN_AMX_KQ;
        ptrdiff_t ns = nq / 16, nt = nq % 16, nqp = (nq + 15) & ~(ptrdiff_t)15;
        int acc = accumulate || q0 > 0;
        for (i0 = 0; i0 < M; i0 += SN_AMX_MC) {
            ptrdiff_t mb = M - i0 < SN_AMX_MC ? M - i0 : SN_AMX_MC;
            sn_amx_pack_a(A, a_bf16, lda, trans_a, K, i0, mb, q0, nq, nqp, buf);
            for (p = 0; p < (N + 31) / 32; p++) {
                const int32_t *bp = Bp + (p * Kq + q0) * 32;
                ptrdiff_t nc = N - 32 * p < 32 ? N - 32 * p : 32;
                if (nt) {
                    memcpy(bt, bp + ns * 512, (size_t)nt * 32 * sizeof(int32_t));
                    memset(bt + nt * 32, 0, (size_t)(16 - nt) * 32 * sizeof(int32_t));
                }
                for (ii = 0; ii < mb; ii += 32) {
                    ptrdiff_t mr = mb - ii < 32 ? mb - ii : 32;
                    sn_amx_block(ns, buf + ii * nqp, nqp, bp, nt ? bt : NULL,
                                 C + (i0 + ii) * ldc + 32 * p, ldc, mr, nc, acc, scratch);
                }
            }
        }
    }
    _tile_release();
    free(buf);
    return 0;
}

#endif

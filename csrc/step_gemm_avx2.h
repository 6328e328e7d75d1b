/* The recurrent steps' float32 products on AVX2 + FMA CPUs (included by recurrent_kernels.h):
 * the same contracts and the same 32-column panels of B as the AVX-512 kernels there, on
 * 256-bit registers.  A panel is read as two 16-column halves; a register block of C is
 * 6 rows x 16 columns (12 ymm accumulators, two registers of B and one broadcast of A), the
 * shape that fills the two FMA pipes of these cores.  B's panels are zero padded, so only
 * C's edge columns need masks.
 *
 * One block body serves both operand orders: A(r, k) = A[r * rs + k * ks], with (rs, ks) =
 * (lda, 1) for A (M x K) row-major and (1, lda) for A given transposed (At, K x M) as the
 * weight gradients read dgates.
 */
#ifndef SPARKNET_STEP_GEMM_AVX2_H
#define SPARKNET_STEP_GEMM_AVX2_H

#include <immintrin.h>
#include <string.h>

/* lanes 0..w-1 of 8 set (w clamped to 0..8) */
__attribute__((target("avx2")))
static inline __m256i sn_mask8(int w) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(w), iota);
}

/* C[R x 16] (+)= A(R x K) @ B + A2(R x K2) @ B2, B and B2 with rows 32 floats apart;
   R a constant once inlined, so that the accumulators live in registers.  w: C's columns
   (1..16); full stores when w == 16 (masked stores are slow on some cores). */
__attribute__((target("avx2,fma"), always_inline))
static inline void sn_block_avx2(const int R, int K, const float* A, long rs, long ks,
                                 const float* B, int K2, const float* A2, long rs2, long ks2,
                                 const float* B2, float* C, int ldc, int acc, int w) {
    __m256 c0[6], c1[6];
    const __m256i m0 = sn_mask8(w), m1 = sn_mask8(w - 8);
    for (int r = 0; r < R; r++) {
        if (acc) {
            c0[r] = _mm256_maskload_ps(C + (long)r * ldc, m0);
            c1[r] = _mm256_maskload_ps(C + (long)r * ldc + 8, m1);
        } else {
            c0[r] = _mm256_setzero_ps();
            c1[r] = _mm256_setzero_ps();
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(B + (long)k * 32);
        const __m256 b1 = _mm256_loadu_ps(B + (long)k * 32 + 8);
        const float* ak = A + k * ks;
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(ak + r * rs);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < K2; k++) {
        const __m256 b0 = _mm256_loadu_ps(B2 + (long)k * 32);
        const __m256 b1 = _mm256_loadu_ps(B2 + (long)k * 32 + 8);
        const float* ak = A2 + k * ks2;
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(ak + r * rs2);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (w == 16) {
            _mm256_storeu_ps(C + (long)r * ldc, c0[r]);
            _mm256_storeu_ps(C + (long)r * ldc + 8, c1[r]);
        } else {
            _mm256_maskstore_ps(C + (long)r * ldc, m0, c0[r]);
            _mm256_maskstore_ps(C + (long)r * ldc + 8, m1, c1[r]);
        }
    }
}

/* The rows of C (M x w, w <= 16 columns) in blocks of 6, the remainder in one smaller block. */
__attribute__((target("avx2,fma")))
static void sn_rows_avx2(int M, int K, const float* A, long rs, long ks, const float* B, int K2,
                         const float* A2, long rs2, long ks2, const float* B2, float* C, int ldc,
                         int acc, int w) {
    int i = 0;
    for (; i + 6 <= M; i += 6)
        sn_block_avx2(6, K, A + i * rs, rs, ks, B, K2, A2 + i * rs2, rs2, ks2, B2,
                      C + (long)i * ldc, ldc, acc, w);
    const float* a = A + i * rs;
    const float* a2 = A2 + i * rs2;
    float* c = C + (long)i * ldc;
    switch (M - i) {
        case 5: sn_block_avx2(5, K, a, rs, ks, B, K2, a2, rs2, ks2, B2, c, ldc, acc, w); break;
        case 4: sn_block_avx2(4, K, a, rs, ks, B, K2, a2, rs2, ks2, B2, c, ldc, acc, w); break;
        case 3: sn_block_avx2(3, K, a, rs, ks, B, K2, a2, rs2, ks2, B2, c, ldc, acc, w); break;
        case 2: sn_block_avx2(2, K, a, rs, ks, B, K2, a2, rs2, ks2, B2, c, ldc, acc, w); break;
        case 1: sn_block_avx2(1, K, a, rs, ks, B, K2, a2, rs2, ks2, B2, c, ldc, acc, w); break;
        default: break;
    }
}

/* C[M x Nc] (+)= A[M x K] @ B + A2[M x K2] @ B2, B and B2 in 32-column panels (K2 may be 0):
   sn_sgemm_panels2_avx512's contract. */
__attribute__((target("avx2,fma"), unused))
static void sn_sgemm_panels2_avx2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                  int K2, const float* A2, int lda2, const float* Bp2,
                                  float* C, int ldc, int acc) {
    for (int j = 0; j < Nc; j += 16) {
        int w = Nc - j < 16 ? Nc - j : 16;
        /* panel j/32, half (j % 32)/16 */
        const float* B = Bp + (long)(j / 32) * K * 32 + (j % 32);
        const float* B2 = K2 > 0 ? Bp2 + (long)(j / 32) * K2 * 32 + (j % 32) : B;
        sn_rows_avx2(M, K, A, lda, 1, B, K2, A2, lda2, 1, B2, C + j, ldc, acc, w);
    }
}

/* C[M x Nc] (+)= A[M x K] @ B (B in panels): sn_sgemm_panels_avx512's contract, a long K in
   chunks of 128 rows so that a half panel's chunk (8 KiB) stays in L1 beside A's rows. */
__attribute__((target("avx2,fma"), unused))
static void sn_sgemm_panels_avx2(int M, int Nc, int K, const float* A, int lda, const float* Bp,
                                 float* C, int ldc, int acc) {
    const int Kc = 128;
    for (int j = 0; j < Nc; j += 16) {
        int w = Nc - j < 16 ? Nc - j : 16;
        const float* B = Bp + (long)(j / 32) * K * 32 + (j % 32);
        for (int k0 = 0; k0 < K; k0 += Kc) {
            int kc = K - k0 < Kc + Kc / 2 ? K - k0 : Kc;
            sn_rows_avx2(M, kc, A + k0, lda, 1, B + (long)k0 * 32, 0, A, lda, 1, B, C + j,
                         ldc, acc || k0 > 0, w);
            if (kc != Kc) break;
        }
    }
}

/* C[M x Nc] (+)= At^T @ B with At (K x M) row-major (row stride lda), B in panels:
   sn_sgemm_panels_tn_avx512's contract (the weight gradients), K in chunks of 256 rows.
   (Copying a chunk of At into 6-column blocks first, so that a block's broadcasts read one
   cache line per k, measured slower: 72 against 74-76 GFLOP/s on a Zen 3.) */
__attribute__((target("avx2,fma"), unused))
static void sn_sgemm_panels_tn_avx2(int M, int Nc, int K, const float* At, int lda, const float* Bp,
                                    float* C, int ldc, int acc) {
    const int Kc = 256;
    for (int j = 0; j < Nc; j += 16) {
        int w = Nc - j < 16 ? Nc - j : 16;
        const float* B = Bp + (long)(j / 32) * K * 32 + (j % 32);
        for (int k0 = 0; k0 < K; k0 += Kc) {
            int kc = K - k0 < Kc ? K - k0 : Kc;
            sn_rows_avx2(M, kc, At + (long)k0 * lda, 1, lda, B + (long)k0 * 32, 0, At, 1, lda,
                         B, C + j, ldc, acc || k0 > 0, w);
        }
    }
}

/* Panels of 32 columns of src (K x Nc, row stride ld), zero padded: sn_pack_panels_avx512's
   contract in plain copies. */
__attribute__((unused))
static void sn_pack_panels_c(const float* src, int ld, int K, int Nc, float* out) {
    for (int j = 0; j < Nc; j += 32) {
        int w = Nc - j < 32 ? Nc - j : 32;
        float* dst = out + (long)(j / 32) * K * 32;
        for (int k = 0; k < K; k++) {
            memcpy(dst + (long)k * 32, src + (long)k * ld + j, (size_t)w * sizeof(float));
            if (w < 32) memset(dst + (long)k * 32 + w, 0, (size_t)(32 - w) * sizeof(float));
        }
    }
}

#endif

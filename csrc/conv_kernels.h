/* Elementwise and pooling loops of the conv layers, in plain C so that ``restrict`` lets
 * the compiler vectorise them, and written without data-dependent branches (a relu or a
 * max over random data mispredicts about half of its branches).
 *
 * Layout: channels-last rows; a "row" is the F (or C) channel values of one pixel.
 * Every function exists for float (suffix _f) and double (suffix _d).
 */
#ifndef SPARKNET_CONV_KERNELS_H
#define SPARKNET_CONV_KERNELS_H

#include <stddef.h>
#include <string.h>

#if defined(_MSC_VER) && !defined(restrict)
#  define restrict __restrict
#endif

/* The wheel is built for baseline x86-64 (SSE2), where these loops vectorise poorly;
 * GCC's function multi-versioning compiles AVX-512 and AVX2 clones as well and picks one
 * at load time from the CPU it runs on. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#  if __GNUC__ >= 12
#    define SN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#  else
#    define SN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#  endif
#else
#  define SN_CLONES
#endif
#if defined(__GNUC__)
#  define SN_UNUSED __attribute__((unused))
#else
#  define SN_UNUSED
#endif
/* short copies (a few floats for a one-channel image) must stay inline loops, not calls */
#if defined(__GNUC__) && !defined(__clang__)
#  define SN_NO_MEMCPY __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#  define SN_NO_MEMCPY
#endif

#define SN_CONV_DEFINE(T, S)                                                                  \
/* y[r, :] = y[r, :] + b (b may be NULL), then relu if relu != 0; rows x F, in place. */     \
SN_CLONES SN_UNUSED static void sn_bias_relu_##S(T *restrict y, const T *restrict b, ptrdiff_t rows,      \
                                    ptrdiff_t F, int relu)                                    \
{                                                                                             \
    ptrdiff_t i, j;                                                                           \
    for (i = 0; i < rows; i++, y += F) {                                                      \
        if (b && relu) {                                                                      \
            for (j = 0; j < F; j++) { T v = y[j] + b[j]; y[j] = v > 0 ? v : (T)0; }           \
        } else if (b) {                                                                       \
            for (j = 0; j < F; j++) y[j] += b[j];                                             \
        } else if (relu) {                                                                    \
            for (j = 0; j < F; j++) { T v = y[j]; y[j] = v > 0 ? v : (T)0; }                  \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* d <- d * [y > 0] if relu; db[j] = sum_r d[r, j] if db != NULL (overwritten). */           \
SN_CLONES SN_UNUSED static void sn_relu_grad_bias_grad_##S(const T *restrict y, T *restrict d,             \
                                              T *restrict db, ptrdiff_t rows, ptrdiff_t F,    \
                                              int relu)                                       \
{                                                                                             \
    ptrdiff_t i, j;                                                                           \
    if (db) memset(db, 0, (size_t)F * sizeof(T));                                             \
    for (i = 0; i < rows; i++, y += F, d += F) {                                              \
        if (relu) {                                                                           \
            for (j = 0; j < F; j++) d[j] = y[j] > 0 ? d[j] : (T)0;                            \
        }                                                                                     \
        if (db) {                                                                             \
            for (j = 0; j < F; j++) db[j] += d[j];                                            \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* Max pooling of one sample x (H, W, C) into y (OH, OW, C); arg receives the winner's      \
 * index (ih * W + iw) * C + c.  Row-major window scan, strictly-greater replaces: the       \
 * first maximum in row-major window order wins ties.  Taps outside the image are skipped.  \
 */                                                                                           \
SN_CLONES SN_UNUSED static void sn_maxpool_fwd_##S(const T *restrict x, T *restrict y, int *restrict arg, \
                                      ptrdiff_t H, ptrdiff_t W, ptrdiff_t C, ptrdiff_t OH,    \
                                      ptrdiff_t OW, ptrdiff_t PH, ptrdiff_t PW, ptrdiff_t sh,  \
                                      ptrdiff_t sw, ptrdiff_t pt, ptrdiff_t pl)               \
{                                                                                             \
    ptrdiff_t oh, ow, i, j, c;                                                                \
    for (oh = 0; oh < OH; oh++) {                                                             \
        ptrdiff_t ih0 = oh * sh - pt;                                                         \
        ptrdiff_t i0 = ih0 < 0 ? -ih0 : 0, i1 = ih0 + PH > H ? H - ih0 : PH;                  \
        for (ow = 0; ow < OW; ow++) {                                                         \
            ptrdiff_t iw0 = ow * sw - pl;                                                     \
            ptrdiff_t j0 = iw0 < 0 ? -iw0 : 0, j1 = iw0 + PW > W ? W - iw0 : PW;              \
            T *restrict yv = y + (oh * OW + ow) * C;                                          \
            int *restrict a = arg + (oh * OW + ow) * C;                                       \
            ptrdiff_t base = ((ih0 + i0) * W + iw0 + j0) * C;                                 \
            const T *restrict src = x + base;                                                 \
            for (c = 0; c < C; c++) { yv[c] = src[c]; a[c] = (int)(base + c); }               \
            for (i = i0; i < i1; i++) {                                                       \
                for (j = (i == i0 ? j0 + 1 : j0); j < j1; j++) {                              \
                    base = ((ih0 + i) * W + iw0 + j) * C;                                     \
                    src = x + base;                                                           \
                    for (c = 0; c < C; c++) {                                                 \
                        T v = src[c];                                                         \
                        int gt = v > yv[c];                                                   \
                        yv[c] = gt ? v : yv[c];                                               \
                        a[c] = gt ? (int)(base + c) : a[c];                                   \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* Max pooling backward of one sample whose windows tile the image (stride = pool size, no   \
 * padding): every input value is written once (the window's winner gets dy, the others 0,  \
 * pixels no window covers 0), with no separate zero-fill pass.                               \
 */                                                                                           \
SN_CLONES SN_UNUSED static void sn_maxpool_bwd_tiled_##S(const T *restrict dy, const int *restrict arg,    \
                                            T *restrict dx, ptrdiff_t H, ptrdiff_t W,         \
                                            ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,          \
                                            ptrdiff_t PH, ptrdiff_t PW)                       \
{                                                                                             \
    ptrdiff_t oh, ow, i, j, c, ih, iw;                                                        \
    for (oh = 0; oh < OH; oh++) {                                                             \
        for (i = 0; i < PH; i++) {                                                            \
            ih = oh * PH + i;                                                                 \
            for (ow = 0; ow < OW; ow++) {                                                     \
                const T *restrict g = dy + (oh * OW + ow) * C;                                \
                const int *restrict a = arg + (oh * OW + ow) * C;                             \
                for (j = 0; j < PW; j++) {                                                    \
                    int base = (int)((ih * W + ow * PW + j) * C);                             \
                    T *restrict d = dx + base;                                                \
                    for (c = 0; c < C; c++) d[c] = a[c] == base + (int)c ? g[c] : (T)0;       \
                }                                                                             \
            }                                                                                 \
            for (iw = OW * PW; iw < W; iw++)                                                  \
                memset(dx + (ih * W + iw) * C, 0, (size_t)C * sizeof(T));                     \
        }                                                                                     \
    }                                                                                         \
    for (ih = OH * PH; ih < H; ih++) memset(dx + ih * W * C, 0, (size_t)(W * C) * sizeof(T)); \
}                                                                                             \
                                                                                              \
/* im2col of column rows r0 <= r < r1 (r = (n, oh, ow)) into dst (row r0 first, K =       \
 * KH*KW*C values per row in (kh, kw, c) order, zeros in the padding).  The KW taps of one \
 * kernel row are one contiguous span of KW*C input values when they are all inside the   \
 * image and the dilation is 1. */                                                         \
SN_CLONES SN_UNUSED SN_NO_MEMCPY static void sn_im2col_rows_##S(                                    \
    const T *restrict X, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,   \
    ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,       \
    ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0, ptrdiff_t r1, T *restrict dst)                  \
{                                                                                             \
    ptrdiff_t KWC = KW * C, ohw = OH * OW, r, kh, kw, j;                                      \
    ptrdiff_t n = r0 / ohw, oh = (r0 % ohw) / OW, ow = r0 % OW;                               \
    for (r = r0; r < r1; r++) {                                                               \
        const T *restrict xn = X + n * H * W * C;                                             \
        ptrdiff_t iw0 = ow * sw - pw;                                                         \
        int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;                                    \
        for (kh = 0; kh < KH; kh++) {                                                         \
            ptrdiff_t ih = oh * sh - ph + kh * dh;                                            \
            if (ih < 0 || ih >= H) {                                                          \
                for (j = 0; j < KWC; j++) dst[j] = 0;                                         \
            } else if (inside) {                                                              \
                const T *restrict src = xn + (ih * W + iw0) * C;                              \
                for (j = 0; j < KWC; j++) dst[j] = src[j];                                    \
            } else {                                                                          \
                for (kw = 0; kw < KW; kw++) {                                                 \
                    ptrdiff_t iw = iw0 + kw * dw;                                             \
                    T *restrict d = dst + kw * C;                                             \
                    if (iw < 0 || iw >= W) {                                                  \
                        for (j = 0; j < C; j++) d[j] = 0;                                     \
                    } else {                                                                  \
                        const T *restrict src = xn + (ih * W + iw) * C;                       \
                        for (j = 0; j < C; j++) d[j] = src[j];                                \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            dst += KWC;                                                                       \
        }                                                                                     \
        if (++ow == OW) { ow = 0; if (++oh == OH) { oh = 0; n++; } }                          \
    }                                                                                         \
}                                                                                             \
                                                                                              \
/* col2im: add column rows r0 <= r < r1 (src, row r0 first) into dX. */                       \
SN_CLONES SN_UNUSED static void sn_col2im_rows_##S(                                           \
    T *restrict dX, ptrdiff_t H, ptrdiff_t W, ptrdiff_t C, ptrdiff_t OH, ptrdiff_t OW,        \
    ptrdiff_t KH, ptrdiff_t KW, ptrdiff_t sh, ptrdiff_t sw, ptrdiff_t ph, ptrdiff_t pw,       \
    ptrdiff_t dh, ptrdiff_t dw, ptrdiff_t r0, ptrdiff_t r1, const T *restrict src)            \
{                                                                                             \
    ptrdiff_t KWC = KW * C, ohw = OH * OW, r, kh, kw, j;                                      \
    ptrdiff_t n = r0 / ohw, oh = (r0 % ohw) / OW, ow = r0 % OW;                               \
    for (r = r0; r < r1; r++) {                                                               \
        T *restrict xn = dX + n * H * W * C;                                                  \
        ptrdiff_t iw0 = ow * sw - pw;                                                         \
        int inside = dw == 1 && iw0 >= 0 && iw0 + KW <= W;                                    \
        for (kh = 0; kh < KH; kh++) {                                                         \
            ptrdiff_t ih = oh * sh - ph + kh * dh;                                            \
            if (ih >= 0 && ih < H) {                                                          \
                if (inside) {                                                                 \
                    T *restrict d = xn + (ih * W + iw0) * C;                                  \
                    for (j = 0; j < KWC; j++) d[j] += src[j];                                 \
                } else {                                                                      \
                    for (kw = 0; kw < KW; kw++) {                                             \
                        ptrdiff_t iw = iw0 + kw * dw;                                         \
                        if (iw >= 0 && iw < W) {                                              \
                            T *restrict d = xn + (ih * W + iw) * C;                           \
                            const T *restrict s = src + kw * C;                               \
                            for (j = 0; j < C; j++) d[j] += s[j];                             \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            src += KWC;                                                                       \
        }                                                                                     \
        if (++ow == OW) { ow = 0; if (++oh == OH) { oh = 0; n++; } }                          \
    }                                                                                         \
}

SN_CONV_DEFINE(float, f)
SN_CONV_DEFINE(double, d)

#endif

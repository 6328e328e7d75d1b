/* Fused optimizer updates over flat buffers (float and double).
 *
 * Each variant is its own loop with `restrict` pointers and no branches inside, so
 * the compiler vectorises it.  Formulas: torch.optim.RMSprop and torch.optim.SGD.
 */
#ifndef SPARKNET_OPTIM_KERNELS_H
#define SPARKNET_OPTIM_KERNELS_H

#include <math.h>
#include <stddef.h>

#define SPARKNET_RMSPROP(NAME, T, SQRT)                                                   \
static void NAME(T *restrict p, const T *restrict g, T *restrict v, T *restrict ga,       \
                 T *restrict buf, ptrdiff_t n, T lr, T alpha, T eps, T wd, T mu)         \
{                                                                                         \
    const T oma = (T)1 - alpha;                                                           \
    ptrdiff_t i;                                                                          \
    if (ga == NULL && buf == NULL && wd == 0) {          /* the common case */            \
        for (i = 0; i < n; i++) {                                                         \
            T gi = g[i];                                                                  \
            T vi = alpha * v[i] + oma * gi * gi;                                          \
            v[i] = vi;                                                                    \
            p[i] -= lr * gi / (SQRT(vi) + eps);                                           \
        }                                                                                 \
        return;                                                                           \
    }                                                                                     \
    for (i = 0; i < n; i++) {                                                             \
        T gi = g[i] + wd * p[i];                                                          \
        T vi = alpha * v[i] + oma * gi * gi;                                              \
        T den;                                                                            \
        v[i] = vi;                                                                        \
        if (ga != NULL) {                                                                 \
            T a = alpha * ga[i] + oma * gi;                                               \
            ga[i] = a;                                                                    \
            den = SQRT(vi - a * a) + eps;                                                 \
        } else {                                                                          \
            den = SQRT(vi) + eps;                                                         \
        }                                                                                 \
        if (buf != NULL) {                                                                \
            T b = mu * buf[i] + gi / den;                                                 \
            buf[i] = b;                                                                   \
            p[i] -= lr * b;                                                               \
        } else {                                                                          \
            p[i] -= lr * gi / den;                                                        \
        }                                                                                 \
    }                                                                                     \
}

SPARKNET_RMSPROP(sparknet_rmsprop_f, float, sqrtf)
SPARKNET_RMSPROP(sparknet_rmsprop_d, double, sqrt)

#define SPARKNET_SGD(NAME, T)                                                             \
static void NAME(T *restrict p, const T *restrict g, T *restrict buf, ptrdiff_t n,        \
                 T lr, T mu, T damp, T wd, int nesterov, int first)                       \
{                                                                                         \
    ptrdiff_t i;                                                                          \
    if (buf == NULL) {                                                                    \
        for (i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);                          \
        return;                                                                           \
    }                                                                                     \
    for (i = 0; i < n; i++) {                                                             \
        T gi = g[i] + wd * p[i];                                                          \
        T b = first ? gi : mu * buf[i] + ((T)1 - damp) * gi;                              \
        buf[i] = b;                                                                       \
        p[i] -= lr * (nesterov ? gi + mu * b : b);                                        \
    }                                                                                     \
}

SPARKNET_SGD(sparknet_sgd_f, float)
SPARKNET_SGD(sparknet_sgd_d, double)

#endif

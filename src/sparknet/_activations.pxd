# cython: language_level=3
"""Elementwise activations, nogil, on row-major (rows, cols) buffers."""
from cython cimport floating

cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include <string.h>
    /* c ? a : b on the bits, so that GCC vectorises the loops around it: a plain ?: over
       computed values is compiled to a branch under -ftrapping-math (the default). */
    static inline float sn_self(int c, float a, float b) {
        uint32_t ua, ub, m = -(uint32_t)(c != 0), r;
        float f;
        memcpy(&ua, &a, sizeof ua);
        memcpy(&ub, &b, sizeof ub);
        r = (ua & m) | (ub & ~m);
        memcpy(&f, &r, sizeof f);
        return f;
    }
    static inline double sn_seld(int c, double a, double b) {
        uint64_t ua, ub, m = -(uint64_t)(c != 0), r;
        double f;
        memcpy(&ua, &a, sizeof ua);
        memcpy(&ub, &b, sizeof ub);
        r = (ua & m) | (ub & ~m);
        memcpy(&f, &r, sizeof f);
        return f;
    }
    /* float32 e^x, branch free so that loops over it vectorise (Cephes' expf):
       e^x = 2^n e^r, n = round(x log2 e) (by the 1.5 * 2^23 rounding trick), r = x - n ln 2
       in two parts, e^r by a degree-7 polynomial; relative error below 2e-7.  0 below
       -87.34 (and for -inf), clamped above at 88.38. */
    static inline float sn_expf(float x) {
        float z = sn_self(x < -87.33654f, -87.33654f, x);
        z = sn_self(z > 88.37626f, 88.37626f, z);
        float n = (z * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
        float r = z - n * 0.693359375f;
        r = r - n * -2.12194440e-4f;
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        p = p * r * r + r + 1.0f;
        int bits = ((int)n + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        return sn_self(x < -87.33654f, 0.0f, p * scale);
    }
    /* float32 Phi(z), the standard normal CDF, branch free: 0.5 erfc(-z / sqrt 2), erfc by
       Numerical Recipes' erfcc (fractional error below 1.2e-7 everywhere, so Phi keeps its
       relative accuracy in the lower tail). */
    static inline float sn_phif(float z) {
        float a = fabsf(z) * 0.70710678118654752f;
        float t = 1.0f / (1.0f + 0.5f * a);
        float p = 0.17087277f;
        p = p * t - 0.82215223f;
        p = p * t + 1.48851587f;
        p = p * t - 1.13520398f;
        p = p * t + 0.27886807f;
        p = p * t - 0.18628806f;
        p = p * t + 0.09678418f;
        p = p * t + 0.37409196f;
        p = p * t + 1.00002368f;
        p = p * t - 1.26551223f;
        float h = 0.5f * t * sn_expf(p - a * a);     /* erfc(|z| / sqrt 2) / 2 */
        return sn_self(z < 0, h, 1.0f - h);
    }

    /* float32 gelu rows (in place) and their derivatives through the input z (dy <- dy f'(z)),
       compiled for AVX-512 / AVX2 / baseline, chosen at run time.  The tanh form runs as
       0.5 (1 + tanh u) = s = sigmoid(2 u): gelu = z s, gelu' = s + 2 z s (1 - s) u'. */
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
        && (__GNUC__ >= 11)
    #define SN_ACT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", \
                                                       "default"), unused))
    #elif defined(__GNUC__)
    #define SN_ACT_CLONES __attribute__((unused))
    #else
    #define SN_ACT_CLONES
    #endif
    #define SN_SQRT_2_PI_F 0.79788456080286535588f
    #define SN_GELU_C_F 0.044715f
    SN_ACT_CLONES static void sn_gelu_f(float* z, long n) {
        for (long j = 0; j < n; j++) z[j] = z[j] * sn_phif(z[j]);          /* z Phi(z) */
    }
    SN_ACT_CLONES static void sn_gelu_back_f(const float* restrict z, float* restrict dy,
                                             long n) {
        for (long j = 0; j < n; j++) {                          /* Phi(z) + z phi(z) */
            float x = z[j];
            dy[j] *= sn_phif(x) + x * 0.39894228040143267794f * sn_expf(-0.5f * x * x);
        }
    }
    SN_ACT_CLONES static void sn_gelu_tanh_f(float* z, long n) {
        for (long j = 0; j < n; j++) {
            float x = z[j];
            z[j] = x / (1.0f + sn_expf(-2.0f * SN_SQRT_2_PI_F * (x + SN_GELU_C_F * x * x * x)));
        }
    }
    SN_ACT_CLONES static void sn_gelu_tanh_back_f(const float* restrict z, float* restrict dy,
                                                  long n) {
        for (long j = 0; j < n; j++) {
            float x = z[j];
            float s = 1.0f / (1.0f + sn_expf(-2.0f * SN_SQRT_2_PI_F
                                             * (x + SN_GELU_C_F * x * x * x)));
            dy[j] *= s + 2.0f * x * s * (1.0f - s) * SN_SQRT_2_PI_F
                     * (1.0f + 3.0f * SN_GELU_C_F * x * x);
        }
    }
    /* float32 silu (swish) rows: silu(z) = z sigmoid(z) in place, and through the input z,
       dy <- dy s (1 + z (1 - s)), s = sigmoid(z) */
    SN_ACT_CLONES static void sn_silu_f(float* z, long n) {
        for (long j = 0; j < n; j++) z[j] = z[j] / (1.0f + sn_expf(-z[j]));
    }
    SN_ACT_CLONES static void sn_silu_back_f(const float* restrict z, float* restrict dy,
                                             long n) {
        for (long j = 0; j < n; j++) {
            float x = z[j];
            float s = 1.0f / (1.0f + sn_expf(-x));
            dy[j] *= s * (1.0f + x * (1.0f - s));
        }
    }
    """
    # c ? a : b; float32 e^x and the normal CDF, vectorisable (the C above gives their accuracy)
    float sn_self(int c, float a, float b) noexcept nogil
    double sn_seld(int c, double a, double b) noexcept nogil
    float sn_expf(float x) noexcept nogil
    float sn_phif(float z) noexcept nogil
    # float32 gelu rows: forward in place, backward dy <- dy * gelu'(z)
    void sn_gelu_f(float* z, long n) noexcept nogil
    void sn_gelu_back_f(const float* z, float* dy, long n) noexcept nogil
    void sn_gelu_tanh_f(float* z, long n) noexcept nogil
    void sn_gelu_tanh_back_f(const float* z, float* dy, long n) noexcept nogil
    # float32 silu rows: forward in place, backward dy <- dy * silu'(z)
    void sn_silu_f(float* z, long n) noexcept nogil
    void sn_silu_back_f(const float* z, float* dy, long n) noexcept nogil

cdef enum:
    ACT_IDENTITY = 0
    ACT_RELU = 1
    ACT_TANH = 2
    ACT_SIGMOID = 3
    ACT_SOFTMAX = 4
    ACT_GELU = 5
    ACT_GELU_TANH = 6
    ACT_SILU = 7

# True for the activations whose derivative is written through their input z, not their
# output (the gelus, silu): a layer keeps z for them and calls act_backward_input_row.
cdef inline bint act_needs_input(int act) noexcept nogil:
    return act == ACT_GELU or act == ACT_GELU_TANH or act == ACT_SILU

# In place: z <- f(z) over a row of n values (softmax normalises the row).
cdef void act_forward_row(int act, floating* z, Py_ssize_t n) noexcept nogil
# In place: dy <- dy * f'(.) expressed through the output y of the same row
# (leaves dy unchanged for the activations where act_needs_input).
cdef void act_backward_row(int act, const floating* y, floating* dy, Py_ssize_t n) noexcept nogil
# In place: dy <- dy * f'(z) through the input z of the same row (the act_needs_input ones).
cdef void act_backward_input_row(int act, const floating* z, floating* dy,
                                 Py_ssize_t n) noexcept nogil

# cython: language_level=3
"""What the recurrent kernels share (``_rnn.pyx``, ``_lstm.pyx``): the products on the float32
AVX-512 panel kernel or the BLAS, the batch-/time-major transposes, and the steps before the
first time step and after the last.  All pointers are to C-contiguous (row-major) data;
``floating`` is Cython's fused type (float32 and float64)."""

from cython cimport floating

# Where a product runs (the ``own`` argument below): the BLAS gemm, the float32 AVX-512 panel
# kernel, or the bfloat16 kernel of ``_bf16`` (float32 accumulation; ``precision="bf16"``).
# A bfloat16 product that cannot get its packing buffers runs on the BLAS instead.
cdef enum:
    ON_BLAS = 0
    ON_PANELS = 1
    ON_BF16 = 2

# True when float32 products use the built-in AVX-512 panel kernel (CPU has it, not turned off)
cdef bint own_kernel() noexcept nogil

# True when the built-in kernel runs the LSTM's input projection and weight/input gradients step
# by step inside the time loops (use_fused_steps)
cdef bint fused_steps() noexcept nogil

# raise ValueError(what) unless ok
cdef int check(bint ok, str what) except -1

# panels of 32 columns of B (K, Nc) = src (row stride ld), or src^T when transposed; NULL if out
# of memory (the caller frees it)
cdef float* pack_panels(const floating* src, Py_ssize_t ld, Py_ssize_t K, Py_ssize_t Nc,
                        bint transposed) noexcept nogil

# out (rows, G) = xt (rows, F) @ W_ih^T
cdef void project_inputs(int own, const floating* xt, const floating* w_ih, floating* out,
                         Py_ssize_t rows, Py_ssize_t F, Py_ssize_t G) noexcept nogil

# c (rows, Nc) (+)= a (rows, K) @ B, B = b^T when b_transposed else b; bp is B in panels
# (float32 panels ON_PANELS, bfloat16 pair panels ON_BF16)
cdef void times_packed(int own, const floating* a, Py_ssize_t rows, Py_ssize_t K,
                       const float* bp, const floating* b, bint b_transposed, Py_ssize_t Nc,
                       floating* c, bint accumulate) noexcept nogil

# C (M, N) (+)= op(A) @ op(B) as _blas.gemm; in bfloat16 when bf16 (b16: op(B) packed, or NULL to
# pack it for this product), else (or when the bfloat16 product cannot get its buffers) on the BLAS
cdef void product(bint trans_a, bint trans_b, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                  const floating* A, Py_ssize_t lda, const floating* B, Py_ssize_t ldb,
                  const void* b16, bint bf16, bint accumulate, floating* C,
                  Py_ssize_t ldc) noexcept nogil

# dw (G, K) = dg^T (G, rows) @ src (rows, K)
cdef void weight_grad(int own, const floating* dg, const floating* src, floating* dw,
                      Py_ssize_t rows, Py_ssize_t G, Py_ssize_t K) noexcept nogil

# out (rows, G) = x (rows, F) @ W_ih^T + h (rows, H) @ W_hh^T (h may be NULL) on the panel kernel
cdef void step_product(const floating* x, Py_ssize_t F, const float* wiT, const floating* h,
                       Py_ssize_t H, const float* whT, Py_ssize_t rows, Py_ssize_t G,
                       floating* out) noexcept nogil

# room for one step's states (N, H) and inputs (N, F) in panels (NULL if out of memory)
cdef float* step_grad_scratch(Py_ssize_t N, Py_ssize_t F, Py_ssize_t H) noexcept nogil

# float32 panel kernel only: dW_hh (G, H) (+)= dg^T @ h (N, H), dW_ih (G, F) (+)= dg^T @ x (N, F);
# h_zero: h is all zeros (the first step from a zero state): dW_hh's share is zero, not computed
cdef void step_weight_grads(const floating* dg, const floating* h, const floating* x,
                            floating* dw_hh, floating* dw_ih, float* scratch, Py_ssize_t N,
                            Py_ssize_t F, Py_ssize_t G, Py_ssize_t H, bint accumulate,
                            bint h_zero=*) noexcept nogil

# whether the n floats at p are all zero (an initial state nobody set)
cdef bint all_zero(const floating* p, Py_ssize_t n) noexcept nogil

# xt[t, n, :] = x[n, t, :]   and   x[n, t, :] = xt[t, n, :]
cdef void to_time_major(const floating* x, floating* xt, Py_ssize_t N, Py_ssize_t T,
                        Py_ssize_t F) noexcept nogil
cdef void to_batch_major(const floating* xt, floating* x, Py_ssize_t N, Py_ssize_t T,
                         Py_ssize_t F) noexcept nogil

# s[:size] = s0[:size], or zeros when s0 is NULL
cdef void init_state(floating* s, const floating* s0, Py_ssize_t size) noexcept nogil

# the shape checks every forward kernel makes (messages start with ``kernel``)
cdef int check_forward_buffers(str kernel, const floating[:, :, ::1] x, floating[:, :, ::1] xt,
                               floating[:, :, ::1] pre, str pre_name, floating[:, :, ::1] hs,
                               const floating[:, ::1] h0, const unsigned char[:, ::1] mask,
                               floating[:, :, ::1] y, Py_ssize_t G, Py_ssize_t H) except -1

# malloc the summed bias b (G,) and, unless ON_BLAS, W_hh^T (H, G) in panels (and W_ih^T (F, G)
# when wiT is given; ON_PANELS only); MemoryError if out of memory
cdef int forward_buffers(int own, const floating* w_hh, Py_ssize_t H, Py_ssize_t G,
                         floating** b, float** whT, const floating* w_ih=*, Py_ssize_t F=*,
                         float** wiT=*) except -1

# before the first step: b = b_ih + b_hh; hs[0] = h0 (zeros when NULL); xt = x time-major and
# pre (T*N, G) = xt @ W_ih^T (unless not project: a per-step projection)
cdef void forward_prologue(int own, const floating* x, const floating* w_ih, const floating* b_ih,
                           const floating* b_hh, const floating* h0, floating* b, floating* xt,
                           floating* pre, floating* hs, Py_ssize_t N, Py_ssize_t T, Py_ssize_t F,
                           Py_ssize_t G, Py_ssize_t H, bint project=*) noexcept nogil

# a backward over no step (T == 0 or N == 0): the weight gradients and db_hh zero
cdef void zero_grads(floating* dw_ih, floating* dw_hh, floating* db_hh, Py_ssize_t F,
                     Py_ssize_t G, Py_ssize_t H) noexcept nogil

# after the last step: dW_hh = dg^T @ hs[0:T], dW_ih = dg^T @ xt, dx = (dg @ W_ih) batch-major
# (when dx is not NULL), db_hh = db_ih; with steps_done only dx = dxt batch-major and db_hh
cdef void backward_products(int own, const floating* dg, const floating* hs, const floating* xt,
                            const floating* w_ih, floating* dw_ih, floating* dw_hh,
                            const floating* db_ih, floating* db_hh, floating* dxt, floating* dx,
                            Py_ssize_t N, Py_ssize_t T, Py_ssize_t F, Py_ssize_t G,
                            Py_ssize_t H, bint steps_done=*) noexcept nogil

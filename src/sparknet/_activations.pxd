# cython: language_level=3
"""Elementwise activations, nogil, on row-major (rows, cols) buffers."""
from cython cimport floating

cdef enum:
    ACT_IDENTITY = 0
    ACT_RELU = 1
    ACT_TANH = 2
    ACT_SIGMOID = 3
    ACT_SOFTMAX = 4

# In place: z <- f(z) over a row of n values (softmax normalises the row).
cdef void act_forward_row(int act, floating* z, Py_ssize_t n) noexcept nogil
# In place: dy <- dy * f'(.) expressed through the output y of the same row.
cdef void act_backward_row(int act, const floating* y, floating* dy, Py_ssize_t n) noexcept nogil

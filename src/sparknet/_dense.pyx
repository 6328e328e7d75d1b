# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Fully connected layer kernels: ``Y = f(X W^T + b)`` and its backward pass.

Shapes (row-major): X (N, I), W (O, I) as in ``torch.nn.Linear``, b (O,), Y (N, O).
Bias and activation are fused into one pass over Y after the GEMM; the
backward fuses the activation derivative with the bias-gradient column sum.
"""
from cython cimport floating
from sparknet._blas cimport gemm
from sparknet._activations cimport act_forward_row, act_backward_row, ACT_IDENTITY, ACT_SOFTMAX


def forward(const floating[:, ::1] X, const floating[:, ::1] W, const floating[::1] b,
            floating[:, ::1] Y, int act=ACT_IDENTITY):
    """``Y[...] = act(X @ W.T + b)``; ``b`` may be None."""
    cdef Py_ssize_t N = X.shape[0], I = X.shape[1], O = W.shape[0]
    cdef Py_ssize_t i, j
    cdef bint has_b = b is not None
    cdef floating* y
    if W.shape[1] != I or Y.shape[0] != N or Y.shape[1] != O or (has_b and b.shape[0] != O):
        raise ValueError("dense forward: shape mismatch")
    if N == 0 or O == 0:
        return
    with nogil:
        if I == 0:
            for i in range(N):
                for j in range(O):
                    Y[i, j] = 0
        else:
            gemm(False, True, <int>N, <int>O, <int>I, <floating>1, &X[0, 0], <int>I,
                 &W[0, 0], <int>I, <floating>0, &Y[0, 0], <int>O)
        for i in range(N):
            y = &Y[i, 0]
            if has_b:
                for j in range(O):
                    y[j] = y[j] + b[j]
            if act != ACT_IDENTITY:
                act_forward_row(act, y, O)


def backward(const floating[:, ::1] X, const floating[:, ::1] W, const floating[:, ::1] Y,
             floating[:, ::1] dY, floating[:, ::1] dX, floating[:, ::1] dW, floating[::1] db,
             int act=ACT_IDENTITY):
    """Backward pass of :func:`forward`.

    ``dY`` is overwritten with the pre-activation gradient dZ = dY * act'(.).
    Then ``dW = dZ.T @ X``, ``db = dZ.sum(0)`` (if ``db`` is not None) and
    ``dX = dZ @ W`` (if ``dX`` is not None); gradients are overwritten.
    """
    cdef Py_ssize_t N = X.shape[0], I = X.shape[1], O = W.shape[0]
    cdef Py_ssize_t i, j
    cdef bint has_db = db is not None
    cdef bint has_dx = dX is not None
    cdef floating* d
    if (dY.shape[0] != N or dY.shape[1] != O or dW.shape[0] != O or dW.shape[1] != I
            or (has_db and db.shape[0] != O) or (has_dx and (dX.shape[0] != N or dX.shape[1] != I))):
        raise ValueError("dense backward: shape mismatch")
    with nogil:
        if has_db:
            for j in range(O):
                db[j] = 0
        for i in range(N):
            d = &dY[i, 0]
            if act != ACT_IDENTITY:
                act_backward_row(act, &Y[i, 0], d, O)
            if has_db:
                for j in range(O):
                    db[j] = db[j] + d[j]
        if N == 0:
            for i in range(O):
                for j in range(I):
                    dW[i, j] = 0
        elif O > 0 and I > 0:
            # dW (O, I) = dZ^T (O, N) @ X (N, I)
            gemm(True, False, <int>O, <int>I, <int>N, <floating>1, &dY[0, 0], <int>O,
                 &X[0, 0], <int>I, <floating>0, &dW[0, 0], <int>I)
        if has_dx and N > 0 and I > 0:
            if O == 0:
                for i in range(N):
                    for j in range(I):
                        dX[i, j] = 0
            else:
                # dX (N, I) = dZ (N, O) @ W (O, I)
                gemm(False, False, <int>N, <int>I, <int>O, <floating>1, &dY[0, 0], <int>O,
                     &W[0, 0], <int>I, <floating>0, &dX[0, 0], <int>I)

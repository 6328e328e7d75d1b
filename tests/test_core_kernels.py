"""The Cython kernels against numpy references: BLAS, dense, activations, losses; float32 vs float64."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparknet import _activations, _blas, _dense, _losses
from sparknet.activations import IDS, apply, grad, softmax

ACTS = ["identity", "relu", "tanh", "sigmoid", "softmax"]


def np_act(name, z):
    if name == "identity":
        return z.copy()
    if name == "relu":
        return np.maximum(z, 0)
    if name == "tanh":
        return np.tanh(z)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-z))
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-12)])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_gemm_matches_numpy(dtype, tol, ta, tb):
    rng = np.random.default_rng(0)
    M, N, K = 7, 5, 11
    A = rng.standard_normal((K, M) if ta else (M, K)).astype(dtype)
    B = rng.standard_normal((N, K) if tb else (K, N)).astype(dtype)
    C = rng.standard_normal((M, N)).astype(dtype)
    want = 1.5 * (A.T if ta else A) @ (B.T if tb else B) + 0.5 * C
    _blas.py_gemm(ta, tb, dtype(1.5), A, B, dtype(0.5), C)
    np.testing.assert_allclose(C, want, rtol=tol, atol=tol)


def test_gemm_rejects_mismatched_shapes():
    A = np.zeros((3, 4))
    B = np.zeros((5, 2))
    C = np.zeros((3, 2))
    with pytest.raises(ValueError, match="gemm shape mismatch"):
        _blas.py_gemm(False, False, 1.0, A, B, 0.0, C)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), i=st.integers(1, 13), o=st.integers(1, 11),
       act=st.sampled_from(ACTS), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_dense_kernel_matches_numpy(n, i, o, act, bias, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, i))
    W = rng.standard_normal((o, i))
    b = rng.standard_normal(o) if bias else None
    Y = np.empty((n, o))
    _dense.forward(X, W, b, Y, IDS[act])
    Z = X @ W.T + (b if bias else 0)
    np.testing.assert_allclose(Y, np_act(act, Z), rtol=1e-12, atol=1e-12)
    dY = rng.standard_normal((n, o))
    # reference pre-activation gradient through numpy
    if act == "identity":
        dZ = dY
    elif act == "relu":
        dZ = dY * (Z > 0)
    elif act == "tanh":
        dZ = dY * (1 - np.tanh(Z) ** 2)
    elif act == "sigmoid":
        s = np_act("sigmoid", Z)
        dZ = dY * s * (1 - s)
    else:
        s = np_act("softmax", Z)
        dZ = s * (dY - (dY * s).sum(axis=1, keepdims=True))
    dX, dW = np.empty_like(X), np.empty_like(W)
    db = np.empty(o) if bias else None
    _dense.backward(X, W, Y, dY.copy(), dX, dW, db, IDS[act])
    np.testing.assert_allclose(dW, dZ.T @ X, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dX, dZ @ W, rtol=1e-10, atol=1e-12)
    if bias:
        np.testing.assert_allclose(db, dZ.sum(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("act", ACTS)
def test_activation_forward_backward_against_numpy(act):
    rng = np.random.default_rng(1)
    z = rng.standard_normal((6, 9)) * 3
    y = apply(act, z)
    np.testing.assert_allclose(y, np_act(act, z), rtol=1e-12, atol=1e-14)
    # backward against central differences of sum(r * f(z))
    r = rng.standard_normal(z.shape)
    g = grad(act, y, r)
    num = np.zeros_like(z)
    eps = 1e-6
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += eps
        zm[idx] -= eps
        num[idx] = ((np_act(act, zp) - np_act(act, zm)) * r).sum() / (2 * eps)
    err = np.linalg.norm(g - num) / (np.linalg.norm(g) + np.linalg.norm(num) + 1e-300)
    assert err <= 1e-6, (act, err)


def test_softmax_is_stable_for_huge_logits():
    z = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]])
    p = softmax(z)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], atol=1e-12)


def test_sigmoid_saturates_without_overflow():
    z = np.array([[-1000.0, 0.0, 1000.0]], dtype=np.float32)
    y = apply("sigmoid", z)
    np.testing.assert_allclose(y, [[0.0, 0.5, 1.0]])


def np_xent(z, t, w):
    m = z.max(1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(1, keepdims=True)))[:, 0]
    return (w * (lse - z[np.arange(len(t)), t])).sum()


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_value_and_gradient(weighted):
    rng = np.random.default_rng(2)
    N, C = 7, 5
    z = rng.standard_normal((N, C)) * 4
    t = rng.integers(0, C, N).astype(np.int64)
    w = rng.random(N) if weighted else np.ones(N)
    g = np.empty_like(z)
    s = _losses.softmax_cross_entropy(z, t, w if weighted else None, g, 0.5)
    assert s == pytest.approx(np_xent(z, t, w), rel=1e-12)
    num = np.zeros_like(z)
    eps = 1e-6
    for idx in np.ndindex(N, C):
        zp, zm = z.copy(), z.copy()
        zp[idx] += eps
        zm[idx] -= eps
        num[idx] = 0.5 * (np_xent(zp, t, w) - np_xent(zm, t, w)) / (2 * eps)
    assert np.linalg.norm(g - num) / (np.linalg.norm(g) + np.linalg.norm(num)) <= 1e-6


def test_cross_entropy_is_stable_from_logits():
    z = np.array([[1e4, 0.0, -1e4]])
    t = np.array([2], dtype=np.int64)
    g = np.empty_like(z)
    s = _losses.softmax_cross_entropy(z, t, None, g, 1.0)
    assert s == pytest.approx(2e4)
    np.testing.assert_allclose(g, [[1.0, 0.0, -1.0]], atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_mse_value_and_gradient(weighted):
    rng = np.random.default_rng(3)
    N, D = 6, 4
    o = rng.standard_normal((N, D))
    t = rng.standard_normal((N, D))
    w = rng.random(N) if weighted else np.ones(N)

    def f(o_):
        return (w * ((o_ - t) ** 2).mean(1)).sum()

    g = np.empty_like(o)
    s = _losses.mean_squared_error(o, t, w if weighted else None, g, 2.0)
    assert s == pytest.approx(f(o), rel=1e-12)
    num = np.zeros_like(o)
    eps = 1e-6
    for idx in np.ndindex(N, D):
        op, om = o.copy(), o.copy()
        op[idx] += eps
        om[idx] -= eps
        num[idx] = 2.0 * (f(op) - f(om)) / (2 * eps)
    assert np.linalg.norm(g - num) / (np.linalg.norm(g) + np.linalg.norm(num)) <= 1e-6


@pytest.mark.parametrize("n,i,o", [
    (7, 37, 45),      # tails everywhere: rows past 12-row tiles, columns past 32, 16 x 16 blocks
    (128, 784, 512),  # the MLP's first layer
    (13, 16, 1),      # one output
    (1, 5, 33),
    (3, 1500, 1500),  # past the built-in product's 2^21 floats: the BLAS either way
])
@pytest.mark.parametrize("backend", ["avx512", "blas"])
def test_float32_dense_products_match_float64(n, i, o, backend):
    """float32 dense layers run their three products on the AVX-512 kernel of
    csrc/sgemm_avx512.h when the CPU has it (the forward on a transposed copy of W), on the
    BLAS otherwise: both must equal the float64 products to float32 rounding."""
    if backend == "avx512" and _dense.set_gemm_backend("auto") != "avx512":
        pytest.skip("this CPU has no AVX-512: float32 dense layers use BLAS only")
    rng = np.random.default_rng(n * 1000 + i + o)
    X = rng.standard_normal((n, i))
    W = rng.standard_normal((o, i))
    b = rng.standard_normal(o)
    dY = rng.standard_normal((n, o))
    X32, W32, b32 = X.astype(np.float32), W.astype(np.float32), b.astype(np.float32)
    try:
        _dense.set_gemm_backend("auto" if backend == "avx512" else "blas")
        assert _dense.gemm_backend() == backend
        Y = np.empty((n, o), np.float32)
        _dense.forward(X32, W32, b32, Y, IDS["identity"])
        dX, dW, db = np.empty_like(X32), np.empty_like(W32), np.empty(o, np.float32)
        _dense.backward(X32, W32, Y, dY.astype(np.float32), dX, dW, db, IDS["identity"])
    finally:
        _dense.set_gemm_backend("auto")
    X, W = X32.astype(np.float64), W32.astype(np.float64)
    dY = dY.astype(np.float32).astype(np.float64)
    for got, want in ((Y, X @ W.T + b32), (dW, dY.T @ X), (dX, dY @ W), (db, dY.sum(0))):
        scale = np.abs(want).max() * np.sqrt(max(i, o, n))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale)


def test_conv_backend_switch_also_switches_dense_layers():
    from sparknet import _conv
    try:
        assert _conv.set_gemm_backend("blas") == "blas"
        assert _dense.gemm_backend() == "blas"
        assert _conv.set_gemm_backend("auto") == _dense.gemm_backend()
    finally:
        _conv.set_gemm_backend("auto")
    with pytest.raises(ValueError, match="gemm backend must be 'auto' or 'blas', got 'mkl'"):
        _dense.set_gemm_backend("mkl")


@pytest.mark.parametrize("act", ACTS)
def test_float32_kernels_agree_with_float64(act):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((32, 40))
    W = rng.standard_normal((24, 40)) * 0.2
    b = rng.standard_normal(24) * 0.1
    out = {}
    for dt in (np.float32, np.float64):
        Xd, Wd, bd = X.astype(dt), W.astype(dt), b.astype(dt)
        Y = np.empty((32, 24), dt)
        _dense.forward(Xd, Wd, bd, Y, IDS[act])
        dY = np.ones((32, 24), dt) * dt(0.1)
        dX, dW, db = np.empty_like(Xd), np.empty_like(Wd), np.empty(24, dt)
        _dense.backward(Xd, Wd, Y, dY, dX, dW, db, IDS[act])
        g = np.empty_like(Y)
        t = (np.arange(32) % 24).astype(np.int64)
        loss = _losses.softmax_cross_entropy(Y, t, None, g, 1 / 32)
        out[dt] = (Y, dX, dW, db, g, loss)
    for a32, a64 in zip(out[np.float32][:5], out[np.float64][:5]):
        assert a32.dtype == np.float32 and a64.dtype == np.float64
        np.testing.assert_allclose(a32, a64, rtol=2e-4, atol=2e-5)
    assert out[np.float32][5] == pytest.approx(out[np.float64][5], rel=1e-5)


def test_activation_kernel_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="activation backward"):
        _activations.backward(1, np.zeros((2, 3)), np.zeros((3, 2)))

"""bfloat16 products (``sparknet._bf16``) and mixed-precision training (``precision="bf16"``).

Bounds tested, with u32 = 2**-24 (float32) and u16 = 2**-8 (bfloat16), both unit roundoffs:

* the GEMM on bfloat16 operands equals the float64 product of the rounded operands up to
  float32 summation: ``|C - ref| <= (K + 2) * u32 * (|A| @ |B|)`` entrywise (the products of
  two bfloat16 values are exact in float32; only the K additions round);
* a layer's bfloat16 product against its float32 product on the unrounded operands:
  ``|C16 - C32| <= ((2 u16 + u16**2) + (K + 2) u32) * (|A| @ |B|)`` entrywise (each operand
  rounded once, relative error <= u16);
* whole recurrent layers (errors carried through 8 time steps): max-norm relative difference
  of outputs and gradients <= 3%;
* a CNN with relu and max pooling, where a rounding may move a pre-activation across 0 or change
  a pool's winner (a different branch, not a larger error): ``||g16 - g32|| <= 4% ||g32||``.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import sparknet._bf16 as _bf16
import sparknet._conv as _conv
import sparknet._dense as _dense
from helpers.models import mlp
from sparknet import GRU, LSTM, Conv2D, Dense, Flatten, MaxPool2D, RMSprop, Sequential, precision
from sparknet.datasets import load_digits

U32 = 2.0 ** -24
U16 = 2.0 ** -8
HAVE_BF16 = _bf16.cpu_features()["avx512_bf16"]
HAVE_AMX = "amx" in _bf16.available_backends()
needs_bf16 = pytest.mark.skipif(not HAVE_BF16, reason="this CPU has no AVX512-BF16")


@pytest.fixture
def fallback():
    """The bfloat16 products switched to the float32 fallback for one test."""
    _bf16.set_backend("fallback")
    try:
        yield
    finally:
        _bf16.set_backend("auto")


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """numpy's round to nearest even of float32 to bfloat16 bits (denormals to signed zero,
    NaN kept quiet): the rule the kernel's conversion follows."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    u = np.where((u & 0x7F800000) == 0, u & 0x80000000, u)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def special_values(rng: np.random.Generator) -> np.ndarray:
    """Random values over many scales, exact ties, infinities, NaN, denormals, zeros."""
    ties = (rng.integers(0, 2 ** 16, 64, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    odd_ties = (rng.integers(0, 2 ** 15, 64, dtype=np.uint32) << 17 | 0x18000).view(np.float32)
    vals = np.concatenate([
        (rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)).astype(np.float32),
        ties[np.isfinite(ties)], odd_ties[np.isfinite(odd_ties)],
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-41, 3.4e38, -3.4e38,
                  np.finfo(np.float32).tiny], dtype=np.float32)])
    return vals.astype(np.float32)


def rounded(x: np.ndarray) -> np.ndarray:
    return _bf16.round_bf16(x).astype(np.float64)


def gemm_bound(A: np.ndarray, B: np.ndarray, K: int) -> np.ndarray:
    """(K + 2) u32 (|A| @ |B|) for already-rounded float64 operands."""
    return (K + 2) * U32 * (np.abs(A) @ np.abs(B)) + 1e-30


# ---------------------------------------------------------------------------- conversions

@pytest.mark.parametrize("backend", ["auto", "fallback"])
def test_conversion_rounds_to_nearest_even(backend):
    rng = np.random.default_rng(0)
    x = special_values(rng)
    _bf16.set_backend(backend)
    try:
        got = _bf16.to_bf16(x)
    finally:
        _bf16.set_backend("auto")
    want = bf16_reference(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert np.isnan(_bf16.from_bf16(got[~finite])).all()


def test_conversion_of_odd_lengths_and_shapes():
    rng = np.random.default_rng(1)
    for n in (1, 15, 16, 17, 31, 33, 100):
        x = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(_bf16.to_bf16(x), bf16_reference(x))
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    assert _bf16.round_bf16(x).shape == (3, 5, 7)
    assert _bf16.to_bf16(np.zeros(0, np.float32)).shape == (0,)


def test_rounding_error_is_at_most_half_a_bfloat16_ulp():
    x = np.random.default_rng(2).standard_normal(10000).astype(np.float32)
    r = _bf16.round_bf16(x)
    assert np.all(np.abs(r - x) <= U16 * np.abs(x))
    np.testing.assert_array_equal(_bf16.round_bf16(r), r)         # idempotent


def test_conversion_matches_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    x = special_values(np.random.default_rng(3))
    x = x[np.isfinite(x) & ((np.abs(x) >= np.finfo(np.float32).tiny) | (x == 0))]
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(_bf16.to_bf16(x), theirs)


# ---------------------------------------------------------------------------- the GEMM

SIZES = [(1, 1, 1), (3, 5, 7), (13, 33, 17), (12, 32, 2), (25, 64, 401), (37, 47, 385),
         (241, 70, 129)]


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_equals_float_product_of_rounded_operands(trans_a, trans_b):
    rng = np.random.default_rng(4)
    for M, N, K in SIZES:
        A = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
        B = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
        a, b = rounded(A), rounded(B)
        a, b = (a.T if trans_a else a), (b.T if trans_b else b)
        ref, bound = a @ b, gemm_bound(a, b, K)
        C = np.full((M, N), np.nan, np.float32)
        _bf16.py_gemm(A, B, C, trans_a, trans_b)
        assert np.all(np.abs(C - ref) <= bound), (M, N, K)
        C0 = rng.standard_normal((M, N)).astype(np.float32)
        C = C0.copy()
        _bf16.py_gemm(A, B, C, trans_a, trans_b, accumulate=True)
        assert np.all(np.abs(C - (ref + C0)) <= bound + 2 * U32 * np.abs(ref + C0)), (M, N, K)


def test_gemm_takes_bfloat16_operands_as_they_are():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((9, 21)).astype(np.float32)
    B = rng.standard_normal((21, 40)).astype(np.float32)
    C1, C2 = np.zeros((9, 40), np.float32), np.zeros((9, 40), np.float32)
    _bf16.py_gemm(A, B, C1)
    _bf16.py_gemm(_bf16.to_bf16(A), _bf16.to_bf16(B), C2)
    np.testing.assert_array_equal(C1, C2)


def test_gemm_with_empty_inner_dimension_and_bad_shapes():
    C = np.ones((3, 4), np.float32)
    _bf16.py_gemm(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32), C)
    np.testing.assert_array_equal(C, 0)
    with pytest.raises(ValueError, match="shape mismatch"):
        _bf16.py_gemm(np.zeros((3, 5), np.float32), np.zeros((4, 4), np.float32), C)
    with pytest.raises(ValueError, match="must be 2-D"):
        _bf16.py_gemm(np.zeros(5, np.float32), np.zeros((5, 4), np.float32), C)
    with pytest.raises(ValueError, match="one of 'auto', 'amx', 'avx512_bf16', 'fallback', got 'tiles'"):
        _bf16.set_backend("tiles")


@needs_bf16
@pytest.mark.parametrize("trans", [False, True])
def test_packed_weights_give_the_same_product(trans):
    rng = np.random.default_rng(6)
    for K, N in [(1, 1), (33, 47), (784, 70), (64, 800)]:
        W = rng.standard_normal((N, K) if trans else (K, N)).astype(np.float32)
        X = rng.standard_normal((29, K)).astype(np.float32)
        packed = _bf16.pack(W, trans)
        assert (packed.K, packed.N, packed.trans) == (K, N, trans)
        C1, C2 = np.zeros((29, N), np.float32), np.zeros((29, N), np.float32)
        _bf16.py_gemm_packed(X, packed, C1)
        _bf16.py_gemm(X, W, C2, False, trans)
        np.testing.assert_array_equal(C1, C2)
        packed.refill(2 * W)                         # packed again in place
        _bf16.py_gemm_packed(X, packed, C1)
        np.testing.assert_array_equal(C1, 2 * C2)
        with pytest.raises(ValueError, match="refill"):
            packed.refill(np.zeros((K + 1, N + 1), np.float32))


def test_fallback_products_keep_the_bound(fallback):
    assert _bf16.backend() == "fallback" and not precision.available()
    rng = np.random.default_rng(7)
    for M, N, K in SIZES[:4]:
        A = rng.standard_normal((K, M)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        a, b = rounded(A).T, rounded(B)
        C = np.zeros((M, N), np.float32)
        _bf16.py_gemm(A, B, C, True, False)
        assert np.all(np.abs(C - a @ b) <= gemm_bound(a, b, K))
    with pytest.raises(RuntimeError, match="kernel is off"):
        _bf16.pack(np.ones((3, 3), np.float32))


def test_environment_variable_forces_the_fallback():
    env = dict(os.environ, SPARKNET_BF16="fallback")
    out = subprocess.run([sys.executable, "-c", "import sparknet._bf16 as b; print(b.backend())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "fallback"


def test_capabilities_name_the_paths():
    caps = _bf16.capabilities()
    assert caps["fp32"] in ("avx512", "blas")
    assert caps["bf16"] == ("amx" if HAVE_AMX else "avx512_bf16" if HAVE_BF16 else None)
    assert caps["amx"].startswith("on: " if HAVE_AMX else "off: ")
    assert set(caps["cpu"]) == {"avx512_bf16", "amx_bf16"}
    text = precision.describe()
    assert "bf16 products" in text and "AMX" in text


# ---------------------------------------------------------------------------- AMX tiles

@pytest.fixture
def on_backend():
    """Switch the bfloat16 products to a backend for one test (skipped, with the reason, where
    this machine cannot run it); ``"auto"`` again afterwards."""
    def switch(name: str) -> None:
        if name not in _bf16.available_backends():
            why = _bf16.amx_status() if name == "amx" else "this CPU has no AVX512-BF16"
            pytest.skip(f"bf16 backend {name!r} unavailable here: {why}")
        _bf16.set_backend(name)
    try:
        yield switch
    finally:
        _bf16.set_backend("auto")


def product_on(backend: str, A: np.ndarray, B: np.ndarray, C0: np.ndarray, trans_a: bool,
               trans_b: bool) -> tuple[np.ndarray, np.ndarray]:
    """(C = op(A) @ op(B), C0 + op(A) @ op(B)) on ``backend``."""
    _bf16.set_backend(backend)
    C = np.full(C0.shape, np.nan, np.float32)
    _bf16.py_gemm(A, B, C, trans_a, trans_b)
    Cacc = C0.copy()
    _bf16.py_gemm(A, B, Cacc, trans_a, trans_b, accumulate=True)
    return C, Cacc


# M, N, K at the tile edges (16 rows, 16 columns, 16 pairs = 32 values of k), odd K, and past
# the blocks of A (128 rows, 256 pairs)
EDGE = (1, 15, 16, 17, 31, 33)
AMX_SIZES = ([(m, n, k) for m in EDGE for n in EDGE for k in EDGE]
             + [(64, 64, 64), (130, 70, 530), (257, 96, 1025), (48, 784, 128)])


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_amx_gemm_equals_rounded_reference_and_avx512_at_tile_edges(on_backend, trans_a,
                                                                    trans_b):
    on_backend("amx")
    rng = np.random.default_rng(20)
    for M, N, K in AMX_SIZES:
        A = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
        B = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
        C0 = rng.standard_normal((M, N)).astype(np.float32)
        a, b = rounded(A), rounded(B)
        a, b = (a.T if trans_a else a), (b.T if trans_b else b)
        ref, bound = a @ b, gemm_bound(a, b, K)
        amx, amx_acc = product_on("amx", A, B, C0, trans_a, trans_b)
        avx, avx_acc = product_on("avx512_bf16", A, B, C0, trans_a, trans_b)
        where = (M, N, K, trans_a, trans_b)
        assert np.all(np.abs(amx - ref) <= bound), where
        assert np.all(np.abs(amx_acc - (ref + C0)) <= bound + 2 * U32 * np.abs(ref + C0)), where
        # both kernels sum the same exact products in float32, in different orders
        assert np.all(np.abs(amx - avx) <= 2 * bound), where
        assert np.all(np.abs(amx_acc - avx_acc) <= 2 * bound + 4 * U32 * np.abs(ref + C0)), where


def test_amx_packed_products_with_bfloat16_operands(on_backend):
    on_backend("amx")
    rng = np.random.default_rng(21)
    for M, N, K, trans in [(17, 33, 31, False), (128, 512, 784, True), (3, 10, 256, True)]:
        W = rng.standard_normal((N, K) if trans else (K, N)).astype(np.float32)
        X = rng.standard_normal((M, K)).astype(np.float32)
        packed = _bf16.pack(W, trans)
        C1, C2 = np.zeros((M, N), np.float32), np.zeros((M, N), np.float32)
        _bf16.py_gemm_packed(_bf16.to_bf16(X), packed, C1)
        _bf16.py_gemm_packed(X, packed, C2)
        np.testing.assert_array_equal(C1, C2)
        _bf16.set_backend("avx512_bf16")
        C3 = np.zeros((M, N), np.float32)
        _bf16.py_gemm_packed(X, packed, C3)
        _bf16.set_backend("amx")
        x, w = rounded(X), (rounded(W).T if trans else rounded(W))
        assert np.all(np.abs(C1 - C3) <= 2 * gemm_bound(x, w, K)), (M, N, K)


def test_amx_padding_never_multiplies_zero_by_infinity(on_backend):
    """The pairs, rows and columns that pad the tiles are zeros on both sides: an infinity in
    the last row of B (K odd, a partial tile of pairs) gives infinities, not NaN."""
    on_backend("amx")
    for M, N, K in [(17, 33, 33), (5, 7, 61), (40, 20, 513)]:
        A = np.ones((M, K), np.float32)
        B = np.ones((K, N), np.float32)
        B[-1, :] = np.inf
        C = np.zeros((M, N), np.float32)
        _bf16.py_gemm(A, B, C)
        assert np.all(C == np.inf), (M, N, K)


def test_backend_switch_reports_what_runs(on_backend):
    on_backend("avx512_bf16")
    assert _bf16.backend() == "avx512_bf16"
    assert _bf16.capabilities()["amx"] == "off: set_backend('avx512_bf16')" or not HAVE_AMX
    on_backend("amx")
    assert _bf16.backend() == "amx" and _bf16.capabilities()["amx"] == "on: every bfloat16 product"
    _bf16.set_backend("auto")
    assert _bf16.backend() == "amx"
    # under "auto" the size rule keeps the small products on AVX512-BF16
    assert _bf16.amx_worth(128, 512, 784) and not _bf16.amx_worth(1, 16, 16)


def test_amx_where_unavailable_is_refused_with_the_choices():
    if HAVE_AMX:
        pytest.skip("AMX is usable here: the refusal is tested in a process that cannot get it")
    with pytest.raises(ValueError, match="bf16 backend 'amx' is not available here .*available: "
                                         "'auto'"):
        _bf16.set_backend("amx")
    assert _bf16.backend() != "amx"


_REFUSED = """
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
class Stack(ctypes.Structure):
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]
# an alternate signal stack large enough for a signal frame without the tile state, too small
# with it (8 KiB more): Linux then refuses the tile state to the process (ENOSPC)
buf = ctypes.create_string_buffer(6144)
assert libc.sigaltstack(ctypes.byref(Stack(ctypes.addressof(buf), 0, 6144)), None) == 0
import numpy as np
import sparknet._bf16 as b
print(b.backend())
print(b.capabilities()["amx"])
try:
    b.set_backend("amx")
except ValueError as exc:
    print(exc)
C = np.zeros((64, 64), np.float32)
b.py_gemm(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32), C)
print(C.min(), C.max())
"""


def test_refused_tile_state_falls_back_to_avx512_and_says_why():
    if not HAVE_AMX:
        pytest.skip(f"no AMX here ({_bf16.amx_status()}): nothing to refuse")
    env = dict(os.environ, PYTHONFAULTHANDLER="")
    out = subprocess.run([sys.executable, "-c", _REFUSED], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    backend, why, error, values = out.stdout.strip().splitlines()
    if backend == "amx":
        pytest.skip("this kernel grants the tile state despite a small signal stack")
    assert backend == "avx512_bf16"
    assert why.startswith("off: Linux refused the AMX tile state: arch_prctl"), why
    assert "'amx' is not available here" in error and "available: 'auto', 'avx512_bf16'" in error
    assert values == "64.0 64.0"


def test_environment_variable_chooses_the_avx512_kernel():
    if not HAVE_BF16:
        pytest.skip("this CPU has no AVX512-BF16")
    env = dict(os.environ, SPARKNET_BF16="avx512_bf16")
    out = subprocess.run([sys.executable, "-c", "import sparknet._bf16 as b; print(b.backend())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "avx512_bf16"


def test_amx_permission_is_inherited_by_forked_workers(on_backend):
    """Spark's Python workers are forked: a child of a process that got the tile state runs
    its products on the tiles without asking again."""
    on_backend("amx")
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        backend, value = pool.apply(_forked_product)
    assert backend == "amx" and value == 33.0


def _forked_product() -> tuple[str, float]:
    C = np.zeros((40, 40), np.float32)
    _bf16.py_gemm(np.ones((40, 33), np.float32), np.ones((33, 40), np.float32), C)
    return _bf16.backend(), float(C.max())


# ---------------------------------------------------------------------------- layers

def layer_bound(A: np.ndarray, B: np.ndarray, K: int) -> np.ndarray:
    """A product on operands rounded to bfloat16 against the float32 product of the originals."""
    return ((2 * U16 + U16 ** 2) + (K + 2) * U32) * (np.abs(A) @ np.abs(B)) + 1e-30


@needs_bf16
def test_dense_kernels_in_bf16_within_the_rounding_bound():
    rng = np.random.default_rng(8)
    N, I, O = 37, 53, 29
    X = rng.standard_normal((N, I)).astype(np.float32)
    W = rng.standard_normal((O, I)).astype(np.float32)
    dY = rng.standard_normal((N, O)).astype(np.float32)
    Y = np.zeros((N, O), np.float32)
    _dense.forward(X, W, None, Y, 0, None, _bf16.pack(W, True))
    x64, w64 = X.astype(np.float64), W.astype(np.float64)
    assert np.all(np.abs(Y - x64 @ w64.T) <= layer_bound(x64, w64.T, I))
    # exactly a float32 product of the rounded operands
    a, b = rounded(X), rounded(W).T
    assert np.all(np.abs(Y - a @ b) <= gemm_bound(a, b, I))
    dX, dW = np.zeros((N, I), np.float32), np.zeros((O, I), np.float32)
    _dense.backward(X, W, Y, dY.copy(), dX, dW, None, 0, None, True, _bf16.pack(W, False))
    d64 = dY.astype(np.float64)
    assert np.all(np.abs(dW - d64.T @ x64) <= layer_bound(d64.T, x64, N))
    assert np.all(np.abs(dX - d64 @ w64) <= layer_bound(d64, w64, O))


@needs_bf16
def test_conv_kernels_in_bf16_within_the_rounding_bound():
    rng = np.random.default_rng(9)
    X = rng.standard_normal((3, 9, 8, 5)).astype(np.float32)
    Wt = rng.standard_normal((3, 3, 5, 7)).astype(np.float32)
    Y = np.zeros((3, 7, 6, 7), np.float32)
    W2 = Wt.reshape(-1, 7)
    _conv.forward(X, Wt, None, Y, w16=_bf16.pack(W2, False))
    cols = np.zeros((3 * 7 * 6, 45), np.float64)
    _conv.im2col(X.astype(np.float64), cols, 3, 3, 7, 6)
    y = Y.reshape(-1, 7)
    assert np.all(np.abs(y - cols @ W2) <= layer_bound(cols, W2.astype(np.float64), 45))
    dY = rng.standard_normal(Y.shape).astype(np.float32)
    dX, dW = np.zeros_like(X), np.zeros_like(Wt)
    _conv.backward(X, Wt, Y, dY.copy(), dX, dW, None, bf16=True, wt16=_bf16.pack(W2, True))
    d = dY.reshape(-1, 7).astype(np.float64)
    assert np.all(np.abs(dW.reshape(-1, 7) - cols.T @ d) <= layer_bound(cols.T, d, len(d)))
    dcols = d @ W2.T.astype(np.float64)
    dX64 = np.zeros(X.shape, np.float64)
    _conv.col2im(dcols, dX64, 3, 3, 7, 6)
    bcols = np.abs(d) @ np.abs(W2.T.astype(np.float64))
    bX = np.zeros(X.shape, np.float64)
    _conv.col2im(bcols, bX, 3, 3, 7, 6)
    assert np.all(np.abs(dX - dX64) <= ((2 * U16 + U16 ** 2) + 60 * U32) * bX + 1e-30)


def grads_fp32_and_bf16(model: Sequential, x: np.ndarray, y: np.ndarray,
                        mask: np.ndarray | None = None) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(loss, outputs, gradients) of one batch in float32 and in bfloat16."""
    out = []
    for mode in ("fp32", "bf16"):
        with precision.autocast(mode):
            loss = model.loss_and_grad(x, y, mask=mask)[0]
            fwd = model.forward(x, training=False, mask=mask).copy()
        out.append((loss, fwd, model.grads.copy()))
    return out


def rel_max(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def rel_norm(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@needs_bf16
@pytest.mark.parametrize("cls", [LSTM, GRU])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_recurrent_layers_in_bf16_close_to_fp32(cls, return_sequences):
    rng = np.random.default_rng(10)
    model = Sequential([Dense(12), cls(16, return_sequences=return_sequences),
                        Dense(5, activation="softmax")], input_shape=(8, 6), seed=0)
    x = rng.standard_normal((9, 8, 6)).astype(np.float32)
    y = rng.integers(0, 5, (9, 8) if return_sequences else 9)
    mask = np.ones((9, 8))
    mask[2, 5:] = 0
    (l32, f32, g32), (l16, f16, g16) = grads_fp32_and_bf16(model, x, y, mask)
    assert abs(l16 - l32) <= 0.01 * abs(l32)
    assert rel_max(f16, f32) <= 0.03
    for name, (a, b, _) in model.param_slices()[1].items():
        assert rel_max(g16[a:b], g32[a:b]) <= 0.03, name
    assert rel_max(g16, g32) <= 0.03


@needs_bf16
def test_cnn_in_bf16_close_to_fp32_and_fp32_path_unchanged():
    rng = np.random.default_rng(11)
    model = Sequential([Conv2D(8, 3, padding="same", activation="relu"), MaxPool2D(2),
                        Conv2D(6, 1), Flatten(), Dense(10, activation="softmax")],
                       input_shape=(10, 10, 3), seed=0)
    x = rng.standard_normal((6, 10, 10, 3)).astype(np.float32)
    y = rng.integers(0, 10, 6)
    model.loss_and_grad(x, y)
    before = model.grads.copy()
    (l32, _, g32), (l16, _, g16) = grads_fp32_and_bf16(model, x, y)
    np.testing.assert_array_equal(g32, before)      # outside autocast: float32, bit for bit
    assert abs(l16 - l32) <= 0.01 * abs(l32)
    assert rel_norm(g16, g32) <= 0.04
    assert not np.array_equal(g16, g32)              # the bf16 path did run


@needs_bf16
def test_weights_are_packed_once_per_step():
    layer = Sequential([Dense(4)], input_shape=(3,), seed=0).layers[0]
    x = np.ones((2, 3), np.float32)
    with precision.autocast("bf16"):
        y1 = layer.forward(x).copy()
        first = precision.packed(layer, "kernel.T", layer.params["kernel"], True)
        layer.params["kernel"][...] *= 2             # no new step: the packed copy is kept
        assert precision.packed(layer, "kernel.T", layer.params["kernel"], True) is first
        np.testing.assert_array_equal(layer.forward(x), y1)
        precision.next_step()                        # what fit does before every step
        np.testing.assert_allclose(layer.forward(x), 2 * y1, rtol=1e-6)


# ---------------------------------------------------------------------------- training

digits_mlp = functools.partial(mlp, 64, seed=3)


@needs_bf16
def test_digits_mlp_in_bf16_within_one_point_of_fp32():
    Xtr, ytr, Xte, yte = load_digits(seed=0)
    acc = {}
    for mode in ("fp32", "bf16"):
        model = digits_mlp()
        model.fit(Xtr, ytr, epochs=15, batch_size=32, optimizer=RMSprop(lr=1e-3), verbose=0,
                  precision=mode, validation_data=(Xte, yte))
        acc[mode] = model.evaluate(Xte, yte)["accuracy"]
    assert acc["fp32"] > 0.94
    assert abs(acc["bf16"] - acc["fp32"]) <= 0.01, acc


@needs_bf16
def test_validation_inside_fit_reads_the_updated_weights():
    Xtr, ytr, Xte, yte = load_digits(seed=0)
    model = digits_mlp()
    hist = model.fit(Xtr[:300], ytr[:300], epochs=2, batch_size=50, verbose=0, precision="bf16",
                     validation_data=(Xte, yte))
    with precision.autocast("bf16"):
        again = model.evaluate(Xte, yte)["loss"]
    assert again == pytest.approx(hist.history["val_loss"][-1], rel=1e-6)


def test_bf16_without_the_instructions_trains_fp32_with_one_warning(fallback, monkeypatch):
    monkeypatch.setattr(precision, "_warned", False)
    Xtr, ytr, _, _ = load_digits(seed=0)
    Xtr, ytr = Xtr[:200], ytr[:200]
    ref = digits_mlp()
    ref.fit(Xtr, ytr, epochs=2, batch_size=50, verbose=0)
    model = digits_mlp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(Xtr, ytr, epochs=2, batch_size=50, verbose=0, precision="bf16")
        model.fit(Xtr, ytr, epochs=1, batch_size=50, verbose=0, precision="bf16")
    fallbacks = [w for w in caught if issubclass(w.category, precision.PrecisionFallbackWarning)]
    assert len(fallbacks) == 1
    assert "trains in float32" in str(fallbacks[0].message)
    assert fallbacks[0].filename == __file__
    model2 = digits_mlp()
    model2.fit(Xtr, ytr, epochs=2, batch_size=50, verbose=0, precision="bf16")
    np.testing.assert_array_equal(model2.params, ref.params)


def test_precision_argument_is_checked():
    X, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int64)
    model = Sequential([Dense(2, activation="softmax")], seed=0)
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16', got 'fp16'"):
        model.fit(X, y, epochs=1, verbose=0, precision="fp16")
    model64 = Sequential([Dense(2, activation="softmax")], dtype="float64", seed=0)
    with pytest.raises(ValueError, match="trains float32 models; this model is float64"):
        model64.fit(X, y, epochs=1, verbose=0, precision="bf16")
    assert not precision.active()


def test_autocast_scopes_nest_and_restore():
    assert not precision.active()
    with precision.autocast("fp32") as outer:
        assert outer == "fp32" and not precision.active()
        if precision.available():
            with precision.autocast("bf16") as inner:
                assert inner == "bf16" and precision.active()
            assert not precision.active()
    assert not precision.active()


def test_info_reports_the_paths(capsys):
    from sparknet.__main__ import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "bf16 products:" in out and "fp32 products:" in out and "AMX:" in out

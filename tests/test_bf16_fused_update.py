"""The RMSprop update fused with the bfloat16 packing of the weights it writes
(``sparknet._optim.rmsprop_pack``, ``sparknet.precision.optimizer_step``) against the update
and the packing done apart, bit for bit; and the AVX-512 RMSprop loop against the scalar one."""
from __future__ import annotations

import numpy as np
import pytest

from sparknet import (
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    RMSprop,
    Sequential,
    _bf16,
    _optim,
    precision,
)
from sparknet.callbacks import Callback

needs_bf16 = pytest.mark.skipif(not precision.available(),
                                reason="no bfloat16 kernel on this CPU (AVX512-BF16 needed)")

# (offset, rows, cols, packings: True = W.T, False = W) in a buffer of 5,000 parameters
WEIGHTS = [(10, 37, 41, (True, False)), (2000, 70, 33, (True,)), (4955, 5, 9, (False,))]


def _buffers(n: int = 5000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
            np.abs(rng.standard_normal(n)).astype(np.float32))


def _targets() -> list:
    return [(off, r, c, tuple(_bf16.PackedB(c, r, True) if t else _bf16.PackedB(r, c, False)
                              for t in ts)) for off, r, c, ts in WEIGHTS]


def _contents(pb: _bf16.PackedB) -> np.ndarray:
    """The packed matrix read back exactly: the identity (K, K) times it."""
    out = np.zeros((pb.K, pb.N), np.float32)
    _bf16.py_gemm_packed(np.eye(pb.K, dtype=np.float32), pb, out)
    return out


@pytest.mark.parametrize("simd", [False, True])
def test_rmsprop_simd_loop_matches_scalar_bit_for_bit(simd: bool) -> None:
    for n in (1, 15, 16, 17, 1000):
        p, g, v = _buffers(n)
        ref_p, ref_v = p.copy(), v.copy()
        _optim.set_simd(False)
        _optim.rmsprop(ref_p, g, ref_v, None, None, 1e-3, 0.99, 1e-8, 0.0, 0.0)
        _optim.set_simd(simd)
        _optim.rmsprop(p, g, v, None, None, 1e-3, 0.99, 1e-8, 0.0, 0.0)
        assert np.array_equal(p.view(np.uint32), ref_p.view(np.uint32))
        assert np.array_equal(v.view(np.uint32), ref_v.view(np.uint32))
    _optim.set_simd(True)


@needs_bf16
@pytest.mark.parametrize("simd", [False, True])
def test_fused_update_and_pack_equal_update_then_pack(simd: bool) -> None:
    _optim.set_simd(simd)
    try:
        p, g, v = _buffers()
        p2, v2 = p.copy(), v.copy()
        fused, apart = _targets(), _targets()
        _optim.rmsprop_pack(p, g, v, 1e-3, 0.99, 1e-8, fused)
        _optim.rmsprop(p2, g, v2, None, None, 1e-3, 0.99, 1e-8, 0.0, 0.0)
        for off, r, c, packs in apart:
            for pb in packs:
                pb.refill(p2[off:off + r * c].reshape(r, c))
        assert np.array_equal(p.view(np.uint32), p2.view(np.uint32))
        assert np.array_equal(v.view(np.uint32), v2.view(np.uint32))
        for (off, r, c, packs), (_, _, _, refs) in zip(fused, apart):
            for pb, ref in zip(packs, refs):
                w = p[off:off + r * c].reshape(r, c)
                assert np.array_equal(_contents(pb), _bf16.round_bf16(w.T if pb.trans else w))
                assert np.array_equal(_contents(pb), _contents(ref))
    finally:
        _optim.set_simd(True)


@needs_bf16
def test_fused_update_refuses_overlapping_or_misfit_weights() -> None:
    p, g, v = _buffers()
    with pytest.raises(ValueError, match="overlaps another"):
        _optim.rmsprop_pack(p, g, v, 1e-3, 0.99, 1e-8, [(0, 10, 10, ()), (50, 10, 10, ())])
    with pytest.raises(ValueError, match="does not fit"):
        _optim.rmsprop_pack(p, g, v, 1e-3, 0.99, 1e-8, [(0, 10, 10, (_bf16.PackedB(9, 10),))])
    with pytest.raises(ValueError, match="leaves the 5000 parameters"):
        _optim.rmsprop_pack(p, g, v, 1e-3, 0.99, 1e-8, [(4990, 10, 10, ())])


class _Noop(Callback):
    """Any callback turns the fused packing off (a callback may change the weights)."""


@needs_bf16
def test_fit_with_fused_packing_trains_exactly_as_without() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((192, 12, 12, 1), dtype=np.float32)
    y = rng.integers(0, 5, 192)
    runs = []
    for callbacks in ([], [_Noop()]):
        m = Sequential([Conv2D(8, 3, activation="relu"), MaxPool2D(2), Flatten(),
                        Dense(32, activation="relu"), Dense(5, activation="softmax")],
                       input_shape=(12, 12, 1), seed=0)
        h = m.fit(X, y, epochs=2, batch_size=32, optimizer=RMSprop(lr=1e-3), precision="bf16",
                  verbose=0, callbacks=callbacks)
        runs.append((m.params.copy(), h.history["loss"]))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


@needs_bf16
def test_optimizer_step_leaves_packings_fresh_for_the_next_forward() -> None:
    m = Sequential([Dense(16, activation="relu"), Dense(3, activation="softmax")],
                   input_shape=(8,), seed=0)
    opt = RMSprop(lr=1e-2)
    X = np.random.default_rng(0).random((32, 8), dtype=np.float32)
    y = np.arange(32) % 3
    with precision.autocast("bf16"):
        m.loss_and_grad(X, y)
        assert precision.optimizer_step(m, opt)
        for layer in m.layers:
            for key, hit in layer.__dict__["_bf16_packed"].items():
                w = layer.params["kernel"]
                assert np.array_equal(_contents(hit.pb),
                                      _bf16.round_bf16(w.T if key == "kernel.T" else w)), key
    assert not precision.optimizer_step(m, opt)   # fp32: a plain step

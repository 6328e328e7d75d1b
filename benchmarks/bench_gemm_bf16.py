"""The bfloat16 GEMM alone, one thread: AMX tiles against AVX512-BF16 against float32 sgemm.

The products are those a training step of ``bench_bf16.py``'s nets runs (forward, weight
gradient, input gradient), at its batch sizes: MLP 784-512-256-10 (batch 128), the CNN's
im2col products (batch 64), the LSTM and GRU with 128 units over 28 steps of 28 features
(batch 128).  Weights (forward and input-gradient products) are packed beforehand, as the
layers do once per step; the other operand of a weight gradient is packed inside the timed
call, as the layers do.  Printed per product: GFLOP/s (best of ``--repeats`` calls through
the Python entry points, all contenders alternating) of

- ``amx``: ``sparknet._bf16`` with ``set_backend("amx")`` (every product on the tiles),
- ``avx512bf16``: ``set_backend("avx512_bf16")``,
- ``sgemm``: the float32 BLAS (``sparknet._blas``) on the same shapes,

and which of the two bfloat16 kernels ``set_backend("auto")`` picks for the shape (the size
rule ``sn_amx_worth`` of ``csrc/bf16_amx.h``).

    python benchmarks/bench_gemm_bf16.py [--repeats 30] [--only mlp,cnn,lstm,gru]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from typing import Any, Callable

import numpy as np
from threadpoolctl import threadpool_limits

try:
    import sparknet  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import machine_header  # noqa: E402

from sparknet import _bf16, _blas  # noqa: E402

#: (net, product, M, N, K, trans_a, trans_b, B packed beforehand)
PRODUCTS = [
    ("mlp", "784->512 forward", 128, 512, 784, False, True, True),
    ("mlp", "512->256 forward", 128, 256, 512, False, True, True),
    ("mlp", "256->10 forward", 128, 10, 256, False, True, True),
    ("mlp", "784->512 weight grad", 512, 784, 128, True, False, False),
    ("mlp", "512->256 weight grad", 256, 512, 128, True, False, False),
    ("mlp", "256->10 weight grad", 10, 256, 128, True, False, False),
    ("mlp", "512->256 input grad", 128, 512, 256, False, False, True),
    ("mlp", "256->10 input grad", 128, 256, 10, False, False, True),
    ("cnn", "conv1 forward", 36864, 32, 25, False, False, True),
    ("cnn", "conv2 forward", 4096, 64, 800, False, False, True),
    ("cnn", "conv1 weight grad", 25, 32, 36864, True, False, False),
    ("cnn", "conv2 weight grad", 800, 64, 4096, True, False, False),
    ("cnn", "conv2 input grad", 4096, 800, 64, False, True, True),
    ("cnn", "1024->128 forward", 64, 128, 1024, False, True, True),
    ("cnn", "1024->128 weight grad", 128, 1024, 64, True, False, False),
    ("lstm", "input projection", 3584, 512, 28, False, True, False),
    ("lstm", "step h W_hh^T", 128, 512, 128, False, False, True),
    ("lstm", "step dh", 128, 128, 512, False, False, True),
    ("lstm", "dW_hh", 512, 128, 3584, True, False, False),
    ("lstm", "dW_ih", 512, 28, 3584, True, False, False),
    ("gru", "input projection", 3584, 384, 28, False, True, False),
    ("gru", "step h W_hz,r^T", 128, 256, 128, False, False, True),
    ("gru", "step h W_hn^T", 128, 128, 128, False, False, True),
    ("gru", "step dh", 128, 128, 256, False, False, True),
    ("gru", "dW_hh", 384, 128, 3584, True, False, False),
]


def contenders(M: int, N: int, K: int, ta: bool, tb: bool, packed: bool,
               rng: np.random.Generator) -> dict[str, Callable[[], None]]:
    """The timed calls of one product: the bfloat16 product (backend chosen by the caller)
    and sgemm."""
    A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    C = np.zeros((M, N), np.float32)
    if packed:
        bf16 = partial(_bf16.py_gemm_packed, A, _bf16.pack(B, tb), C, ta)
    else:
        bf16 = partial(_bf16.py_gemm, A, B, C, ta, tb)
    return {"bf16": bf16, "sgemm": partial(_blas.py_gemm, ta, tb, 1.0, A, B, 0.0, C)}


def measure(repeats: int, only: set[str]) -> list[dict[str, Any]]:
    """GFLOP/s of every product in ``only``'s nets on the three contenders."""
    rng = np.random.default_rng(0)
    have_amx = "amx" in _bf16.available_backends()
    kernels = (["amx"] if have_amx else []) + ["avx512_bf16"]
    rows = []
    for net, label, M, N, K, ta, tb, packed in PRODUCTS:
        if net not in only:
            continue
        calls = contenders(M, N, K, ta, tb, packed, rng)
        best = {k: float("inf") for k in kernels + ["sgemm"]}
        for _ in range(repeats):          # alternate, so that all see the same load
            for k in kernels:
                _bf16.set_backend(k)
                best[k] = min(best[k], _time(calls["bf16"]))
            best["sgemm"] = min(best["sgemm"], _time(calls["sgemm"]))
        _bf16.set_backend("auto")
        flops = 2.0 * M * N * K
        rows.append({"net": net, "product": label, "M": M, "N": N, "K": K,
                     "gflops": {k: flops / t / 1e9 for k, t in best.items()},
                     "auto": "amx" if have_amx and _bf16.amx_worth(M, N, K) else "avx512_bf16"})
    return rows


def _time(f: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per contender")
    ap.add_argument("--only", default="mlp,cnn,lstm,gru", help="comma-separated nets")
    args = ap.parse_args()
    print(machine_header())
    print(f"bf16 backends here: {', '.join(_bf16.available_backends())}; "
          f"AMX: {_bf16.capabilities()['amx']}\n")
    with threadpool_limits(1):
        rows = measure(args.repeats, {n.strip() for n in args.only.split(",")})
    print(f"{'net':5s} {'product':22s} {'M':>6s} {'N':>5s} {'K':>6s}   {'amx':>7s} "
          f"{'avx512bf16':>10s} {'sgemm':>7s}  amx/avx  auto")
    for r in rows:
        g = r["gflops"]
        amx = f"{g['amx']:7.1f}" if "amx" in g else f"{'-':>7s}"
        ratio = f"{g['amx'] / g['avx512_bf16']:6.2f}x" if "amx" in g else f"{'-':>7s}"
        print(f"{r['net']:5s} {r['product']:22s} {r['M']:6d} {r['N']:5d} {r['K']:6d}   {amx} "
              f"{g['avx512_bf16']:10.1f} {g['sgemm']:7.1f}  {ratio}  {r['auto']}")


if __name__ == "__main__":
    main()

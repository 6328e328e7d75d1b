"""One-thread training throughput of the kernels against PyTorch and plain numpy.

Runs, in one process and one after the other, each with one BLAS thread:

- ``bench_mlp``:  MLP 784-512-256-10 (batch 128): sparknet vs numpy vs PyTorch, GEMM GFLOP/s,
  two threads training two models;
- ``bench_cnn``:  CNN c5x5x32-p2-c5x5x64-p2-d128-d10 on 28x28x1 (batch 64);
- ``bench_lstm``: LSTM 28->128 over 28 steps + dense 10 (batch 128).

    python benchmarks/bench_kernels.py [--only mlp,cnn,lstm] [--seconds 3]

The machine may set ``OPENBLAS_CORETYPE`` (a conservative kernel choice that slows OpenBLAS on
AVX-512 CPUs); ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_kernels.py``
measures with OpenBLAS's own choice. The header names the machine (CPU model, caches, the
one-thread sgemm rate measured at the start) and the BLAS kernel that ran.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import machine_header  # noqa: E402  (the benchmarks folder, put on the path above)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="mlp,cnn,lstm", help="comma-separated subset of mlp,cnn,lstm")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="timing window per implementation "
                         "(mlp, cnn; lstm alternates fixed rounds)")
    args = ap.parse_args()
    print(machine_header())
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        mod = importlib.import_module(f"bench_{name}")
        print()
        res = mod.run() if name == "lstm" else mod.run(seconds=args.seconds)
        mod.report(res)


if __name__ == "__main__":
    main()

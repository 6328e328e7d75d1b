"""Speedup against partitions of the paper's CNN on MNIST.

The net: conv 5x5x6 - max pool 2 - conv 5x5x12 - max pool 2 - conv 4x4x12 (ReLU) - the
softmax classifier (the paper's Fig. for its CNN: 11x on 5 nodes).  One process
(``Sequential.fit``, one BLAS thread) against sparknet's synchronous data-parallel
rounds (``sync="average"``, tau sized by the trainer) on ``local[1]``, ``local[2]`` and a
standalone cluster of 2 one-core workers, on the first ``--rows`` rows of the real MNIST
training set (28x28x1, pixels in [0, 1]; default 30,000, half an epoch of the full set,
to keep the run short), RMSprop lr 1e-3, batch 128, ``--epochs`` epochs per Spark fit (the
median epoch kept).  The cost model's prediction is measured on the same session just
before each fit.  Writes ``results/speedup_cnn.csv`` and ``.png``.

    python benchmarks/paper/speedup_cnn.py [--rows 30000] [--epochs 2]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=C.DEFAULT_MNIST)
    ap.add_argument("--rows", type=int, default=30_000,
                    help="training rows used (default 30,000 of 60,000)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each Spark fit (default 2)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sessions", nargs="+", default=list(C.SESSIONS), choices=list(C.SESSIONS))
    args = ap.parse_args(argv)
    X, y, _, _ = C.mnist(args.mnist, images=True)
    X, y = X[:args.rows], y[:args.rows]
    C.partitions_figure("speedup_cnn",
                        "CNN c5x5x6-p2-c5x5x12-p2-c4x4x12, MNIST: speedup vs partitions",
                        C.cnn_model, X, y, args.batch, args.epochs,
                        f"MNIST train, first {len(X):,} rows",
                        sessions=tuple(args.sessions), baseline_epochs=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speedup against partitions of the paper's fully connected net 784-480-160-10 on MNIST.

The paper's Fig. (FC, speedup vs worker cores: 7.1x on 88 cores) at this machine's scale:
one process (``Sequential.fit``, one BLAS thread) against sparknet's synchronous
data-parallel rounds (``sync="average"``, tau sized by the trainer) on ``local[1]``
(1 partition), ``local[2]`` and a standalone cluster of 2 one-core workers (2 partitions),
on the real MNIST training set (60,000 rows, pixels in [0, 1]), RMSprop lr 1e-3, batch 128.
Each Spark set-up runs ``--epochs`` epochs (the median epoch is kept, set-up excluded);
the cost model's prediction (``sparknet.cluster.planning.cost``) is measured on the same session
just before the fit.  Writes ``results/speedup_fc.csv`` and ``.png``.

    python benchmarks/paper/speedup_fc.py [--epochs 4]
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
    ap.add_argument("--epochs", type=int, default=4, help="epochs of each Spark fit (default 4)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sessions", nargs="+", default=list(C.SESSIONS), choices=list(C.SESSIONS))
    args = ap.parse_args(argv)
    X, y, _, _ = C.mnist(args.mnist)
    C.partitions_figure("speedup_fc", "FC 784-480-160-10, MNIST: speedup vs partitions",
                        C.fc_model, X, y, args.batch, args.epochs, "MNIST train (60,000 rows)",
                        sessions=tuple(args.sessions))
    return 0


if __name__ == "__main__":
    sys.exit(main())

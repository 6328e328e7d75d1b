"""Speedup against data size (synthetic rows shaped like MNIST), FC 784-480-160-10.

The paper's finding: speedup grows with the data size (0.1M to 5M samples), because
Spark's fixed cost per round is paid over more computation.  At this machine's scale:
``--sizes`` synthetic training sets (784 values in [0, 1], 10 classes from a random
linear teacher: **synthetic**, timing only, labelled so in the CSV and the plot), one
process (``Sequential.fit``, one BLAS thread) against sparknet's synchronous
data-parallel rounds (``sync="average"``, tau sized by the trainer, at most 4 epochs per
round) with 2 partitions on ``local[2]`` and on a standalone cluster of 2 one-core
workers.  Each size trains ``max(2, --samples-per-fit / size)`` epochs on Spark (so that
every fit computes about as much) and half as many in one process, right before it on the
same session; medians per epoch.  The cost model's prediction is measured on the session
before its first fit.  Writes ``results/speedup_data_size.csv`` and ``.png``.

    python benchmarks/paper/speedup_data_size.py [--sizes 2000 8000 32000 128000]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)
import numpy as np  # noqa: E402

NAME = "speedup_data_size"
DATA = "synthetic, MNIST-shaped (784 features, 10 classes)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 32000, 128000])
    ap.add_argument("--samples-per-fit", type=int, default=256_000,
                    help="rows each Spark fit trains on in all (epochs = this / size, at least 2)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sessions", nargs="+", default=["local[2]", "standalone"],
                    choices=list(C.SESSIONS))
    args = ap.parse_args(argv)
    title = "FC 784-480-160-10, synthetic MNIST-shaped rows: speedup vs data size (2 partitions)"
    print(C.header(title), flush=True)
    print(f"data: {DATA}; batch {args.batch}, RMSprop lr 1e-3; {C.cost_note()}", flush=True)
    rows: list[dict] = []
    for kind in args.sessions:
        parts = C.SESSIONS[kind]
        with C.session(kind) as spark:
            sc, net = C.measure_costs(spark, C.fc_model(), args.batch)
            for n in args.sizes:
                X, y = C.synthetic_mnist(n)
                epochs = max(2, math.ceil(args.samples_per_fit / n))
                base = C.one_process_epochs(C.fc_model(), X, y, args.batch, max(1, epochs // 2))
                t0 = time.perf_counter()
                r = C.data_parallel_fit(spark, C.fc_model(), X, y, parts, args.batch, epochs)
                wall = time.perf_counter() - t0
                pred = C.predict("average", net, sc, n, partitions=parts, tau=r["tau"])
                one = float(np.median(base))
                row = {"figure": NAME, "series": kind, "rows": n, "partitions": parts,
                       "mode": "sync average", "data": DATA, "samples": n, "batch": args.batch,
                       "tau": r["tau"], "rounds_per_epoch": r["rounds_per_epoch"],
                       "epochs_timed": epochs, "epoch_s": r["epoch_s"],
                       "one_process_epoch_s": one, "one_process_epochs": len(base),
                       "speedup": one / r["epoch_s"], "setup_s": r["setup_s"],
                       "spark_share": r["spark_share"], "fit_wall_s": wall, **pred,
                       "load1": C.load1(), "sgemm_gflops": C.sgemm()}
                rows.append(row)
                print(f"{kind} {n:>7} rows: {epochs} epochs, tau {r['tau']}, "
                      f"{r['rounds_per_epoch']:.2g} rounds/epoch, "
                      f"epoch {r['epoch_s']:.3f} s vs one process {one:.3f} s: "
                      f"{row['speedup']:.2f}x; predicted {pred['pred_speedup']:.2f}x "
                      f"(epoch {pred['pred_epoch_s']:.3f} s) (load {C.load1():.1f})", flush=True)
                del X, y
    C.write_csv(NAME, rows)
    C.plot_speedup(NAME, rows, "rows",
                   "FC 784-480-160-10: speedup vs data size, 2 partitions (SYNTHETIC data)",
                   "training rows (synthetic, MNIST-shaped)", logx=True, note="synthetic data")
    C.print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

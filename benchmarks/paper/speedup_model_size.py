"""Speedup against model size of blocked fully connected layers (model parallelism), synthetic.

The paper's Fig. (speedup vs model size, up to 4B parameters: 5.6x on 10 partitions,
saturating after about 6) at this machine's scale: the net ``IN -> Dense(W, relu) ->
Dense(W, relu) -> Dense(10, softmax)`` (float32, RMSprop, batch ``--batch``), its two hidden
layers cut into K neuron blocks (:class:`sparknet.cluster.model_parallel.ModelParallel`),
the head on the driver, on **synthetic** Gaussian rows (timing only).  Series:

* ``local[1]``, K = 1 (paired): the whole blocked pair in one executor;
* ``local[2]``, K = 2, paired (one exchange per step) and unpaired;
* ``standalone`` (2 one-core workers on 127.0.0.1), K = 2, paired;

each against one process (``Sequential`` + RMSprop, one BLAS thread), their steps
alternating on the same batches (so both see the same load): ``--warmup`` + ``--steps``
steps per cell, medians.  Widths up to 16384 (335.6M blocked parameters, 1.3 GB of
weights) fit this machine's memory and a few minutes.  The cost model's
``predict_model_parallel`` uses the session's measured Spark costs and the network's
costs measured in this process just before each cell.  Writes
``results/speedup_model_size.csv`` and ``.png``.

    python benchmarks/paper/speedup_model_size.py [--widths 1024 2048 4096 8192 16384]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)
import numpy as np  # noqa: E402

NAME = "speedup_model_size"
DATA = "synthetic (Gaussian rows, random labels)"
#: (session, K, paired) of each series
SERIES = {"local[1] K=1": ("local[1]", 1, True), "local[2] K=2 paired": ("local[2]", 2, True),
          "local[2] K=2 unpaired": ("local[2]", 2, False),
          "standalone K=2 paired": ("standalone", 2, True)}


def layers(width: int) -> list:
    from sparknet import Dense
    return [Dense(width, activation="relu"), Dense(width, activation="relu"),
            Dense(10, activation="softmax")]


def cell(spark, sc, n_in: int, width: int, batch: int, K: int, pair: bool, steps: int,
         warmup: int) -> dict:
    """Alternate one-process and K-block steps on the same synthetic batches."""
    from threadpoolctl import threadpool_limits

    from sparknet import RMSprop, Sequential
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    rng = np.random.default_rng(0)
    n = steps + warmup + 1  # one batch more: the last timed step's lookahead has a next batch too
    X = rng.standard_normal((n * batch, n_in)).astype(np.float32)
    y = rng.integers(0, 10, n * batch)
    single = Sequential(layers(width), input_shape=(n_in,), dtype="float32", seed=0)
    net = None
    if sc is not None:
        from sparknet.cluster.planning.cost import NetworkCosts
        net = NetworkCosts.measure(single, batch, steps=1)
    opt = RMSprop(lr=1e-4)
    mp = ModelParallel(layers(width), BlockPlan({0: K, 1: K}, pair=pair), (n_in,), spark=spark,
                       seed=0, optimizer=RMSprop(lr=1e-4), name="paper-size")
    one, comp = [], []
    try:
        xs = [X[s * batch:(s + 1) * batch] for s in range(n)]
        for s in range(steps + warmup):
            xb, yb = xs[s], y[s * batch:(s + 1) * batch]
            with threadpool_limits(1):
                t0 = time.perf_counter()
                single.train_on_batch(xb, yb, optimizer=opt)
                one.append(time.perf_counter() - t0)
            mp.train_on_batch(xb, yb, next_x=xs[s + 1])
            comp.append(mp.last_step_times["executor_compute_s"])
        step_s = float(np.median(mp.step_times[warmup:]))
        jobs, moved = mp.last_step_bytes["jobs"], mp.last_step_bytes["moved"]
    finally:
        mp.close()
    pred = C.predict("model_parallel", net, sc, batch, blocks=K, paired=pair,
                     layer_sizes=[n_in, width, width, 10])
    single_s = float(np.median(one[warmup:]))
    return {"one_process_step_s": single_s, "step_s": step_s, "speedup": single_s / step_s,
            "block_compute_s": float(np.median(comp[warmup:])), "jobs_per_step": jobs,
            "mib_moved_per_step": moved / 2**20, **pred}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--in-features", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--series", nargs="+", default=list(SERIES), choices=list(SERIES))
    args = ap.parse_args(argv)
    title = (f"blocked FC {args.in_features}-W-W-10 (model parallel): speedup vs model size "
             f"(SYNTHETIC data)")
    print(C.header(title), flush=True)
    print(f"data: {DATA}; batch {args.batch}, {args.warmup} + {args.steps} steps per cell; "
          f"{C.cost_note()}", flush=True)
    rows: list[dict] = []
    for kind in dict.fromkeys(SERIES[s][0] for s in args.series):
        with C.session(kind, driver_memory="2g") as spark:
            sc, _ = C.measure_costs(spark, C.fc_model(), 128, steps=2)
            for name in (s for s in args.series if SERIES[s][0] == kind):
                _, K, pair = SERIES[name]
                for w in args.widths:
                    blocked = args.in_features * w + w * w + 2 * w
                    r = cell(spark, sc, args.in_features, w, args.batch, K, pair, args.steps,
                             args.warmup)
                    row = {"figure": NAME, "series": name, "blocked_params": blocked, "width": w,
                           "in_features": args.in_features, "K": K, "paired": pair, "data": DATA,
                           "batch": args.batch, "steps_timed": args.steps, "epoch_s": r["step_s"],
                           **r, "load1": C.load1(), "sgemm_gflops": C.sgemm()}
                    rows.append(row)
                    print(f"{name} width {w} ({blocked / 1e6:.1f}M blocked): "
                          f"one process {r['one_process_step_s']:.3f} s, "
                          f"K={K} {r['step_s']:.3f} s/step: {r['speedup']:.2f}x; "
                          f"predicted {r['pred_step_s']:.3f} s ({r['pred_speedup']:.2f}x) "
                          f"[{r['pred_breakdown']}]; {r['jobs_per_step']} jobs, "
                          f"{r['mib_moved_per_step']:.1f} MiB/step (load {C.load1():.1f})",
                          flush=True)
                    gc.collect()
    C.write_csv(NAME, rows)
    C.plot_speedup(NAME, rows, "blocked_params",
                   "blocked FC layers, model parallel: speedup vs model size (SYNTHETIC data)",
                   "blocked parameters", logx=True, note=f"synthetic data, batch {args.batch}")
    print(f"{'series':<24}{'params':>10}{'step s':>9}{'speedup':>9}{'pred step s':>13}"
          f"{'pred speedup':>14}{'load':>6}")
    for r in rows:
        print(f"{r['series']:<24}{r['blocked_params'] / 1e6:>9.1f}M{r['step_s']:>9.3f}"
              f"{r['speedup']:>8.2f}x{r['pred_step_s']:>13.3f}{r['pred_speedup']:>13.2f}x"
              f"{r['load1']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

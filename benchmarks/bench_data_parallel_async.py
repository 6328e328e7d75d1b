"""Synchronous vs asynchronous (Downpour) data-parallel rounds on Spark ``local[2]``,
MNIST MLP, with equal partitions and with one straggler.

Defaults: MLP 784-2048-1024-10 (``--hidden``), RMSprop lr 5e-4, batch 128, at most 117
local steps per round (a shard's pass in 3 rounds), 4 epochs, the trainer's async
defaults (``coalesce=0.15``, staleness bound 4, delta weight 1/2); an untimed one-epoch
fit of each mode first starts the Python workers.

Both modes train the same model from the same initial weights with the same optimizer,
local steps (``tau``) and minibatch size, on the same two resident shards, for the same
budget of samples (``--epochs`` passes over the 60,000 training images), validating on
the 10,000 test images after every epoch (on the executors, inside the timed fit).

The straggler is partition 1 slowed to half speed by an injected delay: after each of
its training rounds it sleeps as long as that round computed
(:func:`sparknet.cluster.testing.inject_faults` with ``slow={1: 1.0}``), as a busy or
older machine would be.  The same injection applies to the synchronous rounds.

Reported per run: the fit's time to the target test accuracy (``--target``, 97%),
interpolated linearly between the two epoch ends around the crossing (the epoch times
are the trainer's own, including validation), the final test accuracy, the median
epoch time (throughput, less noisy than a single crossing), and for async the
distribution of the staleness of the applied deltas.  Ratios are sync time / async
time (> 1: async sooner).  Runs alternate between the modes to spread the noise of a
shared machine.

    python benchmarks/bench_data_parallel_async.py --mnist ../shared/data/mnist

The benchmark builds its own SparkSession (``local[2]``); the executors' BLAS is limited
to one thread per task by the trainer, the driver's to one thread here.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_model(hidden, seed=0):
    from sparknet import Dense, Sequential

    layers = [Dense(h, activation="relu") for h in hidden] + [Dense(10, activation="softmax")]
    return Sequential(layers, input_shape=(784,), seed=seed)


def time_to_target(times, accs, target):
    """Seconds (cumulative epoch times) at which the accuracy first reaches ``target``,
    interpolated linearly between epoch ends; ``None`` if never reached."""
    t_prev, a_prev = 0.0, None
    t = 0.0
    for dt, a in zip(times, accs):
        t += dt
        if a >= target:
            if a_prev is None or a_prev >= a:
                return t
            frac = (target - a_prev) / (a - a_prev)
            return t_prev + frac * (t - t_prev)
        t_prev, a_prev = t, a
    return None


def run(spark, mode, data, args, straggler):
    from sparknet import RMSprop
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.testing import inject_faults

    X, y, Xt, yt = data
    model = build_model(args.hidden)
    kw = {}
    if mode == "async":
        kw = {"max_staleness": args.max_staleness, "stale": args.stale,
              "delta_weight": args.delta_weight}
        if args.coalesce is not None:
            kw["coalesce"] = args.coalesce
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode=mode, sync="average",
                                  local_steps=args.tau, optimizer=RMSprop(lr=args.lr), **kw)
    slow = {1: 1.0} if straggler else {}
    t0 = time.perf_counter()
    with inject_faults(slow=slow):
        _, h = trainer.fit(X, y, epochs=args.epochs, batch_size=args.batch,
                           validation_data=(Xt, yt), verbose=0)
    wall = time.perf_counter() - t0
    out = {
        "mode": mode, "straggler": straggler, "wall": wall, "epoch_times": h["time"],
        "val_accuracy": h["val_accuracy"], "final": h["val_accuracy"][-1],
        "ttt": time_to_target(h["time"], h["val_accuracy"], args.target),
        "overhead": float(np.mean(h["spark_overhead"])),
        "t_fixed": trainer.cost.t_fixed, "t_step": trainer.cost.t_step,
    }
    if mode == "async":
        st = [u["staleness"] for u in h.updates if u["applied"]]
        out["staleness"] = dict(sorted(collections.Counter(st).items()))
        out["rejected"] = int(sum(h["rejected"]))
        out["rounds_by_partition"] = dict(sorted(collections.Counter(u["partition"]
                                                                     for u in h.updates).items()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                    "data", "mnist"))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--hidden", type=int, nargs="+", default=[2048, 1024])
    ap.add_argument("--tau", type=int, default=117,
                    help="local steps per round at most, both modes (117: a shard's pass of 235 "
                         "minibatches in 3 rounds; the best of 78, 117 and 235 measured, see "
                         "benchmarks/README.md)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-4,
                    help="RMSprop learning rate, both modes (5e-4: at 1e-3 a single epoch's test "
                         "accuracy jumps by +-0.5 points, more than async and sync differ)")
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--max-staleness", type=int, default=None)
    ap.add_argument("--stale", default="reject", choices=["reject", "downweight"],
                    help="what async does with a delta past --max-staleness")
    ap.add_argument("--delta-weight", type=float, default=None,
                    help="weight of an on-time async delta (default 1 / partitions)")
    ap.add_argument("--coalesce", type=float, default=None,
                    help="async: a relaunch waits for another partition's round due within this "
                         "fraction of a round (default: the trainer's, 0.15; 0: never)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the untimed one-epoch fit of each mode before the timed runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenarios", nargs="+", default=["equal", "straggler"])
    ap.add_argument("--json", default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)

    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    from sparknet.cluster.engine.session import get_spark
    from sparknet.datasets import load_mnist

    data = load_mnist(args.mnist)
    spark = get_spark("local[2]", app_name="bench-async",
                      conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                            "spark.driver.memory": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"MNIST {data[0].shape[0]} train / {data[2].shape[0]} test, MLP "
          f"784-{'-'.join(map(str, args.hidden))}-10, RMSprop lr={args.lr}, batch {args.batch}, "
          f"tau {args.tau}, {args.epochs} epochs, local[2]; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')}", flush=True)
    if args.warmup:  # start the Python workers and fill the caches, untimed
        warm = argparse.Namespace(**{**vars(args), "epochs": 1})
        for mode in ("sync", "async"):
            run(spark, mode, data, warm, straggler=False)
    results = []
    for rep in range(args.repeats):
        for scen in args.scenarios:
            modes = ("sync", "async") if rep % 2 == 0 else ("async", "sync")
            for mode in modes:
                r = run(spark, mode, data, args, straggler=(scen == "straggler"))
                r["scenario"], r["repeat"] = scen, rep
                results.append(r)
                ttt = "never" if r["ttt"] is None else f"{r['ttt']:.1f}s"
                extra = (f", staleness {r['staleness']}, rejected {r['rejected']}, rounds by "
                         f"partition {r['rounds_by_partition']}" if mode == "async" else "")
                print(f"[{scen} rep {rep}] {mode:5s}: wall {r['wall']:.1f}s, epochs "
                      f"{[round(t, 1) for t in r['epoch_times']]}, val "
                      f"{[round(a, 4) for a in r['val_accuracy']]}, to {args.target:.0%}: {ttt}, "
                      f"Spark share {r['overhead']:.0%} (probe: fixed {1e3 * r['t_fixed']:.0f} ms, "
                      f"step {1e3 * r['t_step']:.1f} ms){extra}", flush=True)

    print()
    print(f"| scenario | mode | time to {args.target:.0%} (s) | final test acc | epoch (s) | fit "
          f"wall (s) | sync/async time to target | sync/async epoch time |")
    print("|---|---|---|---|---|---|---|---|")
    for scen in args.scenarios:
        med, ep = {}, {}
        for mode in ("sync", "async"):
            rs = [r for r in results if r["scenario"] == scen and r["mode"] == mode]
            tt = [r["ttt"] for r in rs]
            med[mode] = float(np.median(tt)) if all(t is not None for t in tt) else None
            acc = float(np.median([r["final"] for r in rs]))
            wall = float(np.median([r["wall"] for r in rs]))
            ep[mode] = float(np.median([t for r in rs for t in r["epoch_times"]]))
            ratio = eratio = ""
            if mode == "async" and med["sync"] is not None and med["async"] is not None:
                ratio = f"{med['sync'] / med['async']:.2f}x"
            if mode == "async":
                eratio = f"{ep['sync'] / ep['async']:.2f}x"
            ttt = "not reached" if med[mode] is None else f"{med[mode]:.1f}"
            print(f"| {scen} | {mode} | {ttt} | {acc:.4f} | {ep[mode]:.1f} | {wall:.1f} | {ratio} "
                  f"| {eratio} |")
    print("paired ratios (sync / async, same repeat, runs back to back):")
    for scen in args.scenarios:
        pairs = []
        for rep in sorted({r["repeat"] for r in results}):
            rr = {r["mode"]: r for r in results if r["scenario"] == scen and r["repeat"] == rep}
            if "sync" in rr and "async" in rr and rr["sync"]["ttt"] and rr["async"]["ttt"]:
                pairs.append(rr["sync"]["ttt"] / rr["async"]["ttt"])
        if pairs:
            print(f"  {scen}: time to target " + ", ".join(f"{x:.2f}x" for x in pairs) +
                  f" (median {np.median(pairs):.2f}x, min {min(pairs):.2f}x)")
    st = collections.Counter()
    for r in results:
        for k, v in r.get("staleness", {}).items():
            st[(r["scenario"], k)] += v
    for scen in args.scenarios:
        d = {k: v for (s, k), v in sorted(st.items()) if s == scen}
        n = sum(d.values())
        print(f"staleness of applied deltas ({scen}): " +
              ", ".join(f"{k}: {v} ({v / n:.0%})" for k, v in d.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    spark.stop()


if __name__ == "__main__":
    main()

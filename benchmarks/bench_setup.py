"""Where ``DataParallelTrainer.fit`` spends its set-up: from the call of ``fit`` to the
first training round.

The issue-16 task: MNIST (60,000 x 784, an ML ``Vector`` column + a double label,
cached and materialised before the fit; the 10,000 test rows as validation data,
likewise), the MLP 784-512-256-10, RMSprop 1e-3, batch 128, one epoch per fit.  In one
Spark session (``local[2]``, or ``--standalone``: a standalone cluster of 2 workers x 1
core on 127.0.0.1 started by ``tests/helpers/standalone_cluster.py``):

1. the first fit of the session (``--no-warm-up``: the Python workers not started yet;
   default: started in the background by ``get_spark``, while the DataFrames are built);
2. a second fit on the same DataFrames (resident shards reusable);
3. a fit on a changed DataFrame (different rows: the shards must be rebuilt).

Printed: the CPU model, the one-thread sgemm rate, and per fit ``history.setup_time``
with its phases (``history.setup_breakdown``, recorded by the trainer with
``time.perf_counter``).  With a trainer that records no breakdown (an older sparknet),
the script times coarse phases itself by wrapping the trainer's steps, so figures from
before and after a change can be compared.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_setup.py [--standalone] [--repeats 3]

``--repeats`` runs the three fits that many times, each time in a new session (a new
session is the only way to get a "first fit" again); the table gives the median.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))


def load(mnist_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sparknet.datasets import load_mnist
    X, y, Xt, yt = load_mnist(mnist_dir)
    mean, std = float(X.mean()), float(X.std())
    return (((X - mean) / std).astype(np.float32), y, ((Xt - mean) / std).astype(np.float32), yt)


def to_df(spark: Any, X: np.ndarray, y: np.ndarray, partitions: int) -> Any:
    """A cached, materialised DataFrame (features: ML Vector, label: double)."""
    import pyarrow as pa
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    flat = pa.array(X.reshape(X.shape[0], -1).reshape(-1).astype(np.float64))
    width = int(np.prod(X.shape[1:]))
    feats = pa.FixedSizeListArray.from_arrays(flat, width).cast(pa.list_(pa.float64()))
    table = pa.table({"f": feats, "label": pa.array(y.astype(np.float64))})
    df = spark.createDataFrame(table)
    df = df.select(array_to_vector(F.col("f")).alias("features"),
                   "label").repartition(partitions).cache()
    df.count()
    return df


def make_model(seed: int = 0) -> Any:
    from sparknet import Dense, Sequential
    return Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(784,), seed=seed)


class _Phases:
    """Coarse phases timed from outside, for trainers that record no breakdown."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self._undo: list = []

    def wrap(self, owner: Any, name: str, label: Any) -> None:
        orig = getattr(owner, name, None)
        if orig is None:  # a sparknet without this step (it records its own breakdown)
            return
        phases = self

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                key = label(*a, **kw) if callable(label) else label
                phases.t[key] += time.perf_counter() - t0
        setattr(owner, name, timed)
        self._undo.append((owner, name, orig))

    def __enter__(self) -> "_Phases":
        from sparknet.cluster.data_parallel import fit_context as fit
        from sparknet.cluster.data_parallel import trainer as data_parallel
        from sparknet.cluster.resident import driver as resident
        self.wrap(resident.Resident, "_materialise", "shard jobs (incl. worker start)")
        self.wrap(data_parallel.DataParallelTrainer, "_load",
                  lambda self_, d, y, cols, cls, n, what, *rest: f"load {what} (total)")
        self.wrap(fit.FitContext, "calibrate", "calibration")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)


def one_fit(spark: Any, df: Any, dft: Any, args: argparse.Namespace) -> dict[str, Any]:
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer

    model = make_model(args.seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average",
                                  optimizer=RMSprop(lr=1e-3))
    sc = spark.sparkContext
    jobs0 = len(sc.statusTracker().getJobIdsForGroup())
    with _Phases() as ph:
        t0 = time.perf_counter()
        _, h = trainer.fit(df, epochs=1, batch_size=128, validation_data=dft, verbose=0)
        total = time.perf_counter() - t0
    breakdown = dict(getattr(h, "setup_breakdown", {}) or {})
    recorded = bool(breakdown)
    if not recorded:
        breakdown = dict(ph.t)
        shard = breakdown.get("shard jobs (incl. worker start)", 0.0)
        loads = sum(v for k, v in breakdown.items() if k.startswith("load "))
        breakdown["load: rest (plan, checks)"] = loads - shard
        for k in [k for k in breakdown if k.startswith("load ")]:
            del breakdown[k]
        breakdown["other"] = h.setup_time - sum(breakdown.values())
    return {"setup": h.setup_time, "breakdown": breakdown, "recorded": recorded, "fit_total": total,
            "epoch_time": h["time"][0], "val_accuracy": h["val_accuracy"][0],
            "jobs": len(sc.statusTracker().getJobIdsForGroup()) - jobs0,
            "reused": getattr(h, "reused_shards", None)}


def session(master: str, warm_up: bool) -> tuple[Any, Any]:
    """The session, and the thread starting its Python workers (None without warm-up or
    with a sparknet whose get_spark has none)."""
    from sparknet.cluster.engine import session as session_mod
    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "6g", "spark.executor.memory": "2g",
            "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "2"}
    if hasattr(session_mod, "start_python_workers"):
        spark = session_mod.get_spark(master, app_name="sparknet-bench-setup", conf=conf,
                                      warm_up=False)
        thread = session_mod.start_python_workers(spark) if warm_up else None
    else:
        spark, thread = session_mod.get_spark(master, app_name="sparknet-bench-setup",
                                              conf=conf), None
    spark.sparkContext.setLogLevel("ERROR")
    return spark, thread


def run_session(master: str, data: tuple, args: argparse.Namespace) -> dict[str, Any]:
    X, y, Xt, yt = data
    spark, warm = session(master, not args.no_warm_up)
    try:
        df, dft = to_df(spark, X, y, 2), to_df(spark, Xt, yt, 2)
        changed = to_df(spark, X[::-1].copy(), y[::-1].copy(), 2)  # the same rows in another order
        warmed = None if warm is None else not warm.is_alive()
        out = {"first": one_fit(spark, df, dft, args), "second": one_fit(spark, df, dft, args),
               "changed": one_fit(spark, changed, dft, args), "warm_up_done": warmed}
        for d in (df, dft, changed):
            d.unpersist()
        return out
    finally:
        spark.stop()


def report(runs: list[dict[str, Any]], header: str) -> None:
    print(header)
    for which in ("first", "second", "changed"):
        fits = [r[which] for r in runs]
        setups = [f["setup"] for f in fits]
        print(f"\n{which} fit: set-up median {np.median(setups):.2f} s (runs: "
              f"{', '.join(f'{s:.2f}' for s in setups)}), epoch "
              f"{np.median([f['epoch_time'] for f in fits]):.2f} s, val acc "
              f"{np.median([f['val_accuracy'] for f in fits]):.4f}, jobs {fits[0]['jobs']}, reused "
              f"{fits[0]['reused']}, phases "
              f"{'recorded' if fits[0]['recorded'] else 'timed from outside'}")
        names: list[str] = []
        for f in fits:
            names += [k for k in f["breakdown"] if k not in names]
        print(f"  {'phase':<44}{'median s':>10}")
        for k in names:
            print(f"  {k:<44}{np.median([f['breakdown'].get(k, 0.0) for f in fits]):>10.3f}")
        total = np.median([sum(f["breakdown"].values()) for f in fits])
        print(f"  {'sum of phases':<44}{total:>10.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=DEFAULT_MNIST)
    ap.add_argument("--standalone", action="store_true",
                    help="standalone 2 x 1-core cluster on 127.0.0.1")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-warm-up", action="store_true",
                    help="do not start the Python workers when the session starts (cold first fit)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    # benchmarks/_machine.py, next to this script
    from _machine import cpu_model, machine_header, sgemm_gflops
    print(machine_header(), flush=True)
    data = load(args.mnist)
    load_avg = os.getloadavg()
    header = (f"CPU: {cpu_model()}, {os.cpu_count()} cores; one-thread sgemm "
              f"{sgemm_gflops()[0]:.0f} GFLOP/s; load average at start {load_avg[0]:.1f}; master "
              f"{'standalone 2 x 1 core' if args.standalone else 'local[2]'}; "
              f"{'no warm-up' if args.no_warm_up else 'Python workers started with the session'}")
    runs = []
    for _ in range(args.repeats):
        if args.standalone:
            from helpers.standalone_cluster import StandaloneCluster
            with StandaloneCluster(workers=2, cores=1, memory="3g") as cl:
                runs.append(run_session(cl.url, data, args))
        else:
            runs.append(run_session("local[2]", data, args))
    header += f" (finished before the first fit: {[r['warm_up_done'] for r in runs]})"
    report(runs, header)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"header": header, "runs": runs}, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())

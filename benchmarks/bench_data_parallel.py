"""Data-parallel training on Spark against one process and against Spark MLlib.

Real MNIST (60,000 train / 10,000 test, pixels scaled to [0, 1] then standardised with
the training set's mean and standard deviation over all pixels), the MLP 784-512-256-10
(ReLU, softmax), RMSprop, minibatch ``--batch-size``, same seed everywhere:

(a) single process, one BLAS thread: ``Sequential.fit``;
(b) Spark ``local[1]``, 1 partition: :class:`~sparknet.cluster.DataParallelTrainer`
    (``sync="average"``, tau sized by the trainer);
(c) Spark ``local[2]``, 2 partitions: the same trainer;
(d) Spark MLlib ``MultilayerPerceptronClassifier([784, 512, 256, 10])`` (L-BFGS,
    ``--mllib-iters`` iterations) on the same DataFrame as (c).

(b) and (c) read the training set from a DataFrame with an ML ``Vector`` column (built
once through Arrow), the test set likewise; they validate on the test set after every
epoch on the executors.  Reported per run: the mean training-epoch time (validation
excluded, for every run), the test accuracy after every epoch, the final test accuracy,
the Spark share of the rounds (``spark_overhead``) and the fit's set-up time (loading
the data onto the executors, checks, calibration).  Ratios:

* (a)/(c) epoch time, and the accuracies it is taken at;
* time to MLlib's final test accuracy: MLlib's fit time against (c)'s set-up plus the
  training epochs until its test accuracy first reaches MLlib's.

``--primitives`` also measures a round's broadcast + gather of a parameter-sized vector
with ``treeAggregate`` and with a numpy ``AccumulatorParam`` in ``local[2]``.

``--async`` runs the synchronous against the asynchronous rounds instead (equal
partitions and one straggler, time to 97% test accuracy): it hands the remaining
arguments to ``bench_data_parallel_async.py`` (see its ``--help``).

    python benchmarks/bench_data_parallel.py --mnist ../shared/data/mnist

The env of this machine sets ``OPENBLAS_CORETYPE=Haswell`` and ``OPENBLAS_L2_SIZE``,
which slow OpenBLAS on its AVX-512 CPU; run with ``env -u OPENBLAS_CORETYPE -u
OPENBLAS_L2_SIZE`` to measure without them (the output says which).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))


def load(mnist_dir: str):
    from sparknet.datasets import load_mnist
    X, y, Xt, yt = load_mnist(mnist_dir)
    mean, std = float(X.mean()), float(X.std())  # one mean and deviation for all pixels
    X = ((X - mean) / std).astype(np.float32)
    Xt = ((Xt - mean) / std).astype(np.float32)
    return X, y, Xt, yt


def make_model(seed: int):
    from sparknet import Dense, Sequential
    return Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(784,), seed=seed)


def session(master: str):
    from sparknet.cluster.engine.session import get_spark
    spark = get_spark(master, app_name=f"sparknet-bench-{master}",
                      conf={"spark.ui.enabled": "false", "spark.driver.memory": "6g",
                            "spark.ui.showConsoleProgress": "false",
                            "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def to_df(spark, X, y, partitions: int):
    """A DataFrame (features: ML Vector, label: double) built through Arrow."""
    import pyarrow as pa
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    flat = pa.array(X.reshape(-1).astype(np.float64))
    feats = pa.FixedSizeListArray.from_arrays(flat, X.shape[1]).cast(pa.list_(pa.float64()))
    table = pa.table({"f": feats, "label": pa.array(y.astype(np.float64))})
    df = spark.createDataFrame(table)
    df = df.select(array_to_vector(F.col("f")).alias("features"), "label").repartition(partitions)
    return df.cache()


def run_single(X, y, Xt, yt, args):
    from threadpoolctl import threadpool_limits

    from sparknet import RMSprop
    model = make_model(args.seed)
    opt = RMSprop(lr=args.lr)
    times, accs = [], []
    with threadpool_limits(1):
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            model.fit(X, y, epochs=1, batch_size=args.batch_size, optimizer=opt, verbose=0)
            times.append(time.perf_counter() - t0)
            accs.append(model.evaluate(Xt, yt)["accuracy"])
            logging.info("single process: epoch %d %.2f s, test accuracy %.4f", len(times),
                         times[-1], accs[-1])
    return {"epoch_times": times, "accs": accs, "setup": 0.0}


def run_spark(spark, df, dft, partitions: int, args):
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer
    model = make_model(args.seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=partitions, sync="average",
                                  optimizer=RMSprop(lr=args.lr), local_steps=args.local_steps,
                                  max_overhead=args.max_overhead)
    t0 = time.perf_counter()
    _, h = trainer.fit(df, epochs=args.epochs, batch_size=args.batch_size, validation_data=dft,
                       verbose=0)
    total = time.perf_counter() - t0
    # a round of several epochs validates only at its end (val_time NaN on the others)
    times = [t - (0.0 if np.isnan(v) else v) for t, v in zip(h["time"], h["val_time"])]
    return {"epoch_times": times, "accs": h["val_accuracy"], "setup": h.setup_time, "total": total,
            "overhead": h["spark_overhead"], "rounds": h["rounds"], "local_steps": h["local_steps"],
            "t_fixed": trainer.cost.t_fixed, "t_step": trainer.cost.t_step}


def run_mllib(spark, df, dft, args):
    from pyspark.ml.classification import MultilayerPerceptronClassifier
    mlp = MultilayerPerceptronClassifier(layers=[784, 512, 256, 10], maxIter=args.mllib_iters,
                                         blockSize=128, seed=args.seed)
    t0 = time.perf_counter()
    fitted = mlp.fit(df)
    fit_time = time.perf_counter() - t0
    pred = fitted.transform(dft).select("label", "prediction").toPandas()
    acc = float((pred["label"] == pred["prediction"]).mean())
    return {"time": fit_time, "acc": acc, "iters": args.mllib_iters}


def primitives(spark, n_params: int):
    from sparknet.cluster.data_parallel.parameter_server import measure_primitives
    return measure_primitives(spark.sparkContext, n_params, 2, repeats=9)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--async" in argv:   # sync vs async rounds: bench_data_parallel_async.py
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_data_parallel_async
        bench_data_parallel_async.main([a for a in argv if a != "--async"])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=DEFAULT_MNIST, help="folder of the MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--local-steps", default="auto", help="tau for (b) and (c): 'auto' or an int")
    ap.add_argument("--max-overhead", type=float, default=0.1,
                    help="target Spark share of a round for local_steps='auto' (trainer default "
                         "0.1)")
    ap.add_argument("--mllib-iters", type=int, default=20, help="L-BFGS iterations of MLlib (d)")
    ap.add_argument("--skip", default="", help="comma list of runs to skip: a,b,c,d")
    ap.add_argument("--primitives", action="store_true",
                    help="also time treeAggregate vs accumulator")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--report", help="only print the table of a results file written by --json")
    ap.add_argument("--async", action="store_true",
                    help="sync vs async rounds instead (the other arguments go to "
                         "bench_data_parallel_async.py)")
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    if args.report:
        with open(args.report) as fh:
            report(json.load(fh))
        return 0
    if args.local_steps != "auto":
        args.local_steps = int(args.local_steps)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not os.path.isdir(args.mnist):
        print(f"MNIST not found at {args.mnist}; pass --mnist DIR", file=sys.stderr)
        return 2
    skip = set(filter(None, args.skip.split(",")))
    blas_env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    X, y, Xt, yt = load(args.mnist)
    res: dict = {"args": vars(args), "blas_env": blas_env}
    if "a" not in skip:
        res["a"] = run_single(X, y, Xt, yt, args)
    if "b" not in skip:
        spark = session("local[1]")
        df, dft = to_df(spark, X, y, 1), to_df(spark, Xt, yt, 1)
        res["b"] = run_spark(spark, df, dft, 1, args)
        spark.stop()
    if not {"c", "d"} <= skip or args.primitives:
        spark = session("local[2]")
        df, dft = to_df(spark, X, y, 2), to_df(spark, Xt, yt, 2)
        df.count(), dft.count()
        if args.primitives:
            res["primitives"] = primitives(spark, make_model(0).n_params)
        if "c" not in skip:
            res["c"] = run_spark(spark, df, dft, 2, args)
        if "d" not in skip:
            res["d"] = run_mllib(spark, df, dft, args)
        spark.stop()
    report(res)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1, default=float)
    return 0


def report(res: dict) -> None:
    print()
    print(f"OpenBLAS env: {res['blas_env']}")
    print("epoch s: median training-epoch time (validation excluded); the machine is shared, so "
          "per-epoch times are listed too")
    print(f"{'run':<34}{'epoch s':>9}{'final acc':>11}{'setup s':>9}{'Spark share':>13}")
    names = {"a": "(a) single process, 1 thread", "b": "(b) Spark local[1], 1 partition",
             "c": "(c) Spark local[2], 2 partitions"}
    for k in "abc":
        if k in res:
            r = res[k]
            share = f"{np.mean(r['overhead']):.3f}" if "overhead" in r else "-"
            print(f"{names[k]:<34}{np.median(r['epoch_times']):>9.2f}{r['accs'][-1]:>11.4f}"
                  f"{r['setup']:>9.1f}{share:>13}")
            print(f"{'':<6}test accuracy per epoch: {' '.join(f'{a:.4f}' for a in r['accs'])}")
            print(f"{'':<6}epoch times (s):         "
                  f"{' '.join(f'{t:.2f}' for t in r['epoch_times'])}")
            if "rounds" in r:
                print(f"{'':<6}median rounds/epoch {np.median(r['rounds']):.2g}, local steps/round "
                      f"{np.median(r['local_steps']):.0f}, "
                      f"measured T_fixed {1e3 * r['t_fixed']:.0f} ms, T_step "
                      f"{1e3 * r['t_step']:.2f} ms")
    if "d" in res:
        d = res["d"]
        print(f"{'(d) MLlib MLP, ' + str(d['iters']) + ' L-BFGS iters':<34}{'':>9}{d['acc']:>11.4f}"
              f"   fit {d['time']:.1f} s")
    if "a" in res and "c" in res:
        a, c = res["a"], res["c"]
        print("(a)/(c) epoch time: "
              f"{np.median(a['epoch_times']) / np.median(c['epoch_times']):.2f}x (final test "
              f"accuracy {a['accs'][-1]:.4f} vs {c['accs'][-1]:.4f})")
    if "a" in res and "b" in res:
        print("(a)/(b) epoch time: "
              f"{np.median(res['a']['epoch_times']) / np.median(res['b']['epoch_times']):.2f}x")
    if "c" in res and "d" in res:
        c, d = res["c"], res["d"]
        cum = c["setup"]
        reached = None
        for t, acc in zip(c["epoch_times"], c["accs"]):
            cum += t
            if acc >= d["acc"]:
                reached = cum
                break
        if reached is None:
            print(f"(c) never reached MLlib's {d['acc']:.4f}")
        else:
            print(f"time to MLlib's final accuracy {d['acc']:.4f}: MLlib {d['time']:.1f} s, "
                  f"(c) {reached:.1f} s (set-up {c['setup']:.1f} s included): "
                  f"{d['time'] / reached:.1f}x")
    if "primitives" in res:
        p = res["primitives"]
        print(f"round of broadcast + gather of the {make_model(0).n_params}-parameter vector, "
              f"local[2], median: treeAggregate {1e3 * p['tree']:.0f} ms, accumulator "
              f"{1e3 * p['accumulator']:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())

"""Time to accuracy on Spark: one process against data-parallel sparknet and TorchDistributor.

The task (issue 16): MNIST (60,000 train / 10,000 test, pixels scaled to [0, 1] by
:func:`sparknet.datasets.load_mnist`), the MLP 784-512-256-10 (ReLU, softmax), RMSprop
lr 1e-3, minibatches of 128 rows, the same seed everywhere, test accuracy after every
epoch.  The runs (``--runs`` picks a subset):

``single``       ``Sequential.fit``, one process, one BLAS thread;
``df-plain``     :class:`~sparknet.cluster.DataParallelTrainer` on ``--master`` (local[2]),
                 2 partitions, DataFrame input (ML Vector column), ``sync="average"``,
                 plain averaging (``outer=None``);
``df-outer``     the same with the outer optimizer
                 (:mod:`sparknet.cluster.data_parallel.outer_optimizer`; ``OuterOptimizer()``, sized
                 from the partitions, unless ``--outer-momentum`` / ``--outer-lr`` are given);
``np-plain``,    the same two on numpy input;
``np-outer``
``async``        ``mode="async"`` on the DataFrame;
``estimator``    ``SparkNetClassifier.fit`` on the DataFrame (its default trainer);
``torch``        ``TorchDistributor`` (2 DDP processes, gloo, one thread each, local
                 mode), ``torch.optim.RMSprop`` lr 1e-3, 128 rows per process and step.

bfloat16 (issue 33): ``single-bf16``, ``df-plain-bf16``, ``df-outer-bf16``, ``np-outer-bf16``,
``async-bf16`` and ``estimator-bf16`` are the same runs with ``precision="bf16"`` (the matrix
products on bfloat16 operands, float32 sums; :mod:`sparknet.precision`); ``df-outer-wire`` and
``df-outer-bf16-wire`` send the rounds' deltas as bfloat16 (``wire="bf16"``, half the bytes;
:mod:`sparknet.cluster.data_parallel.wire`) with float32 and bf16 products.  Each bf16 run is
also given as a ratio against its float32 twin (the name without ``-bf16``/``-wire``).

Everything is in memory before a clock starts: the numpy arrays, the DataFrames
(cached and counted), and for torch the arrays as ``.npy`` files in the page cache
(memory-mapped by the DDP processes).  The Spark runs validate on the test set on the
executors after every epoch (the Estimator takes no validation data, so the benchmark
hands the test DataFrame to the trainer it builds: :func:`_validating`); torch's rank 0
evaluates after every epoch.  Evaluation time is never counted.

Per run: **set-up** (Spark: ``history.setup_time``, the call of ``fit`` to the first
round; the Estimator: its whole ``fit`` minus its epochs; torch: the call of ``run`` to
the first step, process launch and DDP initialisation), the **median epoch** (training
only), the **test accuracy after each epoch**, and **time to 97.5 % / 98 %**: set-up
plus the training epochs until the test accuracy first reaches it.  Medians over
``--repeats`` (default 3); the runs alternate order (forwards, backwards, ...) in one
process and one Spark session.  Printed as tables and as ratios against one process and
against TorchDistributor; ``--json PATH`` writes every figure.

    python benchmarks/bench_time_to_accuracy.py                  # the full run
    python benchmarks/bench_time_to_accuracy.py --epochs 3 --repeats 1 --runs single,np-outer

The header gives the CPU model, cache sizes, the measured one-thread sgemm rate and
the load average, so figures from different machines can be told apart.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))
RUNS = ("single", "df-plain", "df-outer", "np-plain", "np-outer", "async", "estimator", "torch",
        "single-bf16", "df-plain-bf16", "df-outer-bf16", "np-outer-bf16", "async-bf16",
        "estimator-bf16", "df-outer-wire", "df-outer-bf16-wire")
TARGETS = (0.975, 0.98)
PARTITIONS = 2


# --------------------------------------------------------------------------- the machine
def machine() -> dict[str, Any]:
    from _machine import cache_sizes, cpu_model, sgemm_gflops  # benchmarks/_machine.py

    return {"cpu": cpu_model(), "caches": ", ".join(f"{k} {v}" for k, v in cache_sizes().items()),
            "cores": os.cpu_count(), "sgemm_gflops_1thread": sgemm_gflops()[0],
            "load_average": os.getloadavg(),
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}}


# --------------------------------------------------------------------------- data and model
def make_model(seed: int) -> Any:
    from sparknet import Dense, Sequential
    return Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(784,), seed=seed)


def to_df(spark: Any, X: np.ndarray, y: np.ndarray, partitions: int) -> Any:
    """A cached, counted DataFrame (features: ML Vector, label: double) built through Arrow."""
    import pyarrow as pa
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    flat = pa.array(X.reshape(-1).astype(np.float64))
    feats = pa.FixedSizeListArray.from_arrays(flat, X.shape[1]).cast(pa.list_(pa.float64()))
    df = spark.createDataFrame(pa.table({"f": feats, "label": pa.array(y.astype(np.float64))}))
    df = df.select(array_to_vector(F.col("f")).alias("features"),
                   "label").repartition(partitions).cache()
    df.count()
    return df


def session(master: str) -> Any:
    from sparknet.cluster.engine.session import get_spark
    spark = get_spark(master, app_name="sparknet-bench-time-to-accuracy",
                      conf={"spark.ui.enabled": "false", "spark.driver.memory": "6g",
                            "spark.ui.showConsoleProgress": "false",
                            "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# --------------------------------------------------------------------------- the runs
def run_single(d: dict[str, Any], args: argparse.Namespace,
               precision: str = "fp32") -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from sparknet import RMSprop
    model, opt = make_model(args.seed), RMSprop(lr=args.lr)
    times, accs = [], []
    with threadpool_limits(1):
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            model.fit(d["X"], d["y"], epochs=1, batch_size=args.batch_size, optimizer=opt,
                      verbose=0, precision=precision)
            times.append(time.perf_counter() - t0)
            accs.append(float(model.evaluate(d["Xt"], d["yt"])["accuracy"]))
    return {"setup": 0.0, "epoch_times": times, "accs": accs}


def _from_history(h: Any, setup: float) -> dict[str, Any]:
    """Set-up, training-only epoch times and test accuracies of a trainer's history (a
    round of several epochs validates at its end only: NaN ``val_time`` elsewhere)."""
    times = [float(t) - (0.0 if math.isnan(v) else float(v))
             for t, v in zip(h["time"], h["val_time"])]
    out = {"setup": setup, "epoch_times": times, "accs": [float(a) for a in h["val_accuracy"]],
           "setup_breakdown": dict(getattr(h, "setup_breakdown", {}) or {})}
    for k in ("rounds", "local_steps", "spark_overhead"):
        if k in h.history:
            out[k] = [float(v) for v in h[k]]
    return out


def run_trainer(d: dict[str, Any], args: argparse.Namespace, *, source: str, outer: bool,
                mode: str = "sync", precision: str = "fp32", wire: str = "fp32") -> dict[str, Any]:
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer
    from sparknet.cluster.data_parallel.outer_optimizer import OuterOptimizer
    model = make_model(args.seed)
    kw: dict[str, Any] = {"mode": mode}
    if mode == "sync":
        kw["outer"] = OuterOptimizer(momentum=args.outer_momentum,
                                     lr=args.outer_lr) if outer else None
    trainer = DataParallelTrainer(model, d["spark"], num_partitions=PARTITIONS,
                                  optimizer=RMSprop(lr=args.lr),
                                  seed=args.seed, precision=precision, wire=wire, **kw)
    if source == "df":
        _, h = trainer.fit(d["df"], epochs=args.epochs, batch_size=args.batch_size,
                           validation_data=d["dft"], verbose=0)
    else:
        _, h = trainer.fit(d["X"], d["y"], epochs=args.epochs, batch_size=args.batch_size,
                           validation_data=(d["Xt"], d["yt"]), verbose=0)
    out = _from_history(h, h.setup_time)
    out["bytes_in"] = int(h.bytes_in)
    return out


@contextlib.contextmanager
def _validating(validation_data: Any) -> Iterator[None]:
    """Every ``DataParallelTrainer.fit`` without validation data validates on
    ``validation_data`` inside the block (the Estimator takes none; this measures its
    accuracy per epoch the way the trainer's other runs are measured)."""
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    fit = DataParallelTrainer.fit

    @functools.wraps(fit)
    def validated(self: Any, *a: Any, **kw: Any) -> Any:
        kw.setdefault("validation_data", validation_data)
        return fit(self, *a, **kw)
    DataParallelTrainer.fit = validated  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataParallelTrainer.fit = fit  # type: ignore[method-assign]


def run_estimator(d: dict[str, Any], args: argparse.Namespace,
                  precision: str = "fp32") -> dict[str, Any]:
    from sparknet.ml import SparkNetClassifier
    clf = SparkNetClassifier(network=make_model(args.seed), epochs=args.epochs,
                             batchSize=args.batch_size, learningRate=args.lr, optimizer="rmsprop",
                             numPartitions=PARTITIONS, seed=args.seed, verbose=0,
                             precision=precision)
    with _validating(d["dft"]):
        t0 = time.perf_counter()
        fitted = clf.fit(d["df"])
        wall = time.perf_counter() - t0
    h = fitted._history
    if h is None:
        raise RuntimeError("SparkNetClassifier.fit left no training history")
    return _from_history(h, wall - float(np.sum(h["time"])))


def _torch_train(paths: dict[str, str], epochs: int, batch: int, lr: float, seed: int) -> Any:
    """One DDP process (run by TorchDistributor): RMSprop on its half of the rows, rank 0
    evaluating on the test set after every epoch (not timed); every process returns rank
    0's figures."""
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = (torch.from_numpy(np.load(paths[k])) for k in ("X", "y"))
    Xt, yt = (torch.from_numpy(np.load(paths[k])) for k in ("Xt", "yt"))
    mine = torch.arange(rank, X.shape[0], world)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                        nn.Linear(256, 10))
    model = DistributedDataParallel(net)
    opt = torch.optim.RMSprop(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    start, times, accs = time.time(), [], []
    for e in range(epochs):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(seed * 1000 + e)
        order = mine[torch.randperm(len(mine), generator=g)]
        for lo in range(0, len(order), batch):
            rows = order[lo:lo + batch]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(X[rows]), y[rows]).backward()
            opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            with torch.no_grad():
                accs.append(float((net(Xt).argmax(1) == yt).float().mean()))
        dist.barrier()
    # every process writes its result to the same file (the last one wins): all return rank 0's
    out = [{"start": start, "epoch_times": times, "accs": accs} if rank == 0 else None]
    dist.broadcast_object_list(out, src=0)
    dist.destroy_process_group()
    return out[0]


def run_torch(d: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.ml.torch.distributor import TorchDistributor
    t_call = time.time()
    res = TorchDistributor(num_processes=PARTITIONS, local_mode=True, use_gpu=False).run(
        _torch_train, d["npy"], args.epochs, args.batch_size, args.lr, args.seed)
    if res is None:
        raise RuntimeError("TorchDistributor.run returned nothing from rank 0")
    return {"setup": res["start"] - t_call, "epoch_times": res["epoch_times"], "accs": res["accs"]}


RUNNERS: dict[str, Callable[[dict[str, Any], argparse.Namespace], dict[str, Any]]] = {
    "single": run_single,
    "df-plain": functools.partial(run_trainer, source="df", outer=False),
    "df-outer": functools.partial(run_trainer, source="df", outer=True),
    "np-plain": functools.partial(run_trainer, source="np", outer=False),
    "np-outer": functools.partial(run_trainer, source="np", outer=True),
    "async": functools.partial(run_trainer, source="df", outer=False, mode="async"),
    "estimator": run_estimator,
    "torch": run_torch,
    "single-bf16": functools.partial(run_single, precision="bf16"),
    "df-plain-bf16": functools.partial(run_trainer, source="df", outer=False, precision="bf16"),
    "df-outer-bf16": functools.partial(run_trainer, source="df", outer=True, precision="bf16"),
    "np-outer-bf16": functools.partial(run_trainer, source="np", outer=True, precision="bf16"),
    "async-bf16": functools.partial(run_trainer, source="df", outer=False, mode="async",
                                    precision="bf16"),
    "estimator-bf16": functools.partial(run_estimator, precision="bf16"),
    "df-outer-wire": functools.partial(run_trainer, source="df", outer=True, wire="bf16"),
    "df-outer-bf16-wire": functools.partial(run_trainer, source="df", outer=True, precision="bf16",
                                            wire="bf16"),
}
LABELS = {
    "single": "Sequential.fit, one process, 1 thread",
    "df-plain": "DataParallelTrainer, DataFrame, plain avg",
    "df-outer": "DataParallelTrainer, DataFrame, outer",
    "np-plain": "DataParallelTrainer, numpy, plain avg",
    "np-outer": "DataParallelTrainer, numpy, outer",
    "async": "DataParallelTrainer, DataFrame, async",
    "estimator": "SparkNetClassifier.fit, DataFrame",
    "torch": "TorchDistributor, 2 DDP processes",
    "single-bf16": "Sequential.fit, one process, bf16",
    "df-plain-bf16": "DataParallelTrainer, DataFrame, plain avg, bf16",
    "df-outer-bf16": "DataParallelTrainer, DataFrame, outer, bf16",
    "np-outer-bf16": "DataParallelTrainer, numpy, outer, bf16",
    "async-bf16": "DataParallelTrainer, DataFrame, async, bf16",
    "estimator-bf16": "SparkNetClassifier.fit, DataFrame, bf16",
    "df-outer-wire": "DataParallelTrainer, DataFrame, outer, bf16 wire",
    "df-outer-bf16-wire": "DataParallelTrainer, DataFrame, outer, bf16 + bf16 wire",
}


def fp32_twin(name: str) -> str | None:
    """The float32 run a bf16 run is compared with (``None`` for a float32 run)."""
    base = name.replace("-bf16", "").replace("-wire", "")
    return base if base != name else None


# --------------------------------------------------------------------------- figures
def time_to(run: dict[str, Any], target: float) -> float:
    """Set-up plus the training epochs until the test accuracy first reaches ``target``
    (``inf`` if it never does)."""
    t = run["setup"]
    for sec, acc in zip(run["epoch_times"], run["accs"]):
        t += sec
        if not math.isnan(acc) and acc >= target:
            return t
    return math.inf


def _nanmedian_columns(a: np.ndarray) -> list[float]:
    """Median of each column over its finite entries (NaN where there is none)."""
    return [float(np.median(c[np.isfinite(c)])) if np.isfinite(c).any() else math.nan for c in a.T]


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, reps in results.items():
        accs = np.array([r["accs"] for r in reps], dtype=float)
        s: dict[str, Any] = {
            "setup": float(np.median([r["setup"] for r in reps])),
            "setup_range": [float(min(r["setup"] for r in reps)),
                            float(max(r["setup"] for r in reps))],
            "median_epoch": float(np.median([np.median(r["epoch_times"]) for r in reps])),
            "accs": _nanmedian_columns(accs),
        }
        for tgt in TARGETS:
            s[f"time_to_{tgt}"] = float(np.median([time_to(r, tgt) for r in reps]))
        out[name] = s
    for name, s in out.items():
        twin = fp32_twin(name)
        if twin is not None and twin in out:
            for key in ("median_epoch", *(f"time_to_{t}" for t in TARGETS)):
                a, b = s[key], out[twin][key]
                ok = math.isfinite(a) and math.isfinite(b) and b > 0
                s[f"{key}_vs_fp32"] = a / b if ok else math.nan
            s["final_acc_minus_fp32"] = s["accs"][-1] - out[twin]["accs"][-1]
        for ref in ("single", "torch"):
            if ref in out and ref != name:
                for key in ("median_epoch", *(f"time_to_{t}" for t in TARGETS)):
                    a, b = s[key], out[ref][key]
                    ok = math.isfinite(a) and math.isfinite(b) and b > 0
                    s[f"{key}_vs_{ref}"] = a / b if ok else math.nan
    return out


def _sec(v: float) -> str:
    return f"{v:.1f} s" if math.isfinite(v) else "-"


def _ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None and math.isfinite(v) else "-"


def print_tables(summary: dict[str, dict[str, Any]], epochs: int) -> None:
    print("\n| run | set-up | median epoch | acc. epoch 1 | time to 97.5% | time to 98.0% "
          "| t98 / one process | t98 / torch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in summary.items():
        lo, hi = s["setup_range"]
        setup = "-" if name == "single" else f"{s['setup']:.1f} s ({lo:.1f}-{hi:.1f})"
        acc1 = f"{100 * s['accs'][0]:.1f}%" if s["accs"] and math.isfinite(s["accs"][0]) else "-"
        print(f"| {LABELS[name]} | {setup} | {s['median_epoch']:.2f} s | {acc1} | "
              f"{_sec(s['time_to_0.975'])} | {_sec(s['time_to_0.98'])} | "
              f"{_ratio(s.get('time_to_0.98_vs_single'))} | "
              f"{_ratio(s.get('time_to_0.98_vs_torch'))} |")
    print("\nratios (median epoch / time to 97.5% / time to 98%):")
    for name, s in summary.items():
        parts = []
        for ref in ("single", "torch"):
            if f"median_epoch_vs_{ref}" in s:
                parts.append(f"vs {ref}: " + " / ".join(_ratio(s.get(f"{k}_vs_{ref}")) for k in
                                                         ("median_epoch", "time_to_0.975",
                                                          "time_to_0.98")))
        if "median_epoch_vs_fp32" in s:
            parts.append(f"vs fp32 {fp32_twin(name)}: " + " / ".join(
                _ratio(s.get(f"{k}_vs_fp32")) for k in ("median_epoch", "time_to_0.975",
                                                        "time_to_0.98"))
                + f", final accuracy {100 * s['final_acc_minus_fp32']:+.2f} points")
        print(f"  {name:<10} " + "; ".join(parts))
    print("\ntest accuracy after each epoch (%, median over repeats):")
    print("| run | " + " | ".join(str(e + 1) for e in range(epochs)) + " |")
    print("|---|" + "---:|" * epochs)
    for name, s in summary.items():
        cells = [f"{100 * a:.2f}" if math.isfinite(a) else "-" for a in s["accs"]]
        print(f"| {name} | " + " | ".join(cells) + " |")


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=DEFAULT_MNIST, help="folder of the MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", default=",".join(RUNS),
                    help=f"comma-separated subset of {', '.join(RUNS)}")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--outer-momentum", type=float, default=None,
                    help="the *-outer runs' momentum (default: sized from the partitions)")
    ap.add_argument("--outer-lr", type=float, default=None,
                    help="the *-outer runs' outer lr (default: sized with the momentum)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    bad = sorted(set(runs) - set(RUNS))
    if bad:
        ap.error(f"unknown runs {bad}; choose from {', '.join(RUNS)}")
    if "torch" in runs:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not importable: the torch run is left out", flush=True)
            runs.remove("torch")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    logging.basicConfig(level=logging.WARNING)

    info = machine()
    print(f"# time to accuracy, MNIST MLP 784-512-256-10, RMSprop lr {args.lr}, batch "
          f"{args.batch_size}, {args.epochs} epochs, {args.repeats} repeats, {args.master}",
          flush=True)
    print(f"# CPU {info['cpu']} ({info['cores']} cores), caches {info['caches']}, one-thread sgemm "
          f"{info['sgemm_gflops_1thread']:.0f} GFLOP/s, load average {info['load_average']}, "
          f"{' '.join(f'{k}={v}' for k, v in info['openblas_env'].items()) or 'no OPENBLAS_* env'}",
          flush=True)

    from sparknet.datasets import load_mnist
    X, y, Xt, yt = load_mnist(args.mnist)
    d: dict[str, Any] = {"X": X, "y": y, "Xt": Xt, "yt": yt}
    tmp = tempfile.TemporaryDirectory(prefix="sparknet-tta-")
    d["npy"] = {k: os.path.join(tmp.name, f"{k}.npy") for k in ("X", "y", "Xt", "yt")}
    for k, path in d["npy"].items():
        np.save(path, d[k])
        np.load(path)  # in the page cache before any clock
    if any(r != "single" for r in runs):
        d["spark"] = session(args.master)
        if any(r.split("-")[0] in ("df", "async", "estimator") for r in runs):
            d["df"] = to_df(d["spark"], X, y, PARTITIONS)
            d["dft"] = to_df(d["spark"], Xt, yt, PARTITIONS)

    results: dict[str, list[dict[str, Any]]] = {r: [] for r in runs}
    first_spark: tuple[str, float] | None = None
    for rep in range(args.repeats):
        order = runs if rep % 2 == 0 else runs[::-1]
        for name in order:
            t0 = time.perf_counter()
            res = RUNNERS[name](d, args)
            res["wall"] = time.perf_counter() - t0
            results[name].append(res)
            if first_spark is None and name not in ("single", "single-bf16", "torch"):
                first_spark = (name, res["setup"], res.get("setup_breakdown", {}))
            acc = ", ".join(f"{100 * a:.2f}" for a in res["accs"])
            rounds = f", rounds/epoch {res['rounds']}" if "rounds" in res else ""
            rounds += f", {res['bytes_in'] / 2 ** 20:.0f} MiB back" if "bytes_in" in res else ""
            print(f"repeat {rep + 1} {name:<10} set-up {res['setup']:5.2f} s, median epoch "
                  f"{np.median(res['epoch_times']):.2f} s, test acc. [{acc}], 98% at "
                  f"{_sec(time_to(res, 0.98))}{rounds}", flush=True)
    summary = summarise(results)
    print_tables(summary, args.epochs)
    if first_spark is not None:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in first_spark[2].items() if v >= 0.005)
        print(f"\nfirst fit of the session: {first_spark[0]}, set-up {first_spark[1]:.2f} s"
              + (f" ({parts})" if parts else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "args": vars(args), "first_spark_fit": first_spark,
                       "summary": summary, "results": results}, fh, indent=1, default=float)
    if "spark" in d:
        d["spark"].stop()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

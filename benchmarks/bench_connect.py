"""Spark Connect against Classic, in one run on this machine: the same data-parallel fit
from a Connect client and from a Classic session, and what a round costs on each.

* **Fit**: MNIST (60,000 x 784, numpy input), the MLP 784-512-256-10, RMSprop 1e-3,
  batch 128, ``sync="average"`` with ``--local-steps`` local steps a round on both (the
  automatic sizing would give Connect's dearer rounds more steps, and rounds of several
  epochs), 2 partitions, ``--epochs`` epochs; per engine the
  set-up, the median epoch (epochs after the first), the test accuracy after each
  epoch and the time to 98% (when reached).
* **Round cost**: a job over 2 resident shards that returns nothing (the fixed cost of a
  round), and one that ships ``--mib`` MiB to the tasks (Classic: a broadcast; Connect:
  inside the query) and brings the same back from each task: seconds per MiB.
* **Async straggler** (``--parts async``): the same MLP in ``mode="async"``, partition 1
  slowed to half speed (an injected delay as long as its compute), ``--async-epochs``
  epochs: median epoch, the updates each partition applied, final test accuracy.
* **Model-parallel step** (``--parts mp``): the paired 4096-16384-16384-10 net (335.6M
  blocked float32 parameters), K = 2 blocks, batch 256, lookahead on
  (``bench_model_parallel.py``'s paired step), median step after a warm-up.

The Classic session is ``local[2]`` in this process; the Connect server is ``local[2]``
in its own process (``tests/helpers/connect_server.py``), with the same settings.  The engines
alternate (``--repeats``); ratios are Connect / Classic.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_connect.py [--epochs 4] [--repeats 1]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))


def fit(spark: Any, data: tuple, epochs: int, local_steps: int) -> dict:
    from sparknet import Dense, RMSprop, Sequential
    from sparknet.callbacks import Callback
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

    X, y, Xt, yt = data
    model = Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                        Dense(10, activation="softmax")], input_shape=(784,), seed=0)
    accs: list[float] = []
    stamps: list[float] = []

    class Acc(Callback):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            stamps.append(time.perf_counter())
            accs.append(float((model.predict(Xt) == yt).mean()))

    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average",
                                  optimizer=RMSprop(lr=1e-3), local_steps=local_steps, seed=0)
    t0 = time.perf_counter()
    _, h = trainer.fit(X, y, epochs=epochs, batch_size=128, verbose=0, callbacks=[Acc()])
    # time to each epoch's end, less the client-side accuracy checks made before it
    ends = [s - t0 for s in stamps]
    check = [ends[0] - h["time"][0] - h.setup_time] + [ends[i] - ends[i - 1] - h["time"][i]
                                                        for i in range(1, len(ends))]
    clean = np.cumsum([h.setup_time + h["time"][0]] + list(h["time"][1:]))
    t98 = next((float(c) for c, a in zip(clean, accs) if a >= 0.98), float("nan"))
    return {"setup": h.setup_time, "epoch": float(np.median(h["time"][1:] or h["time"]), ),
            "accs": accs, "t98": t98, "check_s": float(np.mean(check))}


def round_costs(spark: Any, mib: int, repeats: int = 7) -> dict:
    """Median seconds of an empty round and of one shipping ``mib`` MiB out and back."""
    from sparknet.cluster.engine.base import engine_for, is_connect

    def build(index, it):
        for _ in it:
            pass
        return {"x": np.zeros(4, np.float32)}, {"rows": 0}

    if is_connect(spark):
        from sparknet.cluster.engine.connect import ConnectResident
        res = ConnectResident(spark.range(0, 2, 1, numPartitions=2), lambda i, b: build(i, iter(b)),
                              name="bench")
    else:
        from sparknet.cluster.resident.driver import Resident
        res = Resident(spark.sparkContext.parallelize(range(2), 2), build, name="bench")
    engine = engine_for(spark)
    payload = np.ones((mib << 20) // 4, np.float32)
    out = {}
    try:
        for name, size in (("empty", 0), ("mib", mib)):
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                shipped = engine.ship(payload if size else np.zeros(1, np.float32))
                res.map(lambda i, s, v=shipped, n=size: v.value.copy() if n else None)
                times.append(time.perf_counter() - t0)
                shipped.unpersist()
            out[name] = float(np.median(times[1:]))
    finally:
        res.close()
    out["per_mib"] = (out["mib"] - out["empty"]) / (3 * mib)  # out once, back from each of 2 tasks
    return out


def async_straggler(spark: Any, data: tuple, epochs: int, local_steps: int) -> dict:
    """``mode="async"`` with partition 1 at half speed: median epoch, updates per partition,
    accuracy."""
    from sparknet import Dense, RMSprop, Sequential
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.testing import inject_faults

    X, y, Xt, yt = data
    model = Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                        Dense(10, activation="softmax")], input_shape=(784,), seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async",
                                  optimizer=RMSprop(lr=1e-3), local_steps=local_steps, seed=0)
    with inject_faults(slow={1: 1.0}):
        _, h = trainer.fit(X, y, epochs=epochs, batch_size=128, verbose=0)
    per = [sum(1 for u in h.updates if u["partition"] == p and u["applied"]) for p in (0, 1)]
    return {"async_epoch": float(np.median(h["time"][1:] or h["time"])), "async_updates": per,
            "async_acc": float((model.predict(Xt) == yt).mean())}


def mp_step(spark: Any, steps: int) -> dict:
    """The paired 335.6M model-parallel step (K = 2, batch 256): median seconds."""
    from bench_model_parallel import bench_pair_of

    _, row = bench_pair_of(spark, 4096, 16384, 256, steps=steps, warmup=1, pair=True,
                           single=_NoSingle())
    return {"mp_step": row["step_s"], "mp_init": row["init_s"]}


class _NoSingle:
    """bench_pair_of's one-process rival, left out here (Connect and Classic are compared)."""

    def step(self, xb: Any, yb: Any) -> float:
        return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mnist", default=os.environ.get("SPARKNET_MNIST", DEFAULT_MNIST))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--local-steps", type=int, default=47,
                    help="local steps per round, the same on both (47: 5 rounds an epoch)")
    ap.add_argument("--parts", nargs="+", default=["fit", "async", "mp"],
                    choices=["fit", "async", "mp"])
    ap.add_argument("--async-epochs", type=int, default=3)
    ap.add_argument("--mp-steps", type=int, default=3)
    args = ap.parse_args(argv)
    from _machine import machine_header
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from helpers.connect_server import ConnectServer
    from sparknet.cluster.engine.session import DEFAULT_CONF
    from sparknet.datasets import load_mnist

    print(machine_header(), flush=True)
    X, y, Xt, yt = load_mnist(args.mnist)
    data = (X.astype(np.float32), y, Xt.astype(np.float32), yt)
    conf = {**DEFAULT_CONF, "spark.ui.enabled": "false", "spark.driver.memory": "4g"}
    builder = SparkSession.builder.master("local[2]").appName("bench-connect-classic")
    for k, v in conf.items():
        builder = builder.config(k, v)
    t0 = time.perf_counter()
    classic = builder.getOrCreate()
    classic.sparkContext.setLogLevel("ERROR")
    print(f"Classic session up in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    with ConnectServer("local[2]", conf) as server:
        remote = RemoteSession.builder.remote(server.url).getOrCreate()
        print(f"Connect server and session up in {time.perf_counter() - t0:.1f} s", flush=True)
        runs: dict[str, list[dict]] = {"classic": [], "connect": []}
        for r in range(args.repeats):
            order = ("classic", "connect") if r % 2 == 0 else ("connect", "classic")
            for name in order:
                spark = classic if name == "classic" else remote
                row: dict = {}
                if "fit" in args.parts:
                    row.update(fit(spark, data, args.epochs, args.local_steps),
                               **round_costs(spark, args.mib))
                    print(f"{name:8s} set-up {row['setup']:.2f} s, median epoch {row['epoch']:.2f} "
                          f"s, t98 {row['t98']:.1f} s, accuracy "
                          f"{' '.join(f'{100 * a:.2f}' for a in row['accs'])}; empty round "
                          f"{1000 * row['empty']:.0f} ms, {args.mib} MiB out and back "
                          f"{1000 * row['mib']:.0f} ms ({1000 * row['per_mib']:.1f} ms/MiB)",
                          flush=True)
                if "async" in args.parts:
                    row.update(async_straggler(spark, data, args.async_epochs, args.local_steps))
                    print(f"{name:8s} async, partition 1 at half speed: median epoch "
                          f"{row['async_epoch']:.2f} s, updates per partition "
                          f"{row['async_updates']}, accuracy {100 * row['async_acc']:.2f}",
                          flush=True)
                if "mp" in args.parts:
                    row.update(mp_step(spark, args.mp_steps))
                    print(f"{name:8s} paired 335.6M model-parallel step {row['mp_step']:.2f} s "
                          f"(set-up {row['mp_init']:.1f} s)", flush=True)
                runs[name].append(row)
        remote.stop()
    classic.stop()
    keys = [k for k in ("setup", "epoch", "t98", "empty", "per_mib", "async_epoch", "async_acc",
                        "mp_step")
            if k in runs["classic"][0]]
    med = {n: {k: float(np.median([r[k] for r in rs])) for k in keys} for n, rs in runs.items()}
    print("\n| | Classic | Connect | Connect / Classic |\n|---|---:|---:|---:|")
    for k, label, unit in (("setup", "set-up inside fit", "s"), ("epoch", "median epoch", "s"),
                           ("t98", "time to 98%", "s"), ("empty", "empty round", "s"),
                           ("per_mib", "per MiB out and back", "s"),
                           ("async_epoch", "async epoch, one straggler", "s"),
                           ("async_acc", "async test accuracy", ""),
                           ("mp_step", "paired 335.6M model-parallel step", "s")):
        if k in keys:
            a, b = med["classic"][k], med["connect"][k]
            print(f"| {label} | {a:.3f} {unit} | {b:.3f} {unit} | {b / a:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

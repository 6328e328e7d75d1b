"""The cost model against real runs: predicted vs measured epoch (or step) times.

For each master (``local[1]``, ``local[2]``, a standalone cluster of 2 one-core workers on
127.0.0.1) and workload, in one process and close in time:

1. the probes: :meth:`SparkCosts.measure` on the live session, :meth:`NetworkCosts.measure`
   (real training steps of the network in this process, one BLAS thread);
2. the prediction (:func:`sparknet.cluster.planning.cost.predict`);
3. the real thing: a short :class:`~sparknet.cluster.DataParallelTrainer` fit (numpy
   input, RMSprop, fixed ``local_steps``, plain averaging), whose median epoch after the
   first is the measurement (the first epoch starts the workers' models); or for the
   model-parallel net, :class:`~sparknet.cluster.model_parallel.ModelParallel` steps
   (median after one warm-up step, lookahead on, as ``bench_model_parallel.py`` runs them).

Workloads (``--only``):

* ``mlp``: MNIST MLP 784-512-256-10, batch 128 (the first ``--mlp-rows`` training images);
* ``cnn``: the CNN of ``bench_cnn.py`` (c5x5x32-p2-c5x5x64-p2-d128-d10), batch 64;
* ``lstm``: a char LSTM(200) on ``../shared/data/shakespeare.txt``: windows of
  ``--seq`` characters, the next character as the label, batch 32;
* ``mp``: the 335.6M paired blocked net 4096-16384-16384-10 of ``bench_model_parallel.py``,
  K = 2, batch 256 (the step time; ``--mp-unpaired`` adds the unpaired net).

Data-parallel modes (``--modes``): ``average`` (sync, tau local steps), ``gradient`` (sync,
one global step per round, on fewer rows), ``async``.  The table gives predicted and
measured seconds, the error in %, the load average and the one-thread sgemm rate when the
row was taken, and the prediction's largest terms.

    python benchmarks/bench_cost_model.py                       # everything (~15-25 min)
    python benchmarks/bench_cost_model.py --only mlp --master local[2]
    python benchmarks/bench_cost_model.py --only mp --master standalone
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import sys
import time
from typing import Any

# inherited by local-mode workers and standalone executors
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
DATA = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data"))


# --------------------------------------------------------------------------- workloads
def mlp_model(seed: int = 0):
    from sparknet import Dense, Sequential
    return Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(784,), seed=seed)


def cnn_model(seed: int = 0):
    from bench_cnn import sparknet_cnn
    return sparknet_cnn(seed)


def lstm_model(vocab: int, seq: int, seed: int = 0):
    from sparknet import LSTM, Dense, Embedding, Sequential
    return Sequential([Embedding(vocab, 32), LSTM(200), Dense(vocab, activation="softmax")],
                      input_shape=(seq,), seed=seed)


def mnist(rows: int, flat: bool):
    from sparknet.datasets import load_mnist
    X, y, _, _ = load_mnist(os.path.join(DATA, "mnist"), flat=flat)
    mean, std = float(X.mean()), float(X.std())
    return ((X[:rows] - mean) / std).astype(np.float32), y[:rows]


def shakespeare(rows: int, seq: int):
    from sparknet.data import char_vocab
    from sparknet.datasets import load_text
    text = load_text(os.path.join(DATA, "shakespeare.txt"))[: rows * seq + seq + 1]
    chars, ids = char_vocab(text)
    starts = np.arange(rows) * seq
    X = np.stack([ids[s:s + seq] for s in starts]).astype(np.float32)
    y = ids[starts + seq]
    return X, y, len(chars)


# ----------------------------------------------------------------------------- sessions
def session(master: str, extra: dict | None = None):
    from pyspark.sql import SparkSession

    from sparknet.cluster.engine.session import DEFAULT_CONF
    b = SparkSession.builder
    for k, v in DEFAULT_CONF.items():
        b = b.config(k, v)
    b = (b.master(master).appName("bench-cost-model")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "4g").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.executorEnv.OPENBLAS_NUM_THREADS", "1"))
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def wait_executors(spark, n: int, timeout: float = 90) -> None:
    sc = spark.sparkContext
    deadline = time.time() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() < n + 1:
        if time.time() > deadline:
            raise TimeoutError(f"{n} executors did not register in {timeout:.0f} s")
        time.sleep(0.2)


def state() -> dict:
    """The load average and this process's one-thread sgemm rate now."""
    from sparknet.cluster.planning.probes import gemm_gflops
    return {"load": os.getloadavg()[0], "sgemm": gemm_gflops()}


# ----------------------------------------------------------------------------- one row
def fit_epochs(spark, make, X, y, mode: str, partitions: int, tau: int, batch: int,
               epochs: int) -> tuple[list[float], list[float]]:
    """Epoch times of a short DataParallelTrainer fit and the compute seconds in them (the
    slowest task's per round, summed; async: per partition), the first epoch dropped."""
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer
    model = make()
    kw: dict[str, Any] = {"gradient": {"sync": "gradient"},
                          "average": {"sync": "average", "local_steps": tau, "outer": None},
                          "async": {"sync": "average", "local_steps": tau, "mode": "async"}}[mode]
    trainer = DataParallelTrainer(model, spark, num_partitions=partitions,
                                  optimizer=RMSprop(lr=1e-3), **kw)
    _, h = trainer.fit(X, y, epochs=epochs, batch_size=batch, verbose=0, reuse_data=False)
    times = [float(t) for t in h["time"][1:]]
    return times, [t * (1.0 - float(o)) for t, o in zip(times, h["spark_overhead"][1:])]


def row(name: str, master: str, pred, measured: list[float], st: dict, unit: str = "epoch",
        compute: list[float] | None = None) -> dict:
    m = float(np.median(measured))
    p = pred.step_s if unit == "step" else pred.epoch_s
    top = sorted(pred.breakdown.items(), key=lambda kv: -kv[1])[:4]
    per = pred.step_s / pred.round_s if unit == "step" and pred.round_s else 1.0
    scale = (p / pred.epoch_s) if pred.epoch_s else 1.0
    terms = ", ".join(f"{k} {v * scale * per:.3g}" for k, v in top if v > 0)
    r = {"workload": name, "master": master, "mode": pred.mode, "unit": unit, "predicted": p,
         "measured": m, "error_pct": 100.0 * (p - m) / m, "runs": [round(x, 4) for x in measured],
         "terms": terms, "settings": {k: v for k, v in pred.settings.items() if k != "speeds"},
         **st}
    comp = ""
    if compute:
        pc = (pred.breakdown.get("compute", 0.0)
              + pred.breakdown.get("stragglers", 0.0)) * scale * per
        mc = float(np.median(compute))
        r["compute_predicted"], r["compute_measured"] = pc, mc
        comp = f"; compute {pc:.3f} vs {mc:.3f}, rest {p - pc:.3f} vs {m - mc:.3f}"
    print(f"  {name:<5} {master:<11} {pred.mode:<15} predicted {p:8.3f} s/{unit}  measured "
          f"{m:8.3f}  error {r['error_pct']:+6.1f}%  (load {st['load']:.1f}, sgemm "
          f"{st['sgemm']:.0f})  [{terms}]{comp}",
          flush=True)
    return r


def data_parallel(spark, master: str, partitions: int, args, rows: list) -> None:
    from sparknet.cluster.planning.cost import NetworkCosts, SparkCosts, predict

    work = []
    if "mlp" in args.only:
        X, y = mnist(args.mlp_rows, flat=True)
        work.append(("mlp", mlp_model, X, y, 128, args.tau_mlp, args.grad_rows_mlp))
    if "cnn" in args.only:
        X, y = mnist(args.cnn_rows, flat=False)
        work.append(("cnn", cnn_model, X, y, 64, args.tau_cnn, args.grad_rows_cnn))
    if "lstm" in args.only:
        X, y, vocab = shakespeare(args.lstm_rows, args.seq)
        work.append(("lstm", lambda: lstm_model(vocab, args.seq), X, y, 32, args.tau_lstm, 0))
    for name, make, X, y, batch, tau, grad_rows in work:
        modes = [m for m in args.modes if not (name == "lstm" and m != "average")]
        for mode, _rep in [(m, r) for r in range(args.repeats) for m in modes]:
            Xm, ym = (X[:grad_rows], y[:grad_rows]) if mode == "gradient" else (X, y)
            sc = SparkCosts.measure(spark)
            net = NetworkCosts.measure(make(), batch, min_seconds=args.probe_seconds,
                                       spark=spark if args.net_in_tasks else None)
            st = state()
            settings: dict[str, Any] = {"partitions": partitions}
            if mode != "gradient":
                settings["tau"] = tau
            pred = predict(mode, net, sc, len(Xm), **settings)
            measured, compute = fit_epochs(spark, make, Xm, ym, mode, partitions, tau, batch,
                                           args.epochs)
            rows.append(row(name, master, pred, measured, st, compute=compute))
            rows[-1]["spark_costs"] = dataclasses.asdict(sc)
            rows[-1]["net"] = {"sample_s": net.sample_s, "update_s": net.update_s,
                               "step_fixed_s": net.step_fixed_s}
            _save(args, rows)


def model_parallel(spark, master: str, args, rows: list) -> None:
    from bench_model_parallel import Single, data, layers

    from sparknet import RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan
    from sparknet.cluster.planning.cost import NetworkCosts, SparkCosts, predict

    n_in, width, batch = 4096, 16384, 256
    # the one-process costs from a narrower copy of the net (4096-4096-4096-10, 33.6M
    # parameters; the 335.6M net in one process needs 4 GB more driver memory): its flop
    # rate and its optimizer step per parameter carry over (GEMMs of the same 256 x 4096 rows)
    proxy = Single(n_in, 4096)
    X, y = data(n_in, batch, args.mp_steps + 1)
    xs = [X[s * batch:(s + 1) * batch] for s in range(args.mp_steps + 1)]
    ys = [y[s * batch:(s + 1) * batch] for s in range(args.mp_steps + 1)]
    proxy.step(xs[0], ys[0])
    sizes, proxy_sizes = [n_in, width, width, 10], [n_in, 4096, 4096, 10]

    def flops(sz: list) -> float:
        return sum(2.0 * a * b * (3.0 if i else 2.0) for i, (a, b) in enumerate(zip(sz, sz[1:])))

    n_params = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    for pair in [True] + ([False] if args.mp_unpaired else []):
        upd = _update_s(proxy.model) * n_params / proxy.model.n_params
        one = float(np.median([proxy.step(xs[s], ys[s]) for s in range(3)]))
        rate = flops(proxy_sizes) * batch / max(one - _update_s(proxy.model), 1e-3)
        one_step = flops(sizes) * batch / rate + upd
        net = NetworkCosts(sample_s=(one_step - upd) / batch,
                           eval_sample_s=(one_step - upd) / batch / 3,
                           param_bytes=4 * n_params, batch_size=batch, n_params=n_params,
                           update_s=upd, flops_per_sample=flops(sizes))
        sc = SparkCosts.measure(spark)
        st = state()
        pred = predict("model_parallel", net, sc, batch, blocks=2, paired=pair, layer_sizes=sizes)
        mp = ModelParallel(layers(width), BlockPlan({0: 2, 1: 2}, pair=pair), (n_in,), spark=spark,
                           seed=0, optimizer=RMSprop(lr=1e-4), name="bench-cost")
        comp: list[float] = []
        try:
            for s in range(args.mp_steps):
                mp.train_on_batch(xs[s], ys[s], next_x=xs[s + 1])
                comp.append(mp.last_step_times["executor_compute_s"])
            times = mp.step_times[1:]
        finally:
            mp.close()
        rows.append(row("mp" + ("-paired" if pair else ""), master, pred, times, st, unit="step",
                        compute=comp[1:]))
        rows[-1]["one_process_step_s"] = one_step
        print(f"    one process (from the 33.6M proxy's rate {rate / 1e9:.0f} GFLOP/s): "
              f"{one_step:.2f} s/step; predicted speedup {pred.speedup:.2f}x, measured "
              f"{one_step / float(np.median(times)):.2f}x",
              flush=True)
        _save(args, rows)
    del proxy


def _update_s(model) -> float:
    """Seconds of one RMSprop step over ``model``'s parameters, one thread."""
    from threadpoolctl import threadpool_limits

    from sparknet import RMSprop
    opt = RMSprop(lr=1e-6)
    g = np.zeros_like(model.params)
    with threadpool_limits(1):
        opt.step(model.params, g)
        t0 = time.perf_counter()
        opt.step(model.params, g)
        return time.perf_counter() - t0


def _save(args, rows: list) -> None:
    """Write the rows so far (a run killed midway keeps what it measured)."""
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


def run_master(master: str, args, rows: list) -> None:
    print(f"\n== {master}", flush=True)
    if master == "standalone":
        from helpers.standalone_cluster import StandaloneCluster
        with StandaloneCluster(workers=2, cores=1, memory="12g") as cluster:
            spark = session(cluster.url, {"spark.executor.cores": "1",
                                          "spark.executor.memory": "1g"})
            try:
                wait_executors(spark, 2)
                _run(spark, "standalone", 2, args, rows)
            finally:
                spark.stop()
        return
    spark = session(master)
    try:
        _run(spark, master, int(master[len("local["):-1]), args, rows)
    finally:
        spark.stop()


def _run(spark, master: str, cores: int, args, rows: list) -> None:
    if set(args.only) & {"mlp", "cnn", "lstm"}:
        data_parallel(spark, master, cores, args, rows)
    if "mp" in args.only:
        model_parallel(spark, master, args, rows)


def report(rows: list) -> None:
    """One line per workload, master and mode: medians over the repeats."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["master"], r["mode"]), []).append(r)
    print("\n| workload | master | mode | settings | predicted (s) | measured (s) | error | "
          "repeats' errors | compute pred / meas (s) | load | sgemm | largest terms (s) |")
    print("|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---|")
    errs = []
    for (name, master, mode), rs in groups.items():
        s = rs[0]["settings"]
        keys = ("partitions", "tau", "K", "paired", "jobs_per_step")
        opts = ", ".join(f"{k}={s[k]}" for k in keys if k in s)
        p, m = (float(np.median([r[k] for r in rs])) for k in ("predicted", "measured"))
        err = 100.0 * (p - m) / m
        errs.append(abs(err))
        each = " ".join(f"{r['error_pct']:+.0f}%" for r in rs)
        comp = "-"
        if "compute_measured" in rs[0]:
            comp = (f"{np.median([r['compute_predicted'] for r in rs]):.3f} / "
                    f"{np.median([r['compute_measured'] for r in rs]):.3f}")
        load = "-".join(f"{x:.0f}" for x in sorted({round(r["load"]) for r in rs}))
        sg = "-".join(f"{x:.0f}" for x in sorted({r["sgemm"] for r in rs})[::max(1, len(rs) - 1)])
        print(f"| {name} | {master} | {mode} | {opts} | {p:.3f}/{rs[0]['unit']} | {m:.3f} | "
              f"{err:+.1f}% | {each} | {comp} | {load} | {sg} | {rs[-1]['terms']} |")
    if errs:
        print(f"\n{sum(e <= 15 for e in errs)} of {len(errs)} rows within 15%; median |error| "
              f"{np.median(errs):.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="mlp,cnn,lstm,mp", help="comma list of mlp, cnn, lstm, mp")
    ap.add_argument("--master", default="local[1],local[2],standalone",
                    help="comma list of local[N] and standalone")
    ap.add_argument("--modes", default="average,gradient,async",
                    help="comma list of data-parallel modes")
    ap.add_argument("--epochs", type=int, default=4,
                    help="epochs per fit (the first is not measured)")
    ap.add_argument("--mlp-rows", type=int, default=20000)
    ap.add_argument("--cnn-rows", type=int, default=4000)
    ap.add_argument("--lstm-rows", type=int, default=3000)
    ap.add_argument("--grad-rows-mlp", type=int, default=2560,
                    help="rows of the sync='gradient' fits")
    ap.add_argument("--grad-rows-cnn", type=int, default=640)
    ap.add_argument("--seq", type=int, default=25, help="characters per LSTM window")
    ap.add_argument("--tau-mlp", type=int, default=40)
    ap.add_argument("--tau-cnn", type=int, default=16)
    ap.add_argument("--tau-lstm", type=int, default=24)
    ap.add_argument("--mp-steps", type=int, default=5,
                    help="model-parallel steps (the first is not measured)")
    ap.add_argument("--mp-unpaired", action="store_true", help="also the unpaired 335.6M net")
    ap.add_argument("--repeats", type=int, default=1,
                    help="probe, predict and fit this many times per row (medians reported)")
    ap.add_argument("--probe-seconds", type=float, default=1.5,
                    help="seconds of in-process training steps NetworkCosts.measure runs at least")
    ap.add_argument("--net-in-tasks", action="store_true",
                    help="time the network's steps inside Spark tasks (one per slot, at once) "
                         "instead of in this process (then SparkCosts.task_speed is not applied)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    args.only = [w for w in args.only.split(",") if w]
    args.modes = [m for m in args.modes.split(",") if m]
    from _machine import machine_header
    print(machine_header(), flush=True)
    mine = ("/dev/shm/sparknet-*costprobe*", "/dev/shm/sparknet-*bench-cost*")
    shm_before = {d for g in mine for d in glob.glob(g)}
    rows: list = []
    try:
        for master in [m for m in args.master.split(",") if m]:
            run_master(master, args, rows)
    finally:
        # this run's block folders only
        for d in {d for g in mine for d in glob.glob(g)} - shm_before:
            shutil.rmtree(d, ignore_errors=True)
        report(rows)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

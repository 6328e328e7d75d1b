"""Model parallelism by neuron blocks: step time of one process vs K = 2 blocks on Spark.

The net is ``IN -> Dense(H, relu) -> Dense(H, relu) -> Dense(10, softmax)`` (float32,
RMSprop); its two hidden layers are blocked (K = 2), the head runs on the driver.
For each width and batch it measures the training step time of

* ``single``: :class:`sparknet.Sequential` + RMSprop in this process, one BLAS thread
  (its steps alternate with the K = 2 steps on the same batches, so both see the same load);
* ``local``: K = 2 blocks on ``local[2]`` (each block one Python worker, one BLAS thread),
  unpaired (4 exchanges per step) and paired (Megatron-style, 2 exchanges per step); by
  default the next batch's first forward pass rides in the backward job (lookahead), which
  makes that 3 and 1 jobs per step (``--no-lookahead`` turns it off);
* ``standalone``: the same on a standalone cluster on 127.0.0.1 with two one-core executors
  (started and stopped here, from pyspark's own ``bin/spark-class``);

and prints step time, speedup over ``single``, Spark jobs per step and bytes moved per
step (broadcast bytes times the blocks that read them, plus collected bytes).

``--replicas D`` (D > 1) prints instead what a step of the hybrid costs, ``D`` replicas of
the K = 2 blocks on ``local[2]``, unpaired and paired: Spark jobs, bytes broadcast and
collected, and the gradient bytes combined through the driver (no timing).

Run (the shape of the paper's Fig. 4.7 at this machine's scale)::

    python benchmarks/bench_model_parallel.py                     # default grid
    python benchmarks/bench_model_parallel.py --widths 16384 --in-features 4096 --batches 256
    python benchmarks/bench_model_parallel.py --replicas 2 --widths 1024 4096   # hybrid cost per
    step

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment slow OpenBLAS on AVX-512 CPUs;
the report says which were set.  Block files it created in /dev/shm (``sparknet-resident-blocks-*``)
are removed at the end.
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import shutil
import sys
import time

# inherited by local-mode workers and standalone executors
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def layers(width: int):
    from sparknet import Dense
    return [Dense(width, activation="relu"), Dense(width, activation="relu"),
            Dense(10, activation="softmax")]


def data(n_in: int, batch: int, steps: int):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch * steps, n_in)).astype(np.float32)
    y = rng.integers(0, 10, batch * steps)
    return X, y


class Single:
    """The rival: Sequential + RMSprop in this process, one BLAS thread."""

    def __init__(self, n_in: int, width: int) -> None:
        from sparknet import RMSprop, Sequential
        self.model = Sequential(layers(width), input_shape=(n_in,), dtype="float32", seed=0)
        self.opt = RMSprop(lr=1e-4)

    def step(self, xb, yb) -> float:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(1):
            t0 = time.perf_counter()
            self.model.train_on_batch(xb, yb, optimizer=self.opt)
            return time.perf_counter() - t0


def bench_pair_of(spark, n_in: int, width: int, batch: int, steps: int, warmup: int, pair: bool,
                  single: Single, lookahead: bool = True) -> tuple[dict, dict]:
    """Alternate single-process and K = 2 steps on the same batches (so both see the same
    machine load); returns (single row, model-parallel row)."""
    from sparknet import RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = data(n_in, batch, steps + warmup)
    t0 = time.perf_counter()
    mp = ModelParallel(layers(width), BlockPlan({0: 2, 1: 2}, pair=pair), (n_in,), spark=spark,
                       seed=0, optimizer=RMSprop(lr=1e-4), name="bench")
    init_s = time.perf_counter() - t0
    single_t, comp, read, per_step = [], [], [], []
    try:
        xs = [X[s * batch:(s + 1) * batch] for s in range(steps + warmup)]
        for s in range(steps + warmup):
            xb, yb = xs[s], y[s * batch:(s + 1) * batch]
            single_t.append(single.step(xb, yb))
            # with lookahead: the next batch's first forward rides in this step's backward job
            mp.train_on_batch(xb, yb, next_x=xs[s + 1] if (lookahead and s + 1 < len(xs)) else None)
            comp.append(mp.last_step_times["executor_compute_s"])
            read.append(mp.last_step_times["executor_read_s"])
            per_step.append(dict(mp.last_step_bytes))
        times = mp.step_times[warmup:]
        b = per_step[-2] if len(per_step) > 1 else per_step[-1]    # a step in steady state
        moves, tasks = getattr(mp.backend, "moves", 0), getattr(mp.backend, "tasks", 0)
    finally:
        mp.close()
    srow = {"step_s": float(np.median(single_t[warmup:])), "jobs": 0, "moved": 0}
    mrow = {"step_s": float(np.median(times)), "jobs": b["jobs"], "moved": b["moved"],
            "compute_s": float(np.median(comp[warmup:])), "read_s": float(np.median(read[warmup:])),
            "init_s": init_s, "moves": moves, "tasks": tasks}
    return srow, mrow


def hybrid_cost(spark, n_in: int, width: int, batch: int, replicas: int, pair: bool,
                combine_bytes: int) -> dict:
    """Bytes and Spark jobs of one steady training step of ``replicas`` x K = 2 blocks."""
    from sparknet import RMSprop
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = data(n_in, batch, 2)
    mp = ModelParallel(layers(width), BlockPlan({0: 2, 1: 2}, pair=pair), (n_in,), spark=spark,
                       seed=0, optimizer=RMSprop(lr=1e-4), name="bench-hybrid", replicas=replicas,
                       combine_bytes=combine_bytes)
    try:
        for s in range(2):
            mp.train_on_batch(X[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch])
        pieces = sum(len(mp.pieces(st.layers)) for st in mp.stages if st.kind != "driver")
        return {**mp.last_step_bytes, "pieces": pieces, "blocked_bytes": 4 * mp.n_blocked_params}
    finally:
        mp.close()


def print_hybrid(grid: list, replicas: int, combine_bytes: int) -> None:
    spark = session("local[2]")
    try:
        print("| in | width | batch | replicas | paired | blocked weights | jobs/step | pieces | "
              "broadcast/step | collected/step | combined/step |")
        print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for n_in, w, b in grid:
            for pair in (False, True):
                r = hybrid_cost(spark, n_in, w, b, replicas, pair, combine_bytes)
                print(f"| {n_in} | {w} | {b} | {replicas} | {pair} | "
                      f"{fmt_bytes(r['blocked_bytes'])} | {r['jobs']} | {r['pieces']} | "
                      f"{fmt_bytes(r['broadcast'])} | {fmt_bytes(r['collected'])} | "
                      f"{fmt_bytes(r['combined'])} |", flush=True)
    finally:
        spark.stop()


def _gemm_rate(_=None) -> float:
    from sparknet import _blas
    A = np.ones((256, 4096), np.float32)
    B = np.ones((4096, 4096), np.float32)
    C = np.empty((256, 4096), np.float32)
    _blas.py_gemm(False, True, 1.0, A, B, 0.0, C)
    t0 = time.perf_counter()
    for _ in range(10):
        _blas.py_gemm(False, True, 1.0, A, B, 0.0, C)
    return 10 * 2 * 256 * 4096 * 4096 / (time.perf_counter() - t0) / 1e9


def parallel_capacity() -> tuple[float, float]:
    """sgemm GFLOP/s of one process alone and of two processes at once (summed): how much
    of a second core this shared machine offers right now."""
    from multiprocessing import get_context
    with get_context("fork").Pool(2) as pool:
        one = pool.map(_gemm_rate, range(1))[0]
        two = sum(pool.map(_gemm_rate, range(2)))
    return one, two


def session(master: str, extra: dict | None = None):
    from pyspark.sql import SparkSession

    from sparknet.cluster.engine.session import DEFAULT_CONF
    b = SparkSession.builder
    for k, v in DEFAULT_CONF.items():  # the settings sparknet's own sessions get
        b = b.config(k, v)
    b = (b.master(master).appName("bench-model-parallel")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.python.worker.reuse", "true")
         .config("spark.locality.wait.process", "30s").config("spark.driver.memory", "2g")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.executorEnv.OPENBLAS_NUM_THREADS", "1"))
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def wait_executors(spark, n: int, timeout: float = 60) -> None:
    sc = spark.sparkContext
    deadline = time.time() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() < n + 1:
        if time.time() > deadline:
            raise TimeoutError(f"{n} executors did not register in {timeout:.0f} s")
        time.sleep(0.2)


def fmt_bytes(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--in-features", type=int, nargs="+", default=None,
                    help="input features per width (default: 1024 for widths <= 2048, else 4096)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["local", "standalone"],
                    choices=["local", "standalone"],
                    help="K = 2 on local[2] and/or on a standalone cluster (each unpaired and "
                         "paired, its steps alternated with single-process steps)")
    ap.add_argument("--no-lookahead", action="store_true",
                    help="do not run the next batch's first forward pass inside the backward job")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--replicas", type=int, default=1,
                    help="D > 1: print the bytes and Spark jobs per step of D replicas x K = 2 "
                         "blocks (hybrid data x model parallelism) on local[2] instead of timing")
    ap.add_argument("--combine-mib", type=float, default=32,
                    help="with --replicas: MiB of partial gradients the driver collects per piece")
    args = ap.parse_args()
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    ins = args.in_features or [1024 if w <= 2048 else 4096 for w in args.widths]
    if len(ins) == 1:
        ins = ins * len(args.widths)
    grid = [(n_in, w, b) for n_in, w in zip(ins, args.widths) for b in args.batches]
    if args.replicas > 1:
        print_hybrid(grid, args.replicas, int(args.combine_mib * 2**20))
        return

    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')} "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '(unset)')} "
          f"OPENBLAS_NUM_THREADS=1, cores={os.cpu_count()}, load average {os.getloadavg()}",
          flush=True)
    one, two = parallel_capacity()
    print(f"sgemm, one BLAS thread: one process {one:.0f} GFLOP/s, two processes {two:.0f} GFLOP/s "
          f"together (parallel capacity {two / one:.2f}x)", flush=True)
    shm_before = set(glob.glob("/dev/shm/sparknet-resident-blocks-*"))
    rows: dict[tuple, dict] = {}

    def phase(spark, tag: str) -> None:
        for n_in, w, b in grid:
            single = Single(n_in, w)
            for pair in (False, True):
                srow, mrow = bench_pair_of(spark, n_in, w, b, args.steps, args.warmup, pair, single,
                                           lookahead=not args.no_lookahead)
                m = f"{tag}-paired" if pair else tag
                mrow["single_s"] = srow["step_s"]
                mrow["load1"] = os.getloadavg()[0]
                rows[(n_in, w, b, m)] = mrow
                rows.setdefault((n_in, w, b, "single"), srow)
                print(m, n_in, w, b, mrow, flush=True)
            del single
            gc.collect()

    try:
        if "local" in args.modes:
            spark = session("local[2]")
            try:
                phase(spark, "local")
            finally:
                spark.stop()
        if "standalone" in args.modes:
            from helpers.standalone_cluster import StandaloneCluster
            with StandaloneCluster(workers=2, cores=1, memory="12g") as cluster:
                spark = session(cluster.url, {"spark.executor.cores": "1",
                                              "spark.executor.memory": "1g"})
                try:
                    wait_executors(spark, 2)
                    phase(spark, "standalone")
                finally:
                    spark.stop()
    finally:
        for d in set(glob.glob("/dev/shm/sparknet-resident-blocks-*")) - shm_before:
            shutil.rmtree(d, ignore_errors=True)

    print()
    print("| in | width | blocked params | batch | mode | single step (s) | K=2 step (s) | speedup "
          "| block compute (s) | jobs/step | bytes moved/step | load |")
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    out = []
    modes = [m for t in ("local", "standalone") if t in args.modes for m in (t, f"{t}-paired")]
    for n_in, w, b in grid:
        blocked = n_in * w + w * w + 2 * w
        for m in modes:
            r = rows.get((n_in, w, b, m))
            if r is None:
                continue
            sp = r["single_s"] / r["step_s"]
            print(f"| {n_in} | {w} | {blocked / 1e6:.1f}M | {b} | {m} | {r['single_s']:.3f} | "
                  f"{r['step_s']:.3f} | {sp:.2f}x | {r['compute_s']:.3f} | {r['jobs']} | "
                  f"{fmt_bytes(r['moved'])} | {r['load1']:.1f} |")
            out.append({"in": n_in, "width": w, "blocked_params": blocked, "batch": b, "mode": m,
                        **r, "speedup": sp})
    one, two = parallel_capacity()
    print(f"at the end: sgemm one process {one:.0f} GFLOP/s, two processes {two:.0f} GFLOP/s "
          f"together (parallel capacity {two / one:.2f}x); load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()

"""Faults survived: the table of issue 17's closing note.

    python benchmarks/bench_faults.py [--mnist DIR] [--rows 60000] [--epochs 4] [--skip-cluster]

Rows, each against the same fit undisturbed:

* **executor lost** (sync numpy, sync DataFrame, async; a standalone cluster on 127.0.0.1,
  2 workers x 1 core): ``kill -9`` of one worker with its executor JVM and Python
  processes after epoch 2 of an MNIST MLP fit (``tests/helpers/faults_job.py``); the worker is
  started again at once.  Outcome, the recovery line logged, final test accuracy, time lost.
* **model parallel, executor lost**: ``tests/helpers/mp_executor_loss_job.py`` (its own network
  on the digits, an executor killed inside step 20, blocks restored from a checkpoint).
* **driver killed and resumed** (local[2]): ``tests/helpers/resume_job.py`` kills its own driver
  with SIGKILL mid-fit (gradient, average, async), then ``fit(resume=True)`` here.
* **hung task**: a partition whose rounds never return (``inject_faults``), ``round_timeout=5``.
* **divergence**: a 64-256-128-10 MLP, SGD at ``lr=1e3``, sync and async.
* **leaks**: spill folders owned by any of the applications above, and persisted RDDs, after all.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path.insert(0, HERE)
sys.path.insert(0, TESTS)

from _machine import machine_header  # noqa: E402

ROWS: list[tuple[str, str, str, str]] = []
APPS: set[str] = set()


def row(scenario: str, outcome: str, accuracy: str, lost: str) -> None:
    ROWS.append((scenario, outcome, accuracy, lost))
    print(f"  {scenario}: {outcome}; {accuracy}; {lost}", flush=True)


def _acc(out: dict, ref: dict) -> str:
    if "accuracy" not in out or "accuracy" not in ref:
        return "-"
    return f"{100 * out['accuracy']:.2f}% vs {100 * ref['accuracy']:.2f}%"


def executor_loss(mnist: str, rows: int, epochs: int, data_parallel: bool = True) -> None:
    from helpers.standalone_cluster import StandaloneCluster

    base = {"input": "numpy", "mode": "sync", "sync": "average", "local_steps": 25,
            "epochs": epochs, "batch_size": 32, "executors": 2}
    with StandaloneCluster(workers=2, cores=1, memory="3g") as cluster:
        if data_parallel:
            data_parallel_executor_loss(cluster, mnist, rows, base)
        mp_executor_loss(cluster)


def data_parallel_executor_loss(cluster: Any, mnist: str, rows: int, base: dict[str, Any]) -> None:
    from helpers.faults_job import FaultDriver

    driver = FaultDriver(cluster.url, mnist, rows, base=base, ready_timeout=600, warm=True)

    def lose() -> None:
        cluster.kill_worker(1)
        threading.Thread(target=cluster.restart_worker, args=(1,), daemon=True).start()

    try:
        cases: list[tuple[str, dict[str, Any]]] = [("sync, numpy input", {}),
                                                   ("sync, DataFrame input",
                                                    {"input": "dataframe"}),
                                                   ("async, numpy input", {"mode": "async"})]
        for name, kw in cases:
            ref = driver.fit(name=f"{name} undisturbed", timeout=1800, **kw)
            out = driver.fit(name=f"{name} killed", kill_after=2, on_kill=lose, timeout=1800, **kw)
            APPS.update({ref.get("app_id", ""), out.get("app_id", "")})
            lines = [w for w in out.get("warnings", []) if "lost" in w]
            line = next((w for w in lines if "rebuilt partition" in w),
                        lines[0] if lines else "no loss logged")
            outcome = (f"failed: {out['error'][:120]}" if "error" in out else
                       f"finished; {line.split(': ', 2)[-1][:230]}")
            row(f"executor lost, {name}", outcome, _acc(out, ref),
                f"{out['seconds'] - ref['seconds']:+.1f} s (of {ref['seconds']:.1f} s)")
    finally:
        driver.close()


def mp_executor_loss(cluster: Any) -> None:
    job = os.path.join(TESTS, "helpers", "mp_executor_loss_job.py")
    if not os.path.exists(job):
        row("executor lost, model parallel",
            "not run (tests/helpers/mp_executor_loss_job.py missing)", "-", "-")
        return
    deadline = time.time() + 120
    while cluster.alive_workers() < 2 and time.time() < deadline:
        time.sleep(1)
    with tempfile.TemporaryDirectory() as ck:
        proc = subprocess.Popen([sys.executable, job, cluster.url, ck, "20"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None and proc.stdin is not None
        t0 = time.perf_counter()
        line = proc.stdout.readline()
        while line and not line.startswith("PAUSED"):
            line = proc.stdout.readline()
        if line.startswith("PAUSED"):
            executor = line.split()[1]
            for i in list(cluster.workers):
                if any(_executor_id(pid) == executor for pid in cluster.executor_pids(i)):
                    cluster.kill_worker(i)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        out_text, _ = proc.communicate(timeout=1200)
        results = [ln for ln in out_text.splitlines() if ln.startswith("RESULT ")]
        if not results:
            row("executor lost, model parallel", f"failed (exit {proc.returncode})", "-", "-")
            return
        out = json.loads(results[-1][len("RESULT "):])
        acc = (f"{100 * out['test_accuracy']:.2f}% vs {100 * out['ref_test_accuracy']:.2f}% "
               "(training rows)"
               if "test_accuracy" in out and "ref_test_accuracy" in out else "-")
        outcome = (f"failed: {out['error'][:120]}" if "error" in out else
                   f"finished; {out.get('restores')} restore(s), {out.get('steps')} of "
                   f"{out.get('ref_t')} steps, max rel. weight difference "
                   f"{float(out.get('max_rel', float('nan'))):.1e}")
        lost = (f"fit {out['fit_s']:.1f} s on the cluster (in-process reference "
                f"{out['ref_fit_s']:.1f} s); whole job {time.perf_counter() - t0:.1f} s"
                if "fit_s" in out and "ref_fit_s" in out else "-")
        row("executor lost, model parallel", outcome, acc, lost)


def _executor_id(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    return args[args.index("--executor-id") + 1] if "--executor-id" in args else None


def driver_killed() -> None:
    from helpers import resume_job as rj
    from helpers.resume_job import SETTINGS, make_trainer
    from sparknet.datasets import load_digits

    X, y, Xt, yt = load_digits(test_size=0.25, seed=0)
    with tempfile.TemporaryDirectory() as ck:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, rj.__file__, ck], capture_output=True, text=True,
                              timeout=1800)
        killed_s = time.perf_counter() - t0
        # what the killed driver left (the next fit sweeps it too)
        for ln in proc.stdout.splitlines():
            if ln.startswith("SHARD "):
                shutil.rmtree(ln.split(" ", 1)[1], ignore_errors=True)
        spark = rj.session()
        APPS.add(spark.sparkContext.applicationId)
        for mode in SETTINGS:
            fit = SETTINGS[mode]["fit"]
            t1 = time.perf_counter()
            ref_model = make_trainer(mode, spark, None)
            ref_model.fit(X, y, verbose=0, **fit)
            ref_s = time.perf_counter() - t1
            t2 = time.perf_counter()
            trainer = make_trainer(mode, spark, os.path.join(ck, mode))
            trainer.fit(X, y, verbose=0, resume=True, **fit)
            resumed_s = time.perf_counter() - t2
            a, b = trainer.model.params, ref_model.model.params
            same = ("bit-identical weights" if np.array_equal(a, b)
                    else f"max |diff| {np.max(np.abs(a - b)):.1e}")
            acc = (f"{100 * np.mean(trainer.model.predict(Xt) == yt):.2f}% vs "
                   f"{100 * np.mean(ref_model.model.predict(Xt) == yt):.2f}%")
            row(f"driver killed (SIGKILL at round {SETTINGS[mode]['kill_at']}) and resumed, {mode}",
                f"exit {proc.returncode}, resumed: {same}", acc,
                f"resumed part {resumed_s:.1f} s against {ref_s:.1f} s uninterrupted "
                f"(the killed driver ran {killed_s:.0f} s for all three)")


def hung_and_diverged() -> None:
    from sparknet import SGD, Dense, Sequential
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.cluster.engine.session import get_spark
    from sparknet.cluster.testing import inject_faults
    from sparknet.datasets import load_digits

    X, y, _, _ = load_digits(test_size=0.25, seed=0)
    spark = get_spark("local[2]", conf={"spark.ui.enabled": "false"})
    APPS.add(spark.sparkContext.applicationId)

    def model() -> Sequential:
        return Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)

    for mode in ("sync", "async"):
        t0 = time.perf_counter()
        tr = DataParallelTrainer(model(), spark, num_partitions=2, mode=mode, local_steps=5,
                                 round_timeout=5)
        try:
            with inject_faults(delay={1: 3600.0}):
                tr.fit(X, y, epochs=2, verbose=0)
            outcome = "finished (not expected)"
        except Exception as exc:  # noqa: BLE001 - the outcome is the row
            outcome = f"{type(exc).__name__} after {time.perf_counter() - t0:.1f} s"
        row(f"hung task, {mode}, round_timeout=5", outcome, "-", "-")
    for mode in ("sync", "async"):
        m = Sequential([Dense(256, activation="relu"), Dense(128, activation="relu"),
                        Dense(10, activation="softmax")], seed=0)
        tr = DataParallelTrainer(m, spark, num_partitions=2, mode=mode, local_steps=5,
                                 optimizer=SGD(lr=1e3))
        t0 = time.perf_counter()
        try:
            tr.fit(X, y, epochs=3, verbose=0)
            outcome = "finished (not expected)"
        except Exception as exc:  # noqa: BLE001 - the outcome is the row
            outcome = f"{type(exc).__name__}: {str(exc)[:110]}"
        row(f"divergence, {mode}, SGD lr=1e3",
            f"{outcome}; weights finite: {bool(np.isfinite(m.params).all())}",
            "-", f"{time.perf_counter() - t0:.1f} s to stop")
    leaks(spark)


def leaks(spark: Any) -> None:
    from sparknet.cluster.resident import spill

    bases = spill.candidate_bases()
    left = []
    for base in bases:
        for name in os.listdir(base):
            path = os.path.join(base, name, spill.OWNER_FILE)
            if name.startswith(spill.PREFIX) and os.path.exists(path):
                with open(path) as f:
                    if json.load(f).get("app_id") in APPS:
                        left.append(os.path.join(base, name))
    persisted = spark.sparkContext._jsc.getPersistentRDDs().size()
    row("leak check (all of the above)", f"{len(left)} spill folder(s) left in {', '.join(bases)}"
        f"{': ' + ', '.join(left) if left else ''}; {persisted} persisted RDD(s) in this session",
        "-", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mnist", default=os.path.join(HERE, "..", "..", "shared", "data", "mnist"))
    ap.add_argument("--rows", type=int, default=60000,
                    help="MNIST training rows of the executor-loss fits")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--skip-cluster", action="store_true", help="no standalone-cluster rows")
    ap.add_argument("--skip-data-parallel-loss", action="store_true",
                    help="of the standalone-cluster rows, only the model-parallel one")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still stops the cluster
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(machine_header())
    print(f"executor-loss fits: MNIST, first {args.rows} training rows, 10,000 test rows, "
          f"784-128-10 MLP, sync='average' with 25 local steps of 32 rows, {args.epochs} epochs, 2 "
          "partitions", flush=True)
    if not args.skip_cluster:
        executor_loss(os.path.abspath(args.mnist), args.rows, args.epochs,
                      not args.skip_data_parallel_loss)
    driver_killed()
    hung_and_diverged()
    print("\n| scenario | outcome | final accuracy (vs undisturbed) | time lost "
          "|\n|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

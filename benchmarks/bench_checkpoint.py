"""What checkpoints cost a data-parallel fit: the same MNIST fit with and without them.

Real MNIST (60,000 rows, standardised), the MLP 784-512-256-10 (ReLU, softmax, float32),
RMSprop, :class:`~sparknet.cluster.DataParallelTrainer` on ``local[2]`` with 2 partitions,
``sync="average"`` with the outer Nesterov step, numpy input, and a fixed
``--local-steps`` (the trainer's own sizing measures each fit's rounds, which would give
the two fits different schedules).  Fits with ``checkpoint_dir`` (the default interval, ``"epoch"``)
and without alternate, ``--pairs`` times, so a drift of the machine's load hits both alike.
Reported: each fit's training time (the fit's wall time less its set-up: the rounds and the
checkpoints), the checkpoints' own seconds (``history.checkpoints``: in all, and those
spent on the partitions' optimizer state, which comes back with the results of an epoch's
last round), and the ratio with/without of each adjacent pair's training times (their
median).

    python benchmarks/bench_checkpoint.py --mnist ../shared/data/mnist --epochs 2 --pairs 2
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
DEFAULT_MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist"))


def load(mnist_dir: str) -> tuple[np.ndarray, np.ndarray]:
    from sparknet.datasets import load_mnist
    X, y, _Xt, _yt = load_mnist(mnist_dir)
    mean, std = float(X.mean()), float(X.std())
    return ((X - mean) / std).astype(np.float32), y


def fit_once(spark, X, y, args, checkpoint_dir: str | None) -> dict:
    from sparknet import Dense, RMSprop, Sequential
    from sparknet.cluster import DataParallelTrainer

    model = Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                        Dense(10, activation="softmax")], input_shape=(784,), seed=args.seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=args.lr),
                                  local_steps=args.local_steps, outer="nesterov",
                                  checkpoint_dir=checkpoint_dir)
    t0 = time.perf_counter()
    _, h = trainer.fit(X, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    wall = time.perf_counter() - t0
    return {"train": wall - h.setup_time, "ckpt": sum(c["seconds"] for c in h.checkpoints),
            "collect": sum(c["collect"] for c in h.checkpoints), "n_ckpt": len(h.checkpoints),
            "jobs": sum(bool(c["job"]) for c in h.checkpoints),
            "bytes": max((c["bytes"] for c in h.checkpoints), default=0.0), "loss": h["loss"][-1]}


def main(argv: list[str] | None = None) -> int:
    from _machine import machine_header

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mnist", default=DEFAULT_MNIST)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--local-steps", type=int, default=100)
    args = ap.parse_args(argv)
    print(machine_header())
    from sparknet.cluster.engine.session import get_spark
    spark = get_spark("local[2]", app_name="sparknet-bench-checkpoint",
                      conf={"spark.ui.enabled": "false", "spark.driver.memory": "4g",
                            "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    X, y = load(args.mnist)
    print(f"MNIST {X.shape[0]} rows, MLP 784-512-256-10 float32, local[2], 2 partitions, "
          f"{args.epochs} epochs per fit, checkpoint_every='epoch' (default)")
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    root = tempfile.mkdtemp(prefix="sparknet-bench-ckpt-")
    try:
        # warm-up
        fit_once(spark, X[:4096], y[:4096], argparse.Namespace(**{**vars(args), "epochs": 1}), None)
        for i in range(args.pairs):
            for kind in (("without", "with") if i % 2 == 0 else ("with", "without")):
                d = os.path.join(root, f"run{i}") if kind == "with" else None
                r = fit_once(spark, X, y, args, d)
                runs[kind].append(r)
                print(f"pair {i + 1} {kind:>7} checkpoints: training {r['train']:7.2f} s, "
                      f"{r['n_ckpt']} checkpoints {r['ckpt']:.3f} s (partition state "
                      f"{r['collect']:.3f} s, {r['jobs']} collect jobs, {r['bytes'] / 2**20:.1f} "
                      f"MiB each), final loss {r['loss']:.4f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()
    med = {k: float(np.median([r["train"] for r in v])) for k, v in runs.items()}
    pairs = [w["train"] / wo["train"] for w, wo in zip(runs["with"], runs["without"])]
    own = float(np.median([r["ckpt"] / r["train"] for r in runs["with"]]))
    print(f"median training time: without {med['without']:.2f} s, with {med['with']:.2f} s; ratio "
          f"with/without per pair {', '.join(f'{p:.3f}' for p in pairs)} (median "
          f"{np.median(pairs):.3f}); the checkpoints' own share of the fit's training time "
          f"{100 * own:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

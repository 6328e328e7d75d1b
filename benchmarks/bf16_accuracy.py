"""MNIST test accuracy trained in float32 and with ``precision="bf16"``: same nets, seeds, epochs.

Nets (one thread, RMSprop lr 1e-3):

- MLP 784-512-256-10, batch 128;
- CNN c5x5x32-p2-c5x5x64-p2-d128-d10 on 28x28x1, batch 64;
- LSTM 28->128 over the 28 rows of an image + dense 10, batch 128.

Each net is built twice with the same seed and trained for the same epochs on the same
shuffles, once per precision; the table gives the test accuracies (evaluated in float32),
their difference and the training time, and ``--repeat`` more seeds give a spread.

    python benchmarks/bf16_accuracy.py --mnist ../shared/data/mnist [--nets mlp,cnn,lstm]
    python benchmarks/bf16_accuracy.py --quick      # 2000 training images, 1 epoch: a check
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

try:
    import sparknet  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import machine_header  # noqa: E402

from sparknet import LSTM, Conv2D, Dense, Flatten, MaxPool2D, RMSprop, Sequential  # noqa: E402
from sparknet.datasets import load_mnist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(HERE, "..", "..", "shared", "data", "mnist")
#: batch size and default epochs of each net
NETS = {"mlp": (128, 8), "cnn": (64, 4), "lstm": (128, 8)}


def build(name: str, seed: int) -> Sequential:
    if name == "mlp":
        return Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                           Dense(10, activation="softmax")], input_shape=(784,), seed=seed)
    if name == "cnn":
        return Sequential([Conv2D(32, 5, activation="relu"), MaxPool2D(2),
                           Conv2D(64, 5, activation="relu"), MaxPool2D(2), Flatten(),
                           Dense(128, activation="relu"), Dense(10, activation="softmax")],
                          input_shape=(28, 28, 1), seed=seed)
    return Sequential([LSTM(128), Dense(10, activation="softmax")], input_shape=(28, 28), seed=seed)


def shaped(name: str, X: np.ndarray) -> np.ndarray:
    """Flat images (N, 784) as the net's input."""
    if name == "cnn":
        return X.reshape(-1, 28, 28, 1)
    if name == "lstm":
        return X.reshape(-1, 28, 28)
    return X


def train(name: str, precision: str, seed: int, epochs: int, data: tuple[np.ndarray, ...]
          ) -> dict[str, Any]:
    Xtr, ytr, Xte, yte = data
    batch = NETS[name][0]
    model = build(name, seed)
    t0 = time.perf_counter()
    hist = model.fit(shaped(name, Xtr), ytr, epochs=epochs, batch_size=batch,
                     optimizer=RMSprop(lr=1e-3), verbose=0, precision=precision)
    seconds = time.perf_counter() - t0
    res = model.evaluate(shaped(name, Xte), yte)
    return {"net": name, "precision": precision, "seed": seed, "epochs": epochs,
            "test_accuracy": res["accuracy"], "test_loss": res["loss"],
            "train_loss": hist.history["loss"][-1], "train_seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mnist", default=DEFAULT_MNIST, help="folder of the MNIST IDX files")
    ap.add_argument("--nets", default="mlp,cnn,lstm", help="comma-separated subset of mlp,cnn,lstm")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs for every net (default: per net)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="seeds seed, seed+1, ...")
    ap.add_argument("--quick", action="store_true", help="2000 training images, 1 epoch")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    print(machine_header())
    Xtr, ytr, Xte, yte = load_mnist(args.mnist)
    if args.quick:
        Xtr, ytr, Xte, yte = Xtr[:2000], ytr[:2000], Xte[:1000], yte[:1000]
    data = (Xtr, ytr, Xte, yte)
    rows = []
    print(f"\n{'net':5s} {'seed':>4s} {'epochs':>6s} {'fp32 acc':>9s} {'bf16 acc':>9s} "
          f"{'bf16-fp32':>10s} {'fp32 s':>7s} {'bf16 s':>7s}")
    with threadpool_limits(1):
        for name in [n.strip() for n in args.nets.split(",") if n.strip()]:
            if name not in NETS:
                raise SystemExit(f"unknown net {name!r}; choose from {', '.join(NETS)}")
            epochs = 1 if args.quick else (args.epochs or NETS[name][1])
            for seed in range(args.seed, args.seed + args.repeat):
                a = train(name, "fp32", seed, epochs, data)
                b = train(name, "bf16", seed, epochs, data)
                rows += [a, b]
                diff = 100 * (b["test_accuracy"] - a["test_accuracy"])
                print(f"{name:5s} {seed:4d} {epochs:6d} {100 * a['test_accuracy']:8.2f}% "
                      f"{100 * b['test_accuracy']:8.2f}% {diff:+9.2f}pt {a['train_seconds']:7.1f} "
                      f"{b['train_seconds']:7.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

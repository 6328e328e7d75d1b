"""The paper's MNIST accuracies at its networks, ours beside theirs.

FC 784-480-160-10 (the paper: 85-90%) and the CNN conv 5x5x6 - pool - conv 5x5x12 - pool -
conv 4x4x12 - classifier (the paper: 99.0%) on the real MNIST (60,000 training rows, the
10,000 test rows; pixels in [0, 1]), ReLU, RMSprop lr 1e-3, batch 128, trained

* in one process (``Sequential.fit``, one BLAS thread), and
* data parallel on Spark ``local[2]`` (2 partitions, ``DataParallelTrainer`` defaults:
  synchronous average rounds, tau sized by the trainer, the outer Nesterov step),

for ``--fc-epochs`` (5) and ``--cnn-epochs`` (6) epochs: the test accuracy after every
epoch (Spark: when a round ends; a round of several epochs leaves the ones inside it
NaN) and the final one.  Writes ``results/paper_accuracy.csv`` and ``.png``.

    python benchmarks/paper/paper_accuracy.py [--fc-epochs 5] [--cnn-epochs 6]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)

NAME = "paper_accuracy"
PAPER = {"FC 784-480-160-10": ("85-90%", 0.875), "CNN c5x5x6-p-c5x5x12-p-c4x4x12": ("99.0%", 0.990)}


def one_process(make, X, y, Xt, yt, epochs: int) -> dict:
    from sparknet import RMSprop
    model = make()
    t0 = time.perf_counter()
    h = model.fit(X, y, epochs=epochs, batch_size=128, optimizer=RMSprop(lr=1e-3),
                  validation_data=(Xt, yt), verbose=0, num_threads=1)
    return {"train_s": time.perf_counter() - t0, "epoch_s": sum(h["time"]) / epochs,
            "per_epoch": list(h["val_accuracy"]),
            "test_accuracy": float(model.evaluate(Xt, yt)["accuracy"])}


def spark_run(spark, make, X, y, Xt, yt, epochs: int) -> dict:
    model = make()
    t0 = time.perf_counter()
    r = C.data_parallel_fit(spark, model, X, y, 2, 128, epochs, validation=(Xt, yt))
    return {"train_s": time.perf_counter() - t0, "epoch_s": sum(r["epoch_times"]) / epochs,
            "per_epoch": r["val_accuracy"],
            "test_accuracy": float(model.evaluate(Xt, yt)["accuracy"]), "setup_s": r["setup_s"],
            "tau": r["tau"]}


def plot(rows: list[dict]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG", flush=True)
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, net in zip(axes, PAPER):
        if not any(r["net"] == net for r in rows):
            ax.set_visible(False)
            continue
        for r in (r for r in rows if r["net"] == net):
            acc = [100 * a for a in r["per_epoch"]]
            ep = [i + 1 for i, a in enumerate(acc) if not math.isnan(a)]
            ax.plot(ep, [a for a in acc if not math.isnan(a)], marker="o", label=r["run"])
        text, value = PAPER[net]
        if net.startswith("FC"):
            ax.axhspan(85, 90, color="grey", alpha=0.25, label=f"paper: {text}")
        else:
            ax.axhline(100 * value, color="grey", linestyle="--", label=f"paper: {text}")
        ax.set_title(net, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("MNIST test accuracy (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(C.RESULTS, f"{NAME}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {os.path.relpath(path)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=C.DEFAULT_MNIST)
    ap.add_argument("--fc-epochs", type=int, default=5)
    ap.add_argument("--cnn-epochs", type=int, default=6)
    ap.add_argument("--nets", nargs="+", default=["fc", "cnn"], choices=["fc", "cnn"])
    args = ap.parse_args(argv)
    print(C.header("The paper's MNIST accuracies: FC 784-480-160-10 and its CNN, one process "
                   "and local[2]"), flush=True)
    flat = C.mnist(args.mnist)
    img = C.mnist(args.mnist, images=True)
    both = [("FC 784-480-160-10", C.fc_model, flat, args.fc_epochs),
            ("CNN c5x5x6-p-c5x5x12-p-c4x4x12", C.cnn_model, img, args.cnn_epochs)]
    nets = [n for n, key in zip(both, ("fc", "cnn")) if key in args.nets]
    rows: list[dict] = []
    for net, make, (X, y, Xt, yt), epochs in nets:
        r = one_process(make, X, y, Xt, yt, epochs)
        rows.append({"net": net, "run": "one process", "epochs": epochs, **r, "load1": C.load1()})
        print(f"{net}, one process: {epochs} epochs, test accuracy {r['test_accuracy']:.4f} "
              f"(per epoch {', '.join(f'{a:.4f}' for a in r['per_epoch'])}); "
              f"{r['train_s']:.1f} s (load {C.load1():.1f})", flush=True)
    with C.session("local[2]") as spark:
        for net, make, (X, y, Xt, yt), epochs in nets:
            r = spark_run(spark, make, X, y, Xt, yt, epochs)
            rows.append({"net": net, "run": "Spark local[2], 2 partitions", "epochs": epochs, **r,
                         "load1": C.load1()})
            print(f"{net}, local[2]: {epochs} epochs, tau {r['tau']}, "
                  f"test accuracy {r['test_accuracy']:.4f} "
                  f"(per epoch {', '.join(f'{a:.4f}' for a in r['per_epoch'])}); "
                  f"fit {r['train_s']:.1f} s, set-up {r['setup_s']:.1f} s "
                  f"(load {C.load1():.1f})", flush=True)
    for r in rows:
        r["paper_accuracy"] = PAPER[r["net"]][0]
    plot(rows)
    C.write_csv(NAME, [{**r, "per_epoch": " ".join(f"{a:.4f}" for a in r["per_epoch"])}
                       for r in rows])
    print(f"\n{'net':<32}{'run':<30}{'epochs':>7}{'test acc':>10}{'paper':>9}{'s/epoch':>9}")
    for r in rows:
        print(f"{r['net']:<32}{r['run']:<30}{r['epochs']:>7}{100 * r['test_accuracy']:>9.2f}%"
              f"{r['paper_accuracy']:>9}{r['epoch_s']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LSTM training speed, one thread, float32: sparknet vs PyTorch ``nn.LSTM`` in the same run.

The net: LSTM(28 -> 128) over 28 steps, then Dense 10 (softmax cross-entropy), batch 128,
RMSprop.  Both frameworks train on the same random batches with one BLAS/intra-op thread;
the table gives training samples/s and the ratio sparknet / PyTorch.

With ``--mnist DIR`` the same net then trains on the real MNIST read row by row (28 steps
of 28 pixels) and the test accuracy and the training time are reported.

Usage::

    python benchmarks/bench_lstm.py                       # speed table
    python benchmarks/bench_lstm.py --mnist ../shared/data/mnist --epochs 12
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_lstm.py
    python benchmarks/bench_lstm.py --whole-sequence     # ablation: products over all steps

The header names the machine (CPU model, caches, one-thread sgemm rate); the table gives the
median over rounds and, as the spread, the range of the per-round ratio (each sparknet round
is paired with the PyTorch round that follows it).

``run(...)`` returns the numbers as a dict.
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

from _machine import machine_header  # noqa: E402  (the benchmarks folder, put on the path above)

from sparknet import LSTM, Dense, Sequential  # noqa: E402
from sparknet.optim import RMSprop  # noqa: E402


def _batches(n_batches, batch, steps, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n_batches, batch, steps, features), dtype=np.float32)
    y = rng.integers(0, classes, size=(n_batches, batch))
    return X, y


def _make_sparknet(X, y, hidden, classes):
    nb, batch, steps, features = X.shape
    model = Sequential([LSTM(hidden), Dense(classes, activation="softmax")],
                       input_shape=(steps, features), dtype="float32", seed=0)
    opt = RMSprop(lr=1e-3)

    def step(i):
        model.loss_and_grad(X[i % nb], y[i % nb])
        opt.step(model.params, model.grads)

    return step


def _make_torch(X, y, hidden, classes):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    nb, batch, steps, features = X.shape

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(features, hidden, batch_first=True)
            self.fc = torch.nn.Linear(hidden, classes)

        def forward(self, x):
            _, (h, _) = self.lstm(x)
            return self.fc(h[-1])

    net = Net()
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y)

    def step(i):
        opt.zero_grad()
        loss = lossf(net(Xt[i % nb]), yt[i % nb])
        loss.backward()
        opt.step()

    return step


def _timed(step, n):
    w0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        step(i)
    return time.perf_counter() - w0, time.thread_time() - c0


def run(batch: int = 128, steps: int = 28, features: int = 28, hidden: int = 128, classes: int = 10,
        n_steps: int = 5, rounds: int = 12, torch: bool = True, step_kernel: bool = True,
        fused_steps: bool = True) -> dict:
    """Training samples/s of sparknet's and PyTorch's LSTM (one thread, float32).

    The two alternate in ``rounds`` rounds of ``n_steps`` training steps each, so that
    both see the same machine load.  For each, the median over rounds of the wall-clock
    rate is reported, the best round, and the rate by the thread's CPU time (which
    excludes time the thread spent descheduled on a busy machine).

    ``step_kernel=False`` makes sparknet use the BLAS for every product instead of its
    built-in float32 step kernels (AVX-512 or AVX2; an ablation); ``fused_steps=False`` keeps
    the built-in kernels but runs the input projection and the weight gradients as products over all
    steps (:func:`sparknet._recurrent.use_fused_steps`, the order before per-step fusion).

    Returns:
        ``{"config": ..., "sparknet": {...}, "torch": {...} or None, "ratio_wall": ...,
        "ratio_cpu": ..., "openblas_coretype": ...}`` with rates in samples/s.
    """
    import sparknet._recurrent as _recurrent

    X, y = _batches(4, batch, steps, features, classes)
    own = _recurrent.use_step_kernel(step_kernel)
    fused = _recurrent.use_fused_steps(fused_steps)
    config = dict(batch=batch, steps=steps, features=features, hidden=hidden, classes=classes,
                  n_steps=n_steps, rounds=rounds,
                  step_kernels=_recurrent.step_kernel_isa() if own else None, fused_steps=own
                  and fused)
    res: dict[str, Any] = {"config": config,
                           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(unset)")}
    with threadpool_limits(1):
        steppers = {"sparknet": _make_sparknet(X, y, hidden, classes)}
        if torch:
            try:
                steppers["torch"] = _make_torch(X, y, hidden, classes)
            except ImportError as exc:
                print(f"PyTorch not importable ({exc}); skipping the comparison", file=sys.stderr)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in steppers}
        for st in steppers.values():   # warm-up
            _timed(st, 3)
        for _ in range(rounds):
            for k, st in steppers.items():
                times[k].append(_timed(st, n_steps))
    _recurrent.use_step_kernel(True)
    _recurrent.use_fused_steps(True)
    for k, tl in times.items():
        wall = np.array([w for w, _ in tl])
        cpu = np.array([c for _, c in tl])
        res[k] = {"wall_median": batch * n_steps / float(np.median(wall)),
                  "wall_best": batch * n_steps / float(wall.min()),
                  "cpu": batch * n_steps / float(np.median(cpu))}
    res.setdefault("torch", None)
    if res["torch"]:
        res["ratio_wall"] = res["sparknet"]["wall_median"] / res["torch"]["wall_median"]
        res["ratio_best"] = res["sparknet"]["wall_best"] / res["torch"]["wall_best"]
        res["ratio_cpu"] = res["sparknet"]["cpu"] / res["torch"]["cpu"]
        # per-round ratios (a sparknet round against the PyTorch round right after it)
        pw = [t / s for (s, _), (t, _) in zip(times["sparknet"], times["torch"])]
        pc = [t / s for (_, s), (_, t) in zip(times["sparknet"], times["torch"])]
        res["ratio_wall_range"] = (min(pw), max(pw))
        res["ratio_cpu_range"] = (min(pc), max(pc))
    return res


def run_mnist(path: str, epochs: int = 12, batch: int = 128, hidden: int = 128, lr: float = 1e-3,
              verbose: int = 0) -> dict:
    """Train LSTM(28 -> hidden) + Dense 10 on MNIST read row by row; returns accuracy and time."""
    from sparknet.datasets import load_mnist

    Xtr, ytr, Xte, yte = load_mnist(path, flat=True)
    Xtr, Xte = Xtr.reshape(-1, 28, 28), Xte.reshape(-1, 28, 28)
    model = Sequential([LSTM(hidden), Dense(10, activation="softmax")], input_shape=(28, 28),
                       seed=0)
    opt = RMSprop(lr=lr)
    per_epoch = []
    t0 = time.perf_counter()
    with threadpool_limits(1):
        for e in range(epochs):
            if e == epochs - 2:      # a lower rate for the last two epochs
                opt.lr = lr / 4
            h = model.fit(Xtr, ytr, epochs=1, batch_size=batch, optimizer=opt, verbose=verbose)
            acc = model.evaluate(Xte, yte)["accuracy"]
            per_epoch.append({"epoch": e + 1, "train_loss": h["loss"][-1], "test_accuracy": acc,
                              "elapsed_s": time.perf_counter() - t0})
            print(f"  epoch {e + 1}/{epochs}: train loss {h['loss'][-1]:.4f}, test accuracy "
                  f"{acc:.4f}, {time.perf_counter() - t0:.0f} s", flush=True)
    return {"epochs": epochs, "batch": batch, "hidden": hidden, "lr": lr,
            "test_accuracy": per_epoch[-1]["test_accuracy"],
            "train_time_s": time.perf_counter() - t0, "per_epoch": per_epoch}


def report(res: dict) -> None:
    """Print the table of :func:`run`'s result."""
    c = res["config"]
    isa = {"avx512": "AVX-512", "avx2": "AVX2"}.get(c["step_kernels"])
    kernels = ("BLAS only" if isa is None else f"{isa} step kernels, fused steps"
               if c["fused_steps"] else f"{isa} step kernels, whole-sequence products")
    print(f"LSTM {c['features']}->{c['hidden']} x {c['steps']} steps + Dense {c['classes']}, batch "
          f"{c['batch']}, float32, 1 thread, RMSprop "
          f"(OPENBLAS_CORETYPE={res['openblas_coretype']}, {kernels}); training samples/s")
    print(f"{'':<10}{'wall median':>13}{'wall best':>11}{'CPU time':>10}")
    for k in ("sparknet", "torch"):
        if res.get(k):
            r = res[k]
            print(f"{k:<10}{r['wall_median']:>13,.0f}{r['wall_best']:>11,.0f}{r['cpu']:>10,.0f}")
    if res["torch"]:
        print(f"{'ratio':<10}{res['ratio_wall']:>12.2f}x{res['ratio_best']:>10.2f}x"
              f"{res['ratio_cpu']:>9.2f}x   (sparknet / PyTorch)")
        (wl, wh), (cl, ch) = res["ratio_wall_range"], res["ratio_cpu_range"]
        print(f"per-round ratio range: wall {wl:.2f}-{wh:.2f}x, CPU time {cl:.2f}-{ch:.2f}x "
              f"({c['rounds']} alternating rounds of {c['n_steps']} steps)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--n-steps", type=int, default=5, help="training steps per round")
    ap.add_argument("--rounds", type=int, default=12, help="alternating timed rounds")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--blas", action="store_true",
                    help="use the BLAS for every product (not the built-in step kernels)")
    ap.add_argument("--whole-sequence", action="store_true",
                    help="built-in kernels, but the input projection and weight gradients as "
                         "products over all steps (ablation)")
    ap.add_argument("--mnist", metavar="DIR", help="also train on MNIST rows from this folder")
    ap.add_argument("--epochs", type=int, default=12, help="MNIST epochs")
    ap.add_argument("--lr", type=float, default=1e-3, help="MNIST RMSprop learning rate")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    print(machine_header())
    res = run(batch=args.batch, hidden=args.hidden, n_steps=args.n_steps, rounds=args.rounds,
              torch=not args.no_torch, step_kernel=not args.blas,
              fused_steps=not args.whole_sequence)
    report(res)
    if args.mnist:
        if not os.path.isdir(args.mnist):
            print(f"MNIST folder {args.mnist!r} not found", file=sys.stderr)
            return 2
        print(f"MNIST as sequences (28 steps of 28 pixels), {args.epochs} epochs:")
        res["mnist"] = run_mnist(args.mnist, epochs=args.epochs, batch=args.batch,
                                 hidden=args.hidden, lr=args.lr)
        m = res["mnist"]
        print(f"MNIST test accuracy {m['test_accuracy']:.4f} after {m['train_time_s']:.0f} s "
              f"({m['epochs']} epochs, including per-epoch evaluation)")
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MLP 784-512-256-10 training throughput, one BLAS thread: sparknet vs plain numpy vs PyTorch.

The three (and the machine's one-thread sgemm rate) alternate in ``--rounds`` rounds, so that a
machine whose clock drifts (cloud CPUs do, by 20% within a minute) weighs on all of them alike;
the rates are the medians over rounds and the ratios the medians of the per-round ratios.

Also: the GEMM GFLOP/s the training step reaches against that sgemm rate, two threads training
two models (the kernels release the GIL), and with ``--mnist DIR`` the test accuracy and time on
the real MNIST.

    python benchmarks/bench_mlp.py [--seconds 3] [--rounds 6] [--mnist ../shared/data/mnist]
"""
from __future__ import annotations

import argparse
import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sparknet import Dense, RMSprop, Sequential, _blas

SIZES = (784, 512, 256, 10)
BATCH = 128


def make_batches(n_batches=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n_batches, BATCH, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], (n_batches, BATCH))
    return X, y


def sparknet_model(seed=0):
    return Sequential([Dense(SIZES[1], activation="relu"), Dense(SIZES[2], activation="relu"),
                       Dense(SIZES[3], activation="softmax")], input_shape=(SIZES[0],), seed=seed)


def time_loop(step, n_batches, seconds):
    """Run step(i) repeatedly; return steps per second after a warm-up."""
    for i in range(3):
        step(i % n_batches)
    t0 = time.perf_counter()
    k = 0
    while time.perf_counter() - t0 < seconds:
        step(k % n_batches)
        k += 1
    return k / (time.perf_counter() - t0)


def sparknet_step(X, y):
    model = sparknet_model()
    opt = RMSprop(lr=1e-3)

    def step(i):
        model.loss_and_grad(X[i], y[i])
        opt.step(model.params, model.grads)

    return step


class NumpyMLP:
    """The same step in plain numpy: matmuls, relu, softmax cross-entropy, unfused RMSprop."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.W = [rng.standard_normal((o, i)).astype(np.float32) * np.float32(np.sqrt(2 / i))
                  for i, o in zip(SIZES[:-1], SIZES[1:])]
        self.b = [np.zeros(o, np.float32) for o in SIZES[1:]]
        self.v = [np.zeros_like(a) for a in self.W + self.b]

    def step(self, x, y, lr=1e-3, alpha=0.99, eps=1e-8):
        acts = [x]
        for k, (W, b) in enumerate(zip(self.W, self.b)):
            z = acts[-1] @ W.T + b
            acts.append(np.maximum(z, 0) if k < len(self.W) - 1 else z)
        z = acts[-1]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        d = p / len(y)
        gW, gb = [None] * len(self.W), [None] * len(self.W)
        for k in range(len(self.W) - 1, -1, -1):
            gW[k] = d.T @ acts[k]
            gb[k] = d.sum(0)
            if k:
                d = (d @ self.W[k]) * (acts[k] > 0)
        for p_, g, v in zip(self.W + self.b, gW + gb, self.v):
            v *= alpha
            v += (1 - alpha) * g * g
            p_ -= lr * g / (np.sqrt(v) + eps)


def numpy_step(X, y):
    net = NumpyMLP()
    return lambda i: net.step(X[i], y[i])


def torch_step(X, y):
    """PyTorch's step on the same net, or None when PyTorch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = lossf(net(Xt[i]), yt[i])
        loss.backward()
        opt.step()

    return step


def sgemm_gflops(seconds=1.0):
    """Machine sgemm rate (one thread) through the same BLAS the kernels call."""
    n = 1024
    A = np.random.default_rng(0).random((n, n), dtype=np.float32)
    C = np.empty_like(A)
    _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
        k += 1
    return 2 * n ** 3 * k / (time.perf_counter() - t0) / 1e9


def products_gflops(seconds=0.5):
    """The step's five products alone (the BLAS calls of ``sparknet._dense``, same shapes and
    transposes: forward ``X @ W.T``, ``dW = dZ.T @ X``, ``dX = dZ @ W`` but the first), one
    thread: what the step's GEMMs reach without the optimizer, activations and Python."""
    rng = np.random.default_rng(1)
    calls = []
    for k, (i, o) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        X = rng.random((BATCH, i), dtype=np.float32)
        W = rng.random((o, i), dtype=np.float32)
        dZ = rng.random((BATCH, o), dtype=np.float32)
        calls.append((False, True, X, W, np.empty((BATCH, o), np.float32)))
        calls.append((True, False, dZ, X, np.empty((o, i), np.float32)))
        if k:
            calls.append((False, False, dZ, W, np.empty((BATCH, i), np.float32)))
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for ta, tb, A, B, C in calls:
            _blas.py_gemm(ta, tb, 1.0, A, B, 0.0, C)
        n += 1
    return step_flops() * n / (time.perf_counter() - t0) / 1e9


def step_flops():
    f = 0
    for k, (i, o) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        f += 2 * BATCH * i * o * (2 if k == 0 else 3)  # forward, dW, and dX except the first layer
    return f


def bench_two_threads(X, y, seconds):
    models = [sparknet_model(seed=s) for s in (0, 1)]
    opts = [RMSprop(lr=1e-3) for _ in models]
    counts = [0, 0]
    stop = threading.Event()

    def worker(j):
        m, o = models[j], opts[j]
        i = 0
        while not stop.is_set():
            m.loss_and_grad(X[i % len(X)], y[i % len(y)])
            o.step(m.params, m.grads)
            counts[j] += 1
            i += 1

    threads = [threading.Thread(target=worker, args=(j,)) for j in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    c0, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    c1, t1 = sum(counts), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    return (c1 - c0) / (t1 - t0) * BATCH


def mnist_accuracy(mnist_dir, epochs=12):
    from sparknet.datasets import load_mnist
    Xtr, ytr, Xte, yte = load_mnist(mnist_dir)
    model = Sequential([Dense(512, activation="relu"), Dense(256, activation="relu"),
                        Dense(10, activation="softmax")], seed=0)
    opt = RMSprop(lr=1e-3)
    t0 = time.perf_counter()
    best = None
    for ep in range(epochs):
        if ep == 8:
            opt.lr = 3e-4
        if ep == 10:
            opt.lr = 1e-4
        model.fit(Xtr, ytr, epochs=1, batch_size=BATCH, optimizer=opt, verbose=0)
        acc = model.evaluate(Xte, yte)["accuracy"]
        elapsed = time.perf_counter() - t0
        print(f"  MNIST epoch {ep + 1}: test accuracy {acc:.4f} at {elapsed:.1f} s", flush=True)
        if best is None and acc >= 0.98:
            best = elapsed
    return acc, time.perf_counter() - t0, best


def run(seconds: float = 3.0, mnist_dir: str | None = None, rounds: int = 6) -> dict:
    """Samples/s of each implementation (``seconds`` of timing each, in ``rounds`` alternating
    rounds), the machine's sgemm rate measured between them, and the two-thread rate."""
    X, y = make_batches()
    res: dict = {}
    with threadpool_limits(1):
        steps = {"sparknet": sparknet_step(X, y), "numpy": numpy_step(X, y),
                 "torch": torch_step(X, y)}
        steps = {k: st for k, st in steps.items() if st is not None}
        rates: dict[str, list[float]] = {k: [] for k in steps}
        sgemm, products = [], []
        for _ in range(rounds):
            sgemm.append(sgemm_gflops(min(1.0, seconds / rounds)))
            products.append(products_gflops(min(0.5, seconds / rounds)))
            for k, st in steps.items():
                rates[k].append(time_loop(st, len(X), seconds / rounds) * BATCH)
        res["gemm_gflops_machine"] = float(np.median(sgemm))
        res["products_gflops"] = float(np.median(products))
        res["products_share_per_round"] = float(np.median(np.array(products) / sgemm))
        for k in ("sparknet", "numpy", "torch"):
            res[k] = float(np.median(rates[k])) if k in rates else None
        for k in ("numpy", "torch"):
            if k in rates:
                res[f"ratio_{k}"] = float(np.median(np.array(rates["sparknet"]) / rates[k]))
        res["gemm_share_per_round"] = float(np.median(
            [step_flops() * r / BATCH / 1e9 / g for r, g in zip(rates["sparknet"], sgemm)]))
        res["sparknet_2_threads"] = bench_two_threads(X, y, seconds)
    res["step_gflops"] = step_flops() * res["sparknet"] / BATCH / 1e9
    if mnist_dir:
        with threadpool_limits(1):
            got = mnist_accuracy(mnist_dir)
            res["mnist_accuracy"], res["mnist_seconds"], res["mnist_seconds_to_98"] = got
    return res


def report(res: dict) -> None:
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, RMSprop, one BLAS thread")
    print(f"{'implementation':<28}{'samples/s':>12}{'vs sparknet':>14}")
    for key in ("sparknet", "numpy", "torch"):
        v = res.get(key)
        if v is None:
            print(f"{key:<28}{'n/a (not installed)':>26}")
            continue
        print(f"{key:<28}{v:>12,.0f}{res['sparknet'] / v:>13.2f}x")
    if res.get("torch"):
        print(f"sparknet / PyTorch: {res['ratio_torch']:.2f}x   "
              f"sparknet / numpy: {res['ratio_numpy']:.2f}x   (medians of the per-round ratios)")
    print(f"GEMM rate in the step: {res['step_gflops']:.1f} GFLOP/s of a machine sgemm rate of "
          f"{res['gemm_gflops_machine']:.1f} GFLOP/s "
          f"({res['gemm_share_per_round']:.0%}, median per round: all the step's time counted, "
          f"optimizer and activations too); ceiling "
          f"{res['gemm_gflops_machine'] * 1e9 / step_flops() * BATCH:,.0f} samples/s")
    print(f"the step's products alone (the same BLAS calls): {res['products_gflops']:.1f} GFLOP/s "
          f"({res['products_share_per_round']:.0%} of the sgemm rate, median per round)")
    print(f"two threads, two models: {res['sparknet_2_threads']:,.0f} samples/s = "
          f"{res['sparknet_2_threads'] / res['sparknet']:.2f}x one thread")
    if "mnist_accuracy" in res:
        print(f"MNIST: test accuracy {res['mnist_accuracy']:.4f} after {res['mnist_seconds']:.1f} "
              f"s (>= 98% first reached at {res['mnist_seconds_to_98']} s)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="timing per implementation")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    ap.add_argument("--mnist", default=None, help="MNIST folder (e.g. ../shared/data/mnist)")
    args = ap.parse_args()
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    report(run(args.seconds, args.mnist, args.rounds))

"""CNN training throughput, one BLAS thread, float32: sparknet vs PyTorch vs plain numpy.

The net: conv 5x5x32 (valid, relu) -> maxpool 2 -> conv 5x5x64 (valid, relu) -> maxpool 2
-> dense 128 (relu) -> dense 10 (softmax cross-entropy), on 28x28x1 images, batch 64,
RMSprop (lr 1e-3) for all three.  The contenders run in interleaved rounds in the same
process and each one's best round is kept (the machine is shared, so the best round is
the least disturbed one).  Also printed: where the conv kernels spend their time (GEMM
against im2col/col2im and the elementwise passes), and with ``--mnist DIR`` the test
accuracy and wall time of a CNN trained on the real MNIST.

    python benchmarks/bench_cnn.py [--seconds 12] [--batch 64] [--mnist ../shared/data/mnist]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from threadpoolctl import threadpool_limits

from sparknet import Conv2D, Dense, Flatten, MaxPool2D, RMSprop, Sequential, _blas, _conv

N_BATCHES = 8


def make_batches(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.random((N_BATCHES, batch, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, (N_BATCHES, batch))
    return X, y


def sparknet_cnn(seed: int = 0) -> Sequential:
    """The benchmark CNN (channels-last)."""
    return Sequential([
        Conv2D(32, 5, activation="relu"), MaxPool2D(2),
        Conv2D(64, 5, activation="relu"), MaxPool2D(2),
        Flatten(), Dense(128, activation="relu"), Dense(10, activation="softmax"),
    ], input_shape=(28, 28, 1), seed=seed)


# --------------------------------------------------------------- contenders
class SparknetStep:
    name = "sparknet"

    def __init__(self, X, y):
        self.model, self.opt, self.X, self.y = sparknet_cnn(), RMSprop(lr=1e-3), X, y

    def __call__(self, i):
        self.model.loss_and_grad(self.X[i], self.y[i])
        self.opt.step(self.model.params, self.model.grads)


class SparknetBlasStep(SparknetStep):
    """sparknet with its float32 conv GEMMs on BLAS instead of the AVX-512 kernel."""
    name = "sparknet_blas"

    def __call__(self, i):
        _conv.set_gemm_backend("blas")
        try:
            super().__call__(i)
        finally:
            _conv.set_gemm_backend("auto")


class TorchStep:
    """PyTorch's step on NCHW tensors as a user's data loader hands them over (canonical
    strides); ``channels_last=True`` converts the net and the batches to the channels-last
    layout, which PyTorch's CPU tuning guides recommend (1.1-1.3x here)."""

    name = "torch"

    def __init__(self, X, y, channels_last: bool = False):
        import torch
        torch.set_num_threads(1)
        torch.manual_seed(0)
        nn = torch.nn
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))
        self.opt = torch.optim.RMSprop(self.net.parameters(), lr=1e-3)
        self.lossf = nn.CrossEntropyLoss()
        # NCHW with canonical strides (.copy(): with one channel, ascontiguousarray would keep
        # the view, whose channel stride PyTorch reads as channels-last)
        self.X = torch.from_numpy(X.transpose(0, 1, 4, 2, 3).copy())
        self.y = torch.from_numpy(y)
        if channels_last:
            self.name = "torch_cl"
            self.net = self.net.to(memory_format=torch.channels_last)
            self.X = [x.contiguous(memory_format=torch.channels_last) for x in self.X]

    def __call__(self, i):
        self.opt.zero_grad(set_to_none=True)
        loss = self.lossf(self.net(self.X[i]), self.y[i])
        loss.backward()
        self.opt.step()


class NumpyCNN:
    """The same net in plain numpy: im2col by strided views, matmul, reshape pooling,
    softmax cross-entropy, an unfused RMSprop."""

    name = "numpy"

    def __init__(self, X, y, seed=0):
        rng = np.random.default_rng(seed)

        def he(shape, fan_in):
            return (rng.uniform(-1, 1, shape) * np.sqrt(6 / fan_in)).astype(np.float32)

        self.p = {"w1": he((25, 32), 25), "b1": np.zeros(32, np.float32),
                  "w2": he((800, 64), 800), "b2": np.zeros(64, np.float32),
                  "w3": he((1024, 128), 1024), "b3": np.zeros(128, np.float32),
                  "w4": he((128, 10), 128), "b4": np.zeros(10, np.float32)}
        self.v = {k: np.zeros_like(a) for k, a in self.p.items()}
        self.X, self.y = X, y

    @staticmethod
    def conv(x, w, b, k):
        n, h, wd, c = x.shape
        cols = sliding_window_view(x, (k, k), axis=(1, 2))          # n, oh, ow, c, k, k
        oh, ow = cols.shape[1], cols.shape[2]
        cols = cols.transpose(0, 1, 2, 4, 5, 3).reshape(n * oh * ow, k * k * c)
        z = cols @ w + b
        return np.maximum(z, 0).reshape(n, oh, ow, -1), cols

    @staticmethod
    def conv_back(dz, cols, w, x_shape, k):
        n, h, wd, c = x_shape
        oh, ow, f = dz.shape[1:]
        dz2 = dz.reshape(-1, f)
        dw = cols.T @ dz2
        db = dz2.sum(0)
        dcols = (dz2 @ w.T).reshape(n, oh, ow, k, k, c)
        dx = np.zeros(x_shape, np.float32)
        for i in range(k):
            for j in range(k):
                dx[:, i:i + oh, j:j + ow, :] += dcols[:, :, :, i, j, :]
        return dx, dw, db

    @staticmethod
    def pool(a):
        n, h, w, c = a.shape
        r = a.reshape(n, h // 2, 2, w // 2, 2, c)
        m = r.max(axis=(2, 4))
        mask = r == m[:, :, None, :, None, :]
        return m, mask

    @staticmethod
    def pool_back(dm, mask):
        n, oh, _, ow, _, c = mask.shape
        return (mask * dm[:, :, None, :, None, :]).reshape(n, oh * 2, ow * 2, c)

    def __call__(self, i, lr=1e-3, alpha=0.99, eps=1e-8):
        p, x, y = self.p, self.X[i], self.y[i]
        n = x.shape[0]
        a1, c1 = self.conv(x, p["w1"], p["b1"], 5)
        m1, k1 = self.pool(a1)
        a2, c2 = self.conv(m1, p["w2"], p["b2"], 5)
        m2, k2 = self.pool(a2)
        f = m2.reshape(n, -1)
        h = np.maximum(f @ p["w3"] + p["b3"], 0)
        z = h @ p["w4"] + p["b4"]
        e = np.exp(z - z.max(1, keepdims=True))
        e /= e.sum(1, keepdims=True)
        e[np.arange(n), y] -= 1
        dz = e / n
        g = {"w4": h.T @ dz, "b4": dz.sum(0)}
        dh = (dz @ p["w4"].T) * (h > 0)
        g["w3"], g["b3"] = f.T @ dh, dh.sum(0)
        dm2 = (dh @ p["w3"].T).reshape(m2.shape)
        da2 = self.pool_back(dm2, k2) * (a2 > 0)
        dm1, g["w2"], g["b2"] = self.conv_back(da2, c2, p["w2"], m1.shape, 5)
        da1 = self.pool_back(dm1, k1) * (a1 > 0)
        _, g["w1"], g["b1"] = self.conv_back(da1, c1, p["w1"], x.shape, 5)
        for k in p:
            v = self.v[k]
            v *= alpha
            v += (1 - alpha) * g[k] * g[k]
            p[k] -= lr * g[k] / (np.sqrt(v) + eps)


# ---------------------------------------------------------------- timing
def timed_rounds(steps, batch: int, seconds: float, rounds: int = 4) -> dict[str, float]:
    """Interleave the contenders for ``rounds`` rounds of ``seconds / rounds`` each.

    Returns, per contender, its best samples per second of process CPU time (the rate
    of one busy core: robust to other processes sharing the machine; with one thread it
    equals the wall-clock rate on an idle machine), and its wall-clock samples/s and
    CPU/wall ratio in that round (a ratio near 1 means the core was ours)."""
    for s in steps:
        for i in range(3):
            s(i % N_BATCHES)
    res: dict[str, float] = {s.name: 0.0 for s in steps}
    per = seconds / rounds
    for _ in range(rounds):
        for s in steps:
            t0, c0, k = time.perf_counter(), time.process_time(), 0
            while time.process_time() - c0 < per:
                s(k % N_BATCHES)
                k += 1
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if k * batch / cpu > res[s.name]:
                res[s.name] = k * batch / cpu
                res[s.name + "_wall"] = k * batch / wall
                res[s.name + "_cpu_per_wall"] = cpu / wall
    return res


def conv_profile(X, y, n_steps: int = 40) -> dict:
    """CPU seconds per training step spent in each phase of the two conv layers, against
    the whole step (thread CPU time: robust to other processes on the machine)."""
    step = SparknetStep(X, y)
    for i in range(3):
        step(i)
    _conv.set_profiling(True)
    t0 = time.thread_time()
    for i in range(n_steps):
        step(i % N_BATCHES)
    total = time.thread_time() - t0
    prof = _conv.profile()
    _conv.set_profiling(False)
    out = {k: v / n_steps for k, v in prof.items()}
    out["step_total"] = total / n_steps
    return out


def sgemm_gflops(seconds: float = 1.0) -> float:
    """BLAS sgemm rate (1024^3, per CPU second) through the BLAS sparknet links."""
    n = 1024
    A = np.random.default_rng(0).random((n, n), dtype=np.float32)
    C = np.empty_like(A)
    _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
    t0, k = time.process_time(), 0
    while time.process_time() - t0 < seconds:
        _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
        k += 1
    return 2 * n ** 3 * k / (time.process_time() - t0) / 1e9


def step_gemm_flops(batch: int) -> float:
    """GEMM flops of one training step (forward, weight grad, input grad except conv 1)."""
    c1 = 2 * batch * 24 * 24 * 25 * 32
    c2 = 2 * batch * 8 * 8 * 800 * 64
    d1 = 2 * batch * 1024 * 128
    d2 = 2 * batch * 128 * 10
    return 2 * c1 + 3 * c2 + 3 * d1 + 3 * d2  # the first layer computes no input gradient


# ------------------------------------------------------------------ MNIST
def mnist_cnn(seed: int = 0) -> Sequential:
    """The MNIST model: the benchmark CNN with dropout before and after the dense layer."""
    from sparknet import Dropout
    return Sequential([
        Conv2D(32, 5, activation="relu"), MaxPool2D(2),
        Conv2D(64, 5, activation="relu"), MaxPool2D(2),
        Flatten(), Dropout(0.25), Dense(128, activation="relu"), Dropout(0.25),
        Dense(10, activation="softmax"),
    ], input_shape=(28, 28, 1), seed=seed)


def mnist_run(mnist_dir: str, epochs: int = 8, threads: int = 1) -> dict:
    """Train :func:`mnist_cnn` on the 60,000 MNIST training images (batch 64, RMSprop
    1e-3, then 3e-4 and 1e-4 for the last two epochs) and report the test accuracy
    after each epoch, the wall time and the CPU time (evaluation included)."""
    from sparknet.datasets import load_mnist
    Xtr, ytr, Xte, yte = load_mnist(mnist_dir, flat=False)
    model = mnist_cnn()
    opt = RMSprop(lr=1e-3)
    lrs = {epochs - 2: 3e-4, epochs - 1: 1e-4}
    t0, c0 = time.perf_counter(), time.process_time()
    accs = []
    with threadpool_limits(threads):
        for ep in range(epochs):
            opt.lr = lrs.get(ep, opt.lr)
            model.fit(Xtr, ytr, epochs=1, batch_size=64, optimizer=opt, verbose=0)
            acc = model.evaluate(Xte, yte)["accuracy"]
            accs.append(acc)
            print(f"  MNIST epoch {ep + 1}/{epochs}: test accuracy {acc:.4f} at "
                  f"{time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU",
                  flush=True)
    return {"mnist_test_accuracy": accs[-1], "mnist_seconds": time.perf_counter() - t0,
            "mnist_cpu_seconds": time.process_time() - c0,
            "mnist_epochs": epochs, "mnist_blas_threads": threads, "mnist_accuracies": accs}


# -------------------------------------------------------------------- run
def run(batch: int = 64, seconds: float = 12.0, mnist_dir: str | None = None,
        mnist_epochs: int = 8) -> dict:
    """Measure and return samples/s of the three contenders, their ratios, the conv
    profile and (with ``mnist_dir``) the MNIST accuracy and time."""
    X, y = make_batches(batch)
    res: dict = {"batch": batch, "gemm_backend": _conv.gemm_backend()}
    with threadpool_limits(1):
        res["sgemm_gflops_machine"] = sgemm_gflops()
        steps = [SparknetStep(X, y), NumpyCNN(X, y)]
        if _conv.gemm_backend() == "avx512":
            steps.insert(1, SparknetBlasStep(X, y))
        try:
            steps.append(TorchStep(X, y))
            steps.append(TorchStep(X, y, channels_last=True))
        except ImportError:
            print("torch is not installed: PyTorch column skipped")
        res.update(timed_rounds(steps, batch, seconds))
        res["profile"] = conv_profile(X, y)
    res["step_gemm_gflops"] = step_gemm_flops(batch) * res["sparknet"] / batch / 1e9
    if "torch" in res:
        res["sparknet/torch"] = res["sparknet"] / res["torch"]
        res["sparknet/torch_cl"] = res["sparknet"] / res["torch_cl"]
        if "sparknet_blas" in res:
            res["sparknet_blas/torch"] = res["sparknet_blas"] / res["torch"]
        res["numpy/torch"] = res["numpy"] / res["torch"]
    res["sparknet/numpy"] = res["sparknet"] / res["numpy"]
    if mnist_dir:
        res.update(mnist_run(mnist_dir, epochs=mnist_epochs))
    return res


def report(res: dict) -> None:
    """Print the table of samples/s and ratios, the conv profile and the MNIST result."""
    print(f"CNN c5x5x32-p2-c5x5x64-p2-d128-d10, 28x28x1, batch {res['batch']}, float32, "
          f"1 BLAS thread (machine sgemm {res['sgemm_gflops_machine']:.0f} GFLOP/s; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')})")
    print(f"float32 conv GEMM: {res['gemm_backend']} (sparknet_blas: the same with BLAS GEMMs "
          f"and portable loops)")
    print(f"{'':14}{'samples/s':>11}{'vs torch':>10}{'wall s/s':>10}{'cpu/wall':>10}")
    for k in ("sparknet", "sparknet_blas", "torch", "torch_cl", "numpy"):
        if k in res:
            ratio = f"{res[k] / res['torch']:.2f}x" if "torch" in res else "-"
            print(f"{k:14}{res[k]:11.0f}{ratio:>10}{res[k + '_wall']:10.0f}"
                  f"{res[k + '_cpu_per_wall']:10.2f}")
    print("(samples/s = per second of CPU time, one thread; wall s/s = per wall-clock second; "
          "torch: NCHW tensors, torch_cl: channels-last)")
    if "torch_cl" in res:
        print(f"sparknet / PyTorch channels-last {res['sparknet/torch_cl']:.2f}x")
    print(f"sparknet/numpy {res['sparknet/numpy']:.2f}x; the step's GEMM flops over the whole "
          f"step time: {res['step_gemm_gflops']:.1f} GFLOP/s")
    prof = res["profile"]
    tot = prof["step_total"]
    conv = sum(v for k, v in prof.items() if k != "step_total")
    print(f"conv kernel time per step: {1e3 * conv:.2f} ms of a {1e3 * tot:.2f} ms step")
    for k, v in prof.items():
        if k != "step_total":
            print(f"  {k:28}{1e3 * v:8.2f} ms  {100 * v / conv:5.1f}% of conv")
    gemm = sum(v for k, v in prof.items() if k.startswith("gemm"))
    print(f"  GEMM {100 * gemm / conv:.0f}%, im2col+col2im "
          f"{100 * (prof['im2col'] + prof['col2im']) / conv:.0f}%, elementwise "
          f"{100 * (prof['bias_activation'] + prof['activation_grad_bias_grad']) / conv:.0f}%")
    if "mnist_test_accuracy" in res:
        print(f"MNIST: test accuracy {res['mnist_test_accuracy']:.4f} after {res['mnist_epochs']} "
              f"epochs in {res['mnist_seconds']:.0f} s wall, {res['mnist_cpu_seconds']:.0f} s CPU "
              f"({res['mnist_blas_threads']} BLAS threads)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=12.0,
                    help="measuring time per contender (split into 4 interleaved rounds)")
    ap.add_argument("--mnist", default=None, help="MNIST folder: also train and report accuracy")
    ap.add_argument("--mnist-epochs", type=int, default=8)
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    report(run(batch=args.batch, seconds=args.seconds, mnist_dir=args.mnist,
                mnist_epochs=args.mnist_epochs))


if __name__ == "__main__":
    main()

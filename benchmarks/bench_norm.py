"""Training throughput with normalisation layers, one thread, float32: sparknet vs PyTorch.

Two nets, each with and without its normalisation layers (the difference is what the
normalisation costs), RMSprop (lr 1e-3), softmax cross-entropy:

- CNN, 28x28x1 images, batch 64: conv 5x5x32 -> BN -> relu -> maxpool 2 -> conv 5x5x64
  -> BN -> relu -> maxpool 2 -> dense 128 (relu) -> dense 10; sparknet's
  ``BatchNormalization`` on channels-last maps against ``torch.nn.BatchNorm2d``;
- MLP 784-512-256-10, batch 128: dense -> LN -> relu after each hidden layer;
  ``LayerNormalization`` against ``torch.nn.LayerNorm``.

The contenders run in interleaved rounds in the same process; each keeps its best round
(samples per second of process CPU time: the machine is often shared).  Printed: samples/s
of each, the sparknet / torch ratio, and the slowdown the normalisation layers cause in
each library.

    python benchmarks/bench_norm.py [--seconds 8] [--quick]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from sparknet import (
    Activation,
    BatchNormalization,
    Conv2D,
    Dense,
    Flatten,
    LayerNormalization,
    MaxPool2D,
    RMSprop,
    Sequential,
)

N_BATCHES = 8


# ---------------------------------------------------------------- the nets
def sparknet_cnn(norm: bool, seed: int = 0) -> Sequential:
    """The CNN, channels-last; with ``norm``, conv (no activation) -> BN -> relu."""
    def block(filters: int) -> list:
        if norm:
            return [Conv2D(filters, 5), BatchNormalization(), Activation("relu"), MaxPool2D(2)]
        return [Conv2D(filters, 5, activation="relu"), MaxPool2D(2)]
    return Sequential(block(32) + block(64) + [
        Flatten(), Dense(128, activation="relu"), Dense(10, activation="softmax"),
    ], input_shape=(28, 28, 1), seed=seed)


def sparknet_mlp(norm: bool, seed: int = 0) -> Sequential:
    """The MLP; with ``norm``, dense (no activation) -> LN -> relu for each hidden layer."""
    def hidden(units: int) -> list:
        if norm:
            return [Dense(units), LayerNormalization(), Activation("relu")]
        return [Dense(units, activation="relu")]
    return Sequential(hidden(512) + hidden(256) + [Dense(10, activation="softmax")],
                      input_shape=(784,), seed=seed)


def torch_cnn(norm: bool):
    import torch
    nn = torch.nn

    def block(cin: int, filters: int) -> list:
        mid = [nn.BatchNorm2d(filters)] if norm else []
        return [nn.Conv2d(cin, filters, 5), *mid, nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*block(1, 32), *block(32, 64), nn.Flatten(),
                         nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))


def torch_mlp(norm: bool):
    import torch
    nn = torch.nn

    def hidden(fin: int, units: int) -> list:
        mid = [nn.LayerNorm(units)] if norm else []
        return [nn.Linear(fin, units), *mid, nn.ReLU()]
    return nn.Sequential(*hidden(784, 512), *hidden(512, 256), nn.Linear(256, 10))


# ---------------------------------------------------------------- contenders
class SparknetStep:
    def __init__(self, name: str, model: Sequential, X: np.ndarray, y: np.ndarray) -> None:
        self.name, self.model, self.opt, self.X, self.y = name, model, RMSprop(lr=1e-3), X, y

    def __call__(self, i: int) -> None:
        self.model.loss_and_grad(self.X[i], self.y[i])
        self.opt.step(self.model.params, self.model.grads)


class TorchStep:
    def __init__(self, name: str, net, X: np.ndarray, y: np.ndarray) -> None:
        import torch
        self.name, self.net = name, net
        self.net.train()
        self.opt = torch.optim.RMSprop(self.net.parameters(), lr=1e-3)
        self.lossf = torch.nn.CrossEntropyLoss()
        if X.ndim == 5:  # (batches, N, H, W, C) -> (batches, N, C, H, W)
            X = np.ascontiguousarray(X.transpose(0, 1, 4, 2, 3))
        self.X, self.y = torch.from_numpy(X), torch.from_numpy(y)

    def __call__(self, i: int) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.lossf(self.net(self.X[i]), self.y[i])
        loss.backward()
        self.opt.step()


def make_batches(sample_shape: tuple[int, ...], batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.random((N_BATCHES, batch) + sample_shape, dtype=np.float32)
    return X, rng.integers(0, 10, (N_BATCHES, batch))


# ---------------------------------------------------------------- timing
def timed_rounds(steps: list[Callable[[int], None]], batch: int, seconds: float,
                 rounds: int) -> dict[str, float]:
    """Best samples per CPU second of each contender over ``rounds`` interleaved rounds of
    ``seconds / rounds`` each (after three warm-up steps)."""
    for s in steps:
        for i in range(3):
            s(i % N_BATCHES)
    best: dict[str, float] = {s.name: 0.0 for s in steps}  # type: ignore[attr-defined]
    per = seconds / rounds
    for _ in range(rounds):
        for s in steps:
            c0, k = time.process_time(), 0
            while time.process_time() - c0 < per or k == 0:
                s(k % N_BATCHES)
                k += 1
            rate = k * batch / (time.process_time() - c0)
            best[s.name] = max(best[s.name], rate)  # type: ignore[attr-defined]
    return best


def run_net(kind: str, seconds: float, rounds: int, batch: int) -> dict[str, float]:
    import torch
    torch.manual_seed(0)
    if kind == "cnn":
        X, y = make_batches((28, 28, 1), batch)
        spark, tnet = sparknet_cnn, torch_cnn
    else:
        X, y = make_batches((784,), batch)
        spark, tnet = sparknet_mlp, torch_mlp
    steps = []
    for norm in (True, False):
        tag = "norm" if norm else "plain"
        steps.append(SparknetStep(f"sparknet_{tag}", spark(norm), X, y))
        steps.append(TorchStep(f"torch_{tag}", tnet(norm), X, y))
    return timed_rounds(steps, batch, seconds, rounds)


def report(title: str, res: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"  {'':10s} {'sparknet':>12s} {'torch':>12s} {'ratio':>7s}")
    for tag in ("norm", "plain"):
        s, t = res[f"sparknet_{tag}"], res[f"torch_{tag}"]
        print(f"  {tag:10s} {s:10,.0f}/s {t:10,.0f}/s {s / t:6.2f}x")
    for lib in ("sparknet", "torch"):
        slow = res[f"{lib}_plain"] / res[f"{lib}_norm"]
        print(f"  {lib}: the normalisation layers make a step {slow:.2f}x slower")


def run_settings(doc: str, argv, seconds: float = 8.0,
                 seconds_help: str = "CPU seconds per contender and net, split in rounds",
                 ) -> tuple[float, int]:
    """The ``--seconds``, ``--rounds`` and ``--quick`` of a benchmark script (``doc``: its
    docstring), after printing the machine's header and setting PyTorch to one thread."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=seconds, help=seconds_help)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="a tiny run that checks the script")
    args = ap.parse_args(argv)
    from _machine import machine_header  # benchmarks/_machine.py, next to this script
    print(machine_header(), flush=True)
    import torch
    torch.set_num_threads(1)
    return (0.2, 1) if args.quick else (args.seconds, args.rounds)


def main(argv=None) -> None:
    seconds, rounds = run_settings(__doc__, argv)
    with threadpool_limits(1):
        cnn = run_net("cnn", seconds, rounds, 64)
        report("CNN c5x5x32-BN-p2-c5x5x64-BN-p2-d128-d10, 28x28x1, batch 64, "
               "training samples/s (1 thread, float32)", cnn)
        mlp = run_net("mlp", seconds, rounds, 128)
        report("MLP 784-512-LN-256-LN-10, batch 128, training samples/s (1 thread, float32)", mlp)


if __name__ == "__main__":
    main()

"""The activations of PyTorch and Keras networks, one thread, float32: sparknet vs PyTorch.

1. The MLP 784-512-256-10 (batch 128, RMSprop lr 1e-3, softmax cross-entropy) with each
   hidden activation: ``relu``, ``silu`` and ``gelu`` fused into ``Dense`` (PyTorch:
   ``nn.ReLU``/``nn.SiLU``/``nn.GELU`` after ``nn.Linear``), and leaky ReLU as the
   ``LeakyReLU(0.01)`` layer (``nn.LeakyReLU``).  Training samples/s of each library, the
   sparknet / PyTorch ratio, and what each activation costs against relu in each library.
2. The activation alone, forward and backward on a (128, 512) float32 batch: sparknet's
   kernels (``sparknet.activations.apply`` / ``grad_from_input``, the ``LeakyReLU`` layer)
   against ``torch.nn.functional`` with autograd.

The contenders run in interleaved rounds in the same process; each keeps its best round
(samples per second of process CPU time).

    python benchmarks/bench_activations.py [--seconds 6] [--quick]
"""
from __future__ import annotations

import numpy as np
from bench_norm import SparknetStep, TorchStep, make_batches, run_settings, timed_rounds
from threadpoolctl import threadpool_limits

from sparknet import Dense, LeakyReLU, Sequential
from sparknet.activations import apply, grad_from_input

ACTIVATIONS = ("relu", "silu", "gelu", "leaky_relu")


def sparknet_mlp(act: str) -> Sequential:
    def hidden(units: int) -> list:
        if act == "leaky_relu":
            return [Dense(units), LeakyReLU(0.01)]
        return [Dense(units, activation=act)]
    return Sequential(hidden(512) + hidden(256) + [Dense(10, activation="softmax")],
                      input_shape=(784,), seed=0)


def torch_mlp(act: str):
    import torch
    nn = torch.nn
    make = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU,
            "leaky_relu": lambda: nn.LeakyReLU(0.01)}[act]
    return nn.Sequential(nn.Linear(784, 512), make(), nn.Linear(512, 256), make(),
                         nn.Linear(256, 10))


def mlp_table(seconds: float, rounds: int) -> None:
    import torch
    torch.manual_seed(0)
    X, y = make_batches((784,), 128)
    steps = []
    for act in ACTIVATIONS:
        steps.append(SparknetStep(f"sparknet_{act}", sparknet_mlp(act), X, y))
        steps.append(TorchStep(f"torch_{act}", torch_mlp(act), X, y))
    res = timed_rounds(steps, 128, seconds, rounds)
    print("\nMLP 784-512-256-10, batch 128, training samples/s (1 thread, float32)")
    print(f"  {'':11s} {'sparknet':>12s} {'torch':>12s} {'ratio':>7s} {'vs relu (sn, torch)':>21s}")
    for act in ACTIVATIONS:
        s, t = res[f"sparknet_{act}"], res[f"torch_{act}"]
        rs, rt = res["sparknet_relu"] / s, res["torch_relu"] / t
        print(f"  {act:11s} {s:10,.0f}/s {t:10,.0f}/s {s / t:6.2f}x {rs:9.2f}x {rt:9.2f}x slower")


def kernel_table(seconds: float) -> None:
    """Forward + backward of the activation alone on (128, 512) float32, best of 4 interleaved
    rounds (:func:`bench_norm.timed_rounds`, one call per sample)."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    z = rng.standard_normal((128, 512)).astype(np.float32) * 3
    dy = rng.standard_normal(z.shape).astype(np.float32)
    zt, dyt = torch.from_numpy(z), torch.from_numpy(dy)
    leaky = Sequential([LeakyReLU(0.01)], input_shape=(512,))

    def sn(act: str):
        if act == "leaky_relu":
            def run() -> None:
                leaky.forward(z, training=True)
                leaky.layers[0].backward(dy)
        elif act == "relu":
            from sparknet.activations import grad

            def run() -> None:
                grad("relu", apply("relu", z), dy)
        else:
            def run() -> None:
                apply(act, z)
                grad_from_input(act, z, dy)
        return run

    def th(act: str):
        fn = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu,
              "leaky_relu": lambda x: F.leaky_relu(x, 0.01)}[act]

        def run() -> None:
            x = zt.detach().requires_grad_(True)
            fn(x).backward(dyt)
        return run

    class Named:  # a contender of timed_rounds: one call per "sample"
        def __init__(self, name: str, fn) -> None:
            self.name, self.fn = name, fn

        def __call__(self, i: int) -> None:
            self.fn()

    print("\nthe activation alone, forward + backward, (128, 512) float32, microseconds per call")
    print(f"  {'':11s} {'sparknet':>10s} {'torch':>10s} {'ratio':>7s}")
    for act in ACTIVATIONS:
        calls = timed_rounds([Named("sparknet", sn(act)), Named("torch", th(act))], 1,
                             max(seconds / 2, 0.1), 4)
        us = {k: 1e6 / v for k, v in calls.items()}
        print(f"  {act:11s} {us['sparknet']:9.1f} {us['torch']:9.1f} "
              f"{us['torch'] / us['sparknet']:6.2f}x")


def main(argv=None) -> None:
    seconds, rounds = run_settings(__doc__, argv, 6.0,
                                   "CPU seconds per contender of the MLP table, split in rounds")
    with threadpool_limits(1):
        mlp_table(seconds, rounds)
        kernel_table(seconds)


if __name__ == "__main__":
    main()

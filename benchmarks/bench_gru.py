"""GRU training speed, one thread, float32: sparknet vs PyTorch ``nn.GRU`` in the same run.

The net is ``bench_lstm.py``'s with the LSTM replaced by a GRU: GRU(28 -> 128) over 28 steps,
then Dense 10 (softmax cross-entropy), batch 128, RMSprop.  Both frameworks train on the same
random batches with one BLAS/intra-op thread (threadpoolctl, ``torch.set_num_threads(1)``);
they alternate round by round so that both see the same machine load, and the load average
is read before and after every round.  The table gives training samples/s (median over
rounds of the wall-clock rate, the best round, and the rate by the thread's CPU time, which
leaves out time spent descheduled on a busy machine) and the ratio sparknet / PyTorch.

Usage::

    python benchmarks/bench_gru.py                 # speed table
    python benchmarks/bench_gru.py --blas          # ablation: the BLAS for every product
    python benchmarks/bench_gru.py --hidden 256 --rounds 20

The header names the machine (CPU model, caches, one-thread sgemm rate, load average).
``run(...)`` returns the numbers as a dict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np
from threadpoolctl import threadpool_limits

try:
    import sparknet  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import machine_header  # noqa: E402  (the benchmarks folder, put on the path above)

from sparknet import GRU, Dense, Sequential  # noqa: E402
from sparknet.optim import RMSprop  # noqa: E402


def _batches(n_batches: int, batch: int, steps: int, features: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.random((n_batches, batch, steps, features), dtype=np.float32)
    y = rng.integers(0, classes, size=(n_batches, batch))
    return X, y


def _make_sparknet(X: np.ndarray, y: np.ndarray, hidden: int,
                   classes: int) -> Callable[[int], None]:
    nb, batch, steps, features = X.shape
    model = Sequential([GRU(hidden), Dense(classes, activation="softmax")],
                       input_shape=(steps, features), dtype="float32", seed=0)
    opt = RMSprop(lr=1e-3)

    def step(i: int) -> None:
        model.loss_and_grad(X[i % nb], y[i % nb])
        opt.step(model.params, model.grads)

    return step


def _make_torch(X: np.ndarray, y: np.ndarray, hidden: int, classes: int) -> Callable[[int], None]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    nb, batch, steps, features = X.shape

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(features, hidden, batch_first=True)
            self.fc = torch.nn.Linear(hidden, classes)

        def forward(self, x):
            _, h = self.gru(x)
            return self.fc(h[-1])

    net = Net()
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y)

    def step(i: int) -> None:
        opt.zero_grad()
        loss = lossf(net(Xt[i % nb]), yt[i % nb])
        loss.backward()
        opt.step()

    return step


def _timed(step: Callable[[int], None], n: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        step(i)
    return time.perf_counter() - w0, time.thread_time() - c0


def run(batch: int = 128, steps: int = 28, features: int = 28, hidden: int = 128, classes: int = 10,
        n_steps: int = 5, rounds: int = 12, torch: bool = True, step_kernel: bool = True) -> dict:
    """Training samples/s of sparknet's and PyTorch's GRU (one thread, float32), alternating
    in ``rounds`` rounds of ``n_steps`` training steps each.

    ``step_kernel=False`` makes sparknet use the BLAS for every product instead of its
    built-in float32 step kernels (AVX-512 or AVX2; an ablation).

    Returns:
        ``{"config": ..., "sparknet": {...}, "torch": {...} or None, "ratio_wall": ...,
        "ratio_cpu": ..., "load": (min, max) 1-minute load average over the rounds}``.
    """
    import sparknet._recurrent as _recurrent

    X, y = _batches(4, batch, steps, features, classes)
    own = _recurrent.use_step_kernel(step_kernel)
    config = dict(batch=batch, steps=steps, features=features, hidden=hidden, classes=classes,
                  n_steps=n_steps, rounds=rounds,
                  step_kernels=_recurrent.step_kernel_isa() if own else None)
    res: dict[str, Any] = {"config": config}
    loads: list[float] = []
    try:
        with threadpool_limits(1):
            steppers = {"sparknet": _make_sparknet(X, y, hidden, classes)}
            if torch:
                try:
                    steppers["torch"] = _make_torch(X, y, hidden, classes)
                except ImportError as exc:
                    print(f"PyTorch not importable ({exc}); skipping the comparison",
                          file=sys.stderr)
            times: dict[str, list[tuple[float, float]]] = {k: [] for k in steppers}
            for st in steppers.values():   # warm-up
                _timed(st, 3)
            for _ in range(rounds):
                loads.append(os.getloadavg()[0])
                for k, st in steppers.items():
                    times[k].append(_timed(st, n_steps))
            loads.append(os.getloadavg()[0])
    finally:
        _recurrent.use_step_kernel(True)
    for k, tl in times.items():
        wall = np.array([w for w, _ in tl])
        cpu = np.array([c for _, c in tl])
        res[k] = {"wall_median": batch * n_steps / float(np.median(wall)),
                  "wall_best": batch * n_steps / float(wall.min()),
                  "cpu": batch * n_steps / float(np.median(cpu))}
    res.setdefault("torch", None)
    res["load"] = (min(loads), max(loads))
    if res["torch"]:
        res["ratio_wall"] = res["sparknet"]["wall_median"] / res["torch"]["wall_median"]
        res["ratio_best"] = res["sparknet"]["wall_best"] / res["torch"]["wall_best"]
        res["ratio_cpu"] = res["sparknet"]["cpu"] / res["torch"]["cpu"]
        # per-round ratios (a sparknet round against the PyTorch round right after it)
        pw = [t / s for (s, _), (t, _) in zip(times["sparknet"], times["torch"])]
        pc = [t / s for (_, s), (_, t) in zip(times["sparknet"], times["torch"])]
        res["ratio_wall_range"] = (min(pw), max(pw))
        res["ratio_cpu_range"] = (min(pc), max(pc))
        res["ratio_wall_per_round_median"] = float(np.median(pw))
    return res


def report(res: dict) -> None:
    """Print the table of :func:`run`'s result."""
    c = res["config"]
    isa = {"avx512": "AVX-512", "avx2": "AVX2"}.get(c["step_kernels"])
    kernels = f"{isa} step kernels" if isa else "BLAS only"
    print(f"GRU {c['features']}->{c['hidden']} x {c['steps']} steps + Dense {c['classes']}, batch "
          f"{c['batch']}, float32, 1 thread, RMSprop ({kernels}); training samples/s")
    print(f"{'':<10}{'wall median':>13}{'wall best':>11}{'CPU time':>10}")
    for k in ("sparknet", "torch"):
        if res.get(k):
            r = res[k]
            print(f"{k:<10}{r['wall_median']:>13,.0f}{r['wall_best']:>11,.0f}{r['cpu']:>10,.0f}")
    if res["torch"]:
        print(f"{'ratio':<10}{res['ratio_wall']:>12.2f}x{res['ratio_best']:>10.2f}x"
              f"{res['ratio_cpu']:>9.2f}x   (sparknet / PyTorch)")
        (wl, wh), (cl, ch) = res["ratio_wall_range"], res["ratio_cpu_range"]
        print(f"per-round ratio: wall median {res['ratio_wall_per_round_median']:.2f}x, range "
              f"{wl:.2f}-{wh:.2f}x; CPU time {cl:.2f}-{ch:.2f}x ({c['rounds']} alternating rounds "
              f"of {c['n_steps']} steps)")
    lo, hi = res["load"]
    print(f"1-minute load average during the rounds: {lo:.1f}-{hi:.1f} ({os.cpu_count()} CPUs)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--n-steps", type=int, default=5, help="training steps per round")
    ap.add_argument("--rounds", type=int, default=12, help="alternating timed rounds")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--blas", action="store_true",
                    help="use the BLAS for every product (not the built-in step kernels)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    print(machine_header())
    res = run(batch=args.batch, hidden=args.hidden, n_steps=args.n_steps, rounds=args.rounds,
              torch=not args.no_torch, step_kernel=not args.blas)
    report(res)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

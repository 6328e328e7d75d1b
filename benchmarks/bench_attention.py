"""Transformer encoder training speed, one thread, float32: sparknet vs PyTorch in the same run.

The net: one encoder layer (d_model 128, 4 heads, feed-forward 512, relu, dropout 0.1,
post-norm) over sequences of 64 tokens, the mean over the tokens, then Dense 10 (softmax
cross-entropy), batch 32, Adam.  sparknet runs ``TransformerEncoder`` +
``GlobalAveragePooling1D`` + ``Dense``; PyTorch ``nn.TransformerEncoderLayer(batch_first=True)``
+ ``mean(dim=1)`` + ``nn.Linear``.  Both train on the same random batches with one BLAS /
intra-op thread (threadpoolctl, ``torch.set_num_threads(1)``), alternating round by round so
that both see the same machine load; the load average is read before and after every round.
The table gives training samples/s (median over rounds of the wall-clock rate, the best round,
and the rate by the thread's CPU time, which leaves out time spent descheduled on a busy
machine) and the ratio sparknet / PyTorch.

Usage::

    python benchmarks/bench_attention.py                 # speed table
    python benchmarks/bench_attention.py --quick         # a tiny run, to check the script
    python benchmarks/bench_attention.py --seq 128 --rounds 20

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

# the benchmarks folder, put on the path above
from _machine import machine_header, print_rates  # noqa: E402

from sparknet import Dense, GlobalAveragePooling1D, Sequential, TransformerEncoder  # noqa: E402
from sparknet.optim import Adam  # noqa: E402


def _batches(n_batches: int, batch: int, seq: int, d_model: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_batches, batch, seq, d_model), dtype=np.float32)
    y = rng.integers(0, classes, size=(n_batches, batch))
    return X, y


def _make_sparknet(X: np.ndarray, y: np.ndarray, heads: int, ffn: int, dropout: float,
                   classes: int) -> Callable[[int], None]:
    nb, batch, seq, d_model = X.shape
    model = Sequential([TransformerEncoder(heads, ffn, dropout=dropout), GlobalAveragePooling1D(),
                        Dense(classes, activation="softmax")],
                       input_shape=(seq, d_model), dtype="float32", seed=0)
    opt = Adam(lr=1e-3)

    def step(i: int) -> None:
        model.loss_and_grad(X[i % nb], y[i % nb])
        opt.step(model.params, model.grads)

    return step


def _make_torch(X: np.ndarray, y: np.ndarray, heads: int, ffn: int, dropout: float,
                classes: int) -> Callable[[int], None]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    nb, batch, seq, d_model = X.shape

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.nn.TransformerEncoderLayer(d_model, heads, ffn, dropout,
                                                        batch_first=True)
            self.fc = torch.nn.Linear(d_model, classes)

        def forward(self, x):
            return self.fc(self.enc(x).mean(dim=1))

    net = Net()
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
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


def run(batch: int = 32, seq: int = 64, d_model: int = 128, heads: int = 4, ffn: int = 512,
        dropout: float = 0.1, classes: int = 10, n_steps: int = 5, rounds: int = 12,
        torch: bool = True) -> dict:
    """Training samples/s of sparknet's and PyTorch's encoder layer (one thread, float32),
    alternating in ``rounds`` rounds of ``n_steps`` training steps each.

    Returns:
        ``{"config": ..., "sparknet": {...}, "torch": {...} or None, "ratio_wall": ...,
        "ratio_cpu": ..., "load": (min, max) 1-minute load average over the rounds}``.
    """
    X, y = _batches(4, batch, seq, d_model, classes)
    config = dict(batch=batch, seq=seq, d_model=d_model, heads=heads, ffn=ffn, dropout=dropout,
                  classes=classes, n_steps=n_steps, rounds=rounds)
    res: dict[str, Any] = {"config": config}
    loads: list[float] = []
    with threadpool_limits(1):
        steppers = {"sparknet": _make_sparknet(X, y, heads, ffn, dropout, classes)}
        if torch:
            try:
                steppers["torch"] = _make_torch(X, y, heads, ffn, dropout, classes)
            except ImportError as exc:
                print(f"PyTorch not importable ({exc}); skipping the comparison", file=sys.stderr)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in steppers}
        for st in steppers.values():   # warm-up
            _timed(st, 2)
        for _ in range(rounds):
            loads.append(os.getloadavg()[0])
            for k, st in steppers.items():
                times[k].append(_timed(st, n_steps))
        loads.append(os.getloadavg()[0])
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
    print(f"TransformerEncoder d_model {c['d_model']}, {c['heads']} heads, FFN {c['ffn']}, "
          f"dropout {c['dropout']}, {c['seq']} tokens + mean + Dense {c['classes']}, batch "
          f"{c['batch']}, float32, 1 thread, Adam; training samples/s")
    print_rates(res)
    lo, hi = res["load"]
    print(f"1-minute load average during the rounds: {lo:.1f}-{hi:.1f} ({os.cpu_count()} CPUs)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512, help="feed-forward width")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--n-steps", type=int, default=5, help="training steps per round")
    ap.add_argument("--rounds", type=int, default=12, help="alternating timed rounds")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny configuration and two rounds (checks the script, no figures)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    print(machine_header())
    kw = dict(batch=args.batch, seq=args.seq, d_model=args.d_model, heads=args.heads,
              ffn=args.ffn, dropout=args.dropout, n_steps=args.n_steps, rounds=args.rounds)
    if args.quick:
        kw.update(batch=4, seq=16, d_model=32, ffn=64, n_steps=2, rounds=2)
    res = run(torch=not args.no_torch, **kw)
    report(res)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

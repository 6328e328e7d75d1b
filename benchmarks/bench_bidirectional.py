"""Bidirectional LSTM training speed, one thread, float32: sparknet vs PyTorch in the same run.

The net: Bidirectional(LSTM(128)) over 28 steps of 28 features (the last states of both
directions, concatenated), then Dense 10 (softmax cross-entropy), batch 128, RMSprop;
against ``torch.nn.LSTM(28, 128, bidirectional=True, batch_first=True)`` + ``Linear`` on
``h_n`` of both directions.  Both train on the same random batches with one BLAS/intra-op
thread, in alternating rounds; the table gives training samples/s and the ratio
sparknet / PyTorch.

Usage::

    python benchmarks/bench_bidirectional.py              # speed table
    python benchmarks/bench_bidirectional.py --quick      # a tiny run (does it work?)
    python benchmarks/bench_bidirectional.py --masked     # padded batches (lengths 14..28)

With ``--masked`` every batch holds sequences of random lengths (padding on the right):
sparknet gets the mask, PyTorch the packed batch (``pack_padded_sequence``).

The header names the machine (CPU model, caches, one-thread sgemm rate, load average); the
table gives the median over rounds and the range of the per-round ratio (each sparknet
round is paired with the PyTorch round that follows it).  ``run(...)`` returns the numbers
as a dict.
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

from sparknet import LSTM, Bidirectional, Dense, Sequential  # noqa: E402
from sparknet.data import lengths_to_mask  # noqa: E402
from sparknet.optim import RMSprop  # noqa: E402

Step = Callable[[int], None]


def _batches(n_batches: int, batch: int, steps: int, features: int, classes: int,
             masked: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random inputs ``(B, N, T, F)``, labels ``(B, N)`` and lengths ``(B, N)`` (all ``T``
    unless ``masked``)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n_batches, batch, steps, features), dtype=np.float32)
    y = rng.integers(0, classes, size=(n_batches, batch))
    if masked:
        lengths = rng.integers(max(1, steps // 2), steps + 1, size=(n_batches, batch))
    else:
        lengths = np.full((n_batches, batch), steps)
    return X, y, lengths


def _make_sparknet(X: np.ndarray, y: np.ndarray, lengths: np.ndarray, hidden: int,
                   classes: int, masked: bool) -> Step:
    nb, batch, steps, features = X.shape
    model = Sequential([Bidirectional(LSTM(hidden)), Dense(classes, activation="softmax")],
                       input_shape=(steps, features), dtype="float32", seed=0)
    opt = RMSprop(lr=1e-3)
    masks = [lengths_to_mask(lengths[i], steps) if masked else None for i in range(nb)]

    def step(i: int) -> None:
        model.loss_and_grad(X[i % nb], y[i % nb], mask=masks[i % nb])
        opt.step(model.params, model.grads)

    return step


def _make_torch(X: np.ndarray, y: np.ndarray, lengths: np.ndarray, hidden: int, classes: int,
                masked: bool) -> Step:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    nb, batch, steps, features = X.shape

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(features, hidden, batch_first=True, bidirectional=True)
            self.fc = torch.nn.Linear(2 * hidden, classes)

        def forward(self, x: Any, lens: Any) -> Any:
            if lens is not None:
                x = torch.nn.utils.rnn.pack_padded_sequence(x, lens, batch_first=True,
                                                            enforce_sorted=False)
            _, (h, _) = self.lstm(x)
            return self.fc(torch.cat([h[0], h[1]], dim=1))

    net = Net()
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y)
    lt = [torch.from_numpy(lengths[i]) if masked else None for i in range(nb)]

    def step(i: int) -> None:
        opt.zero_grad()
        loss = lossf(net(Xt[i % nb], lt[i % nb]), yt[i % nb])
        loss.backward()
        opt.step()

    return step


def _timed(step: Step, n: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        step(i)
    return time.perf_counter() - w0, time.thread_time() - c0


def run(batch: int = 128, steps: int = 28, features: int = 28, hidden: int = 128,
        classes: int = 10, n_steps: int = 5, rounds: int = 12, masked: bool = False,
        torch: bool = True) -> dict[str, Any]:
    """Training samples/s of sparknet's and PyTorch's bidirectional LSTM (one thread, float32).

    The two alternate in ``rounds`` rounds of ``n_steps`` training steps each, so that both
    see the same machine load.  For each, the median over rounds of the wall-clock rate is
    reported, the best round, and the rate by the thread's CPU time.

    Returns:
        ``{"config": ..., "sparknet": {...}, "torch": {...} or None, "ratio_wall": ...,
        "ratio_best": ..., "ratio_cpu": ..., "ratio_wall_range": ..., "ratio_cpu_range": ...}``
        with rates in samples/s.
    """
    X, y, lengths = _batches(4, batch, steps, features, classes, masked)
    config = dict(batch=batch, steps=steps, features=features, hidden=hidden, classes=classes,
                  n_steps=n_steps, rounds=rounds, masked=masked)
    res: dict[str, Any] = {"config": config}
    with threadpool_limits(1):
        steppers = {"sparknet": _make_sparknet(X, y, lengths, hidden, classes, masked)}
        if torch:
            try:
                steppers["torch"] = _make_torch(X, y, lengths, hidden, classes, masked)
            except ImportError as exc:
                print(f"PyTorch not importable ({exc}); skipping the comparison", file=sys.stderr)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in steppers}
        for st in steppers.values():   # warm-up
            _timed(st, 2)
        for _ in range(rounds):
            for k, st in steppers.items():
                times[k].append(_timed(st, n_steps))
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
        pw = [t / s for (s, _), (t, _) in zip(times["sparknet"], times["torch"])]
        pc = [t / s for (_, s), (_, t) in zip(times["sparknet"], times["torch"])]
        res["ratio_wall_range"] = (min(pw), max(pw))
        res["ratio_cpu_range"] = (min(pc), max(pc))
    return res


def report(res: dict[str, Any]) -> None:
    """Print the table of :func:`run`'s result."""
    c = res["config"]
    lengths = (f"lengths {max(1, c['steps'] // 2)}..{c['steps']}, masked" if c["masked"]
               else "full length")
    print(f"Bidirectional LSTM {c['features']}->2x{c['hidden']} x {c['steps']} steps ({lengths}) "
          f"+ Dense {c['classes']}, batch {c['batch']}, float32, 1 thread, RMSprop; "
          f"training samples/s")
    print_rates(res)

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--n-steps", type=int, default=5, help="training steps per round")
    ap.add_argument("--rounds", type=int, default=12, help="alternating timed rounds")
    ap.add_argument("--masked", action="store_true",
                    help="variable lengths: a mask for sparknet, packed batches for PyTorch")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run (batch 16, 16 units, 2 rounds of 1 step): checks it works")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.hidden, args.n_steps, args.rounds = 16, 16, 1, 2
    print(machine_header())
    res = run(batch=args.batch, hidden=args.hidden, n_steps=args.n_steps, rounds=args.rounds,
              masked=args.masked, torch=not args.no_torch)
    report(res)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bfloat16 against float32 training, one thread: sparknet and PyTorch in the same run.

Four nets, each trained on the same random batches by four contenders that alternate in
rounds (so that all see the same machine load):

- sparknet float32, and sparknet with ``precision="bf16"`` (the steps ``fit`` runs: bfloat16
  products with float32 accumulation, weights packed once per step);
- PyTorch float32, and PyTorch under ``torch.autocast("cpu", dtype=torch.bfloat16)``.

Nets: MLP 784-512-256-10 (batch 128); CNN c5x5x32-p2-c5x5x64-p2-d128-d10 on 28x28x1
(batch 64); LSTM 28->128 over 28 steps + dense 10 (batch 128); GRU the same.  RMSprop
(lr 1e-3) everywhere.  Printed per net: training samples/s (median over rounds) of each
contender, the ratios, and the rate at which each sparknet step runs its matrix products
(the products' floating-point operations over the whole step's time) against the faster of
the header's two one-thread sgemm rates (the BLAS', sparknet's own AVX-512 kernel's).  A last
table gives the bfloat16 kernel's own rate on the MLP's products against the float32 BLAS on
the same shapes.

    python benchmarks/bench_bf16.py [--only mlp,cnn,lstm,gru] [--rounds 9] [--steps 10]
    python benchmarks/bench_bf16.py --quick        # a check that everything runs
    python benchmarks/bench_bf16.py --separate 3   # each contender in 3 processes of its own

The header names the machine, its one-thread sgemm rate and its bfloat16/AMX flags.  On a
CPU without AVX512-BF16, sparknet's bf16 column trains in float32 (a warning says so).

glibc's malloc hands large blocks back to the system when they are freed, so that PyTorch's
step may pay page faults for its tensors at every step (its CNN step ran 1.5-2x faster on
a Zen 5 with the thresholds raised, as tcmalloc or jemalloc would give it), and the
contenders' rounds in one process change each other's heap.  To compare with PyTorch as a
user who tunes its allocator would run it, raise both thresholds for the whole run::

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824 \
        python benchmarks/bench_bf16.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
from typing import Any, Callable

import numpy as np
from threadpoolctl import threadpool_limits

try:
    import sparknet  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import best_sgemm_gflops, machine_header  # noqa: E402

from sparknet import (  # noqa: E402
    GRU,
    LSTM,
    Conv2D,
    Dense,
    Flatten,
    MaxPool2D,
    RMSprop,
    Sequential,
    _bf16,
    _blas,
    precision,
)

NETS = ("mlp", "cnn", "lstm", "gru")
CONTENDERS = ("sparknet_fp32", "sparknet_bf16", "torch_fp32", "torch_bf16")
#: (batch size, per-sample input shape) of each net
SHAPES = {"mlp": (128, (784,)), "cnn": (64, (28, 28, 1)), "lstm": (128, (28, 28)),
          "gru": (128, (28, 28))}


# ---------------------------------------------------------------------------- the nets
def sparknet_net(name: str) -> Sequential:
    shape = SHAPES[name][1]
    if name == "mlp":
        layers = [Dense(512, activation="relu"), Dense(256, activation="relu"),
                  Dense(10, activation="softmax")]
    elif name == "cnn":
        layers = [Conv2D(32, 5, activation="relu"), MaxPool2D(2), Conv2D(64, 5, activation="relu"),
                  MaxPool2D(2), Flatten(), Dense(128, activation="relu"),
                  Dense(10, activation="softmax")]
    else:
        layers = [(LSTM if name == "lstm" else GRU)(128), Dense(10, activation="softmax")]
    return Sequential(layers, input_shape=shape, seed=0)


def torch_net(name: str) -> Any:
    import torch
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 4 * 4, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    rnn_cls = nn.LSTM if name == "lstm" else nn.GRU

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = rnn_cls(28, 128, batch_first=True)
            self.fc = nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            out, _ = self.rnn(x)
            return self.fc(out[:, -1])

    return Recurrent()


def gemm_flops(model: Sequential, batch: int) -> float:
    """Floating-point operations of one training step's matrix products (forward, weight
    gradient, input gradient except the first layer's)."""
    total = 0.0
    for i, layer in enumerate(model.layers):
        products = 2 if i == 0 else 3          # the first layer computes no input gradient
        if isinstance(layer, Dense):
            total += products * 2.0 * batch * layer.in_features * layer.units
        elif isinstance(layer, Conv2D):
            oh, ow, f = layer.output_shape
            kh, kw = layer.kernel_size
            total += products * 2.0 * batch * oh * ow * kh * kw * layer.in_channels * f
        elif isinstance(layer, (LSTM, GRU)):
            g = (4 if isinstance(layer, LSTM) else 3) * layer.units
            t, f, h = layer.timesteps, layer.in_features, layer.units
            # forward x W_ih^T and h W_hh^T; dW_ih, dW_hh; dh (and dx unless first)
            total += 2.0 * batch * t * g * ((f + h) * 2 + h + (0 if i == 0 else f))
    return total


# ---------------------------------------------------------------------------- the contenders
def sparknet_step(name: str, X: np.ndarray, y: np.ndarray, bf16: bool) -> Callable[[int], None]:
    model, opt = sparknet_net(name), RMSprop(lr=1e-3)
    opt.init_state(model.n_params, model.dtype)
    fresh = [False]

    def step(i: int) -> None:
        # as in fit: a new step token before the forward pass unless the last update refilled
        # the packed weights (bf16), then loss, gradients, update
        if not fresh[0]:
            precision.next_step()
        model.loss_and_grad(X[i % len(X)], y[i % len(y)])
        fresh[0] = precision.optimizer_step(model, opt)

    return step


def sparknet_round(step: Callable[[int], None], bf16: bool) -> Callable[[int, int], None]:
    """Steps ``i0 .. i0 + n - 1`` of a sparknet contender, in bf16 inside one
    :func:`sparknet.precision.autocast` as ``fit`` runs them all (entering it marks the packed
    weights stale, so each round packs them once more than ``fit`` would)."""
    def run_steps(i0: int, n: int) -> None:
        with precision.autocast("bf16" if bf16 else "fp32"):
            for i in range(i0, i0 + n):
                step(i)

    return run_steps


def plain_round(step: Callable[[int], None]) -> Callable[[int, int], None]:
    """Steps ``i0 .. i0 + n - 1`` of a contender that needs no set-up around them."""
    def run_steps(i0: int, n: int) -> None:
        for i in range(i0, i0 + n):
            step(i)

    return run_steps


def torch_step(name: str, X: np.ndarray, y: np.ndarray, bf16: bool,
               channels_last: bool = False) -> Callable[[int], None]:
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch_net(name)
    opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    Xt = torch.from_numpy(X.transpose(0, 1, 4, 2, 3).copy() if name == "cnn" else X)
    yt = torch.from_numpy(y)
    if channels_last and name == "cnn":
        net = net.to(memory_format=torch.channels_last)
        opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
        Xt = [x.contiguous(memory_format=torch.channels_last) for x in Xt]

    def step(i: int) -> None:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(Xt[i % len(Xt)])
        loss = lossf(out.float(), yt[i % len(yt)])
        loss.backward()
        opt.step()

    return step


def run(name: str, rounds: int = 9, n_steps: int = 10, torch: bool = True,
        only: tuple[str, ...] = CONTENDERS, channels_last: bool = False) -> dict[str, Any]:
    """Training samples/s of the contenders ``only`` on net ``name`` (median over rounds)."""
    batch, shape = SHAPES[name]
    rng = np.random.default_rng(0)
    X = rng.random((4, batch) + shape, dtype=np.float32)
    y = rng.integers(0, 10, (4, batch))
    steppers: dict[str, Callable[[int, int], None]] = {
        "sparknet_fp32": sparknet_round(sparknet_step(name, X, y, False), False),
        "sparknet_bf16": sparknet_round(sparknet_step(name, X, y, True), True)}
    if torch:
        try:
            steppers["torch_fp32"] = plain_round(torch_step(name, X, y, False, channels_last))
            steppers["torch_bf16"] = plain_round(torch_step(name, X, y, True, channels_last))
        except ImportError as exc:
            print(f"PyTorch not importable ({exc}); sparknet only", file=sys.stderr)
    steppers = {k: st for k, st in steppers.items() if k in only}
    with threadpool_limits(1):
        for k, st in list(steppers.items()):        # warm-up
            try:
                st(0, 2)
            except RuntimeError as exc:  # e.g. oneDNN has no bf16 LSTM without AVX512-BF16
                print(f"{k} cannot run {name} on this CPU, left out: {str(exc).splitlines()[0]}",
                      file=sys.stderr)
                del steppers[k]
    times: dict[str, list[float]] = {k: [] for k in steppers}
    with threadpool_limits(1):
        for _ in range(rounds):
            for k, st in steppers.items():
                t0 = time.perf_counter()
                st(0, n_steps)
                times[k].append(time.perf_counter() - t0)
    rate = {k: batch * n_steps / float(np.median(v)) for k, v in times.items()}
    return _result(name, rate, rounds, n_steps)


def _result(name: str, rate: dict[str, float], rounds: int, n_steps: int,
            **extra: Any) -> dict[str, Any]:
    """A net's figures: samples/s per contender and the sparknet steps' GEMM rates."""
    batch = SHAPES[name][0]
    flops = gemm_flops(sparknet_net(name), batch)
    return {"net": name, "batch": batch, "rounds": rounds, "steps_per_round": n_steps, **extra,
            "samples_per_s": rate, "gemm_gflop_per_step": flops / 1e9,
            "gemm_gflops": {k: flops * rate[k] / batch / 1e9 for k in rate
                            if k.startswith("sparknet")}}


def kernel_rates(repeats: int = 20) -> list[dict[str, Any]]:
    """The bfloat16 kernel (weights packed beforehand) against the float32 BLAS on the MLP
    step's products, GFLOP/s (best of ``repeats``)."""
    shapes = [("784->512 forward", 128, 512, 784, False, True),
              ("784->512 weight grad", 512, 784, 128, True, False),
              ("512->256 input grad", 128, 512, 256, False, False),
              ("512->256 forward", 128, 256, 512, False, True)]
    rng = np.random.default_rng(0)
    out = []
    for label, M, N, K, ta, tb in shapes:
        A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        C = np.zeros((M, N), np.float32)
        flops = 2.0 * M * N * K
        sgemm = partial(_blas.py_gemm, ta, tb, 1.0, A, B, 0.0, C)
        row: dict[str, Any] = {"product": label, "M": M, "N": N, "K": K,
                               "sgemm": _best_gflops(sgemm, flops, repeats)}
        if precision.available():
            packed = _bf16.pack(B, tb)
            bf16 = partial(_bf16.py_gemm_packed, A, packed, C, ta)
            row["bf16"] = _best_gflops(bf16, flops, repeats)
        out.append(row)
    return out


def _best_gflops(f: Callable[[], None], flops: float, repeats: int) -> float:
    """``flops`` over the best of ``repeats`` timed calls of ``f``, in GFLOP/s."""
    f()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return flops / min(ts) / 1e9


def report(res: dict[str, Any], sgemm: float) -> None:
    r = res["samples_per_s"]
    where = (f", each contender in {res['processes']} processes of its own"
             if res.get("processes") else ", interleaved in one process")
    print(f"{res['net'].upper()} (batch {res['batch']}, {res['rounds']} rounds x "
          f"{res['steps_per_round']} steps{where}; GEMMs {res['gemm_gflop_per_step']:.3f} "
          "GFLOP/step)")
    for k in CONTENDERS:
        if k in r:
            extra = ""
            if k in res["gemm_gflops"]:
                g = res["gemm_gflops"][k]
                extra = f"   step's GEMM rate {g:6.1f} GFLOP/s = {100 * g / sgemm:4.0f}% of sgemm"
            print(f"  {k:14s} {r[k]:9.0f} samples/s{extra}")

    def ratio(a: str, b: str) -> str:
        return f"{r[a] / r[b]:.2f}x" if a in r and b in r else "-"
    print(f"  sparknet bf16 / PyTorch bf16 {ratio('sparknet_bf16', 'torch_bf16')}; "
          f"sparknet bf16 / sparknet fp32 {ratio('sparknet_bf16', 'sparknet_fp32')}; "
          f"sparknet fp32 / PyTorch fp32 {ratio('sparknet_fp32', 'torch_fp32')}; "
          f"PyTorch bf16 / PyTorch fp32 {ratio('torch_bf16', 'torch_fp32')}")


def run_separate(name: str, rounds: int, n_steps: int, processes: int,
                 channels_last: bool = False) -> dict[str, Any]:
    """Each contender in a process of its own (``processes`` processes each, in turn), so
    that none changes another's caches or heap; samples/s: the median over its processes of
    each process's median over ``rounds``."""
    rates: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    for _ in range(processes):
        for k in CONTENDERS:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--only", name,
                                  "--contender", k, "--rounds", str(rounds), "--steps",
                                  str(n_steps)] + (["--channels-last"] if channels_last else []),
                                 capture_output=True, text=True, check=False)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                print(f"{k} on {name} did not run: {out.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            rates[k].extend(json.loads(line[-1][len("RESULT "):])["samples_per_s"].values())
    rate = {k: float(np.median(v)) for k, v in rates.items() if v}
    return _result(name, rate, rounds, n_steps, processes=processes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(NETS),
                    help="comma-separated subset of " + ",".join(NETS))
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per net")
    ap.add_argument("--steps", type=int, default=10, help="training steps per round")
    ap.add_argument("--no-torch", action="store_true", help="sparknet only")
    ap.add_argument("--separate", type=int, default=0, metavar="P",
                    help="run each contender in P processes of its own, in turn, instead of "
                         "interleaving all four in this one")
    ap.add_argument("--channels-last", action="store_true",
                    help="PyTorch's CNN and its batches in the channels-last layout (PyTorch's "
                         "CPU tuning advice; NCHW by default, as a data loader hands them over)")
    ap.add_argument("--contender", choices=CONTENDERS, default=None,
                    help="run this contender alone and print its result as one JSON line "
                         "(what --separate starts)")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 1 step: a check that it runs")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 1
    if args.contender:
        res = run(args.only, rounds=args.rounds, n_steps=args.steps,
                  torch=args.contender.startswith("torch"), only=(args.contender,),
                  channels_last=args.channels_last)
        print("RESULT " + json.dumps(res))
        return
    print(machine_header())
    print(f"bf16 backend: {_bf16.backend()} (AMX {_bf16.capabilities()['amx']}; "
          f"SPARKNET_BF16={os.environ.get('SPARKNET_BF16', '(unset)')})")
    sgemm = best_sgemm_gflops()
    results: dict[str, Any] = {"sgemm_gflops": sgemm, "capabilities": precision.capabilities(),
                               "nets": []}
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        if name not in NETS:
            raise SystemExit(f"unknown net {name!r}; choose from {', '.join(NETS)}")
        print()
        if args.separate:
            res = run_separate(name, args.rounds, args.steps, args.separate, args.channels_last)
        else:
            res = run(name, rounds=args.rounds, n_steps=args.steps, torch=not args.no_torch,
                      channels_last=args.channels_last)
        report(res, sgemm)
        results["nets"].append(res)
    print("\nbf16 kernel on the MLP's products (GFLOP/s, best of "
          f"{3 if args.quick else 20}; sgemm 1024^3 = {sgemm:.0f}):")
    results["kernel"] = kernel_rates(3 if args.quick else 20)
    for row in results["kernel"]:
        bf = (f"bf16 {row['bf16']:6.1f} ({row['bf16'] / row['sgemm']:.2f}x)" if "bf16" in row
              else "bf16 -")
        print(f"  {row['product']:22s} M{row['M']:<4d} N{row['N']:<4d} K{row['K']:<4d} "
              f"sgemm {row['sgemm']:6.1f}  {bf}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

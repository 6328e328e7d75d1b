"""Inference speed of an exported model: ONNX Runtime against sparknet's own ``predict``, one
thread each, same model, same inputs.

Three float32 networks, trained a little first (the cost does not depend on the weights):

- MLP 784-512-256-10 (MNIST-sized rows of random pixels);
- the CNN conv 5x5x32 (relu) -> max pool 2 -> conv 5x5x64 (relu) -> max pool 2 -> dense 10
  on 28x28x1 images;
- LSTM(128) -> dense 10 on sequences of 28 steps of 28 features, every tenth row padded
  (a step mask: the graph's ``mask`` input, ``sequence_lens`` inside).

Each is timed at batch sizes 1, 32 and 256 (samples per call), ``--repeats`` times after one
warm-up; the median samples/s of each runtime and their ratio are printed.  sparknet runs
with ``sparknet.threads`` at one BLAS thread (its default); ONNX Runtime with
``intra_op_num_threads = inter_op_num_threads = 1``.  The two agree within 1e-5 (checked
here on every input before timing).

Usage::

    python benchmarks/bench_onnx.py [--repeats 7] [--rows 2048] [--quick]

``--quick`` runs tiny sizes once (a smoke test of the script, not figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _machine import machine_header  # noqa: E402


def _models(quick: bool):
    """``(name, model, x, mask)`` of the three networks, briefly trained."""
    from sparknet import LSTM, Conv2D, Dense, Flatten, MaxPool2D, Sequential

    rng = np.random.default_rng(0)
    n = 64 if quick else 512
    out = []
    w = (32, 16) if quick else (512, 256)
    mlp = Sequential(
        [
            Dense(w[0], activation="relu"),
            Dense(w[1], activation="relu"),
            Dense(10, activation="softmax"),
        ],
        seed=0,
    )
    x = rng.random((n, 784), dtype=np.float32)
    mlp.fit(x, rng.integers(0, 10, n), epochs=1, verbose=0)
    out.append(("MLP 784-512-256-10" if not quick else "MLP (quick)", mlp, x, None))
    f = (4, 8) if quick else (32, 64)
    cnn = Sequential(
        [
            Conv2D(f[0], 5, activation="relu"),
            MaxPool2D(2),
            Conv2D(f[1], 5, activation="relu"),
            MaxPool2D(2),
            Flatten(),
            Dense(10, activation="softmax"),
        ],
        seed=0,
    )
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    cnn.fit(x, rng.integers(0, 10, n), epochs=1, verbose=0)
    out.append(("CNN 5x5x32-pool-5x5x64-pool-10" if not quick else "CNN (quick)", cnn, x, None))
    H = 16 if quick else 128
    lstm = Sequential([LSTM(H), Dense(10, activation="softmax")], seed=0)
    x = rng.standard_normal((n, 28, 28)).astype(np.float32)
    mask = np.ones((n, 28), dtype=np.float32)
    mask[::10, 20:] = 0
    lstm.fit(x, rng.integers(0, 10, n), mask=mask, epochs=1, verbose=0)
    out.append((f"LSTM({H}) 28x28, masked" if not quick else "LSTM (quick)", lstm, x, mask))
    return out


def _session(model, folder: str):
    import onnxruntime as ort

    from sparknet.onnx import export

    path = os.path.join(folder, "model.onnx")
    export(model, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _rate(fn, samples: int, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return samples / statistics.median(times)


def _compare(
    name: str, model, sess, X: np.ndarray, M: np.ndarray | None, batch: int, repeats: int
) -> tuple[float, float]:
    """Samples/s of sparknet and of ONNX Runtime on ``X`` in calls of ``batch`` samples
    (an eighth of the rows at batch 1), after checking that both give the same outputs."""
    batches = [
        (X[i : i + batch], None if M is None else M[i : i + batch]) for i in range(0, len(X), batch)
    ]
    if batch == 1:
        batches = batches[: max(len(X) // 8, 1)]
    n = sum(len(b) for b, _ in batches)

    def feeds(xb: np.ndarray, mb: np.ndarray | None) -> dict:
        return {"input": xb} if mb is None else {"input": xb, "mask": mb}

    def run_sparknet() -> list:
        return [model.predict_output(xb, mask=mb) for xb, mb in batches]

    def run_ort() -> list:
        return [sess.run(["output"], feeds(xb, mb))[0] for xb, mb in batches]

    got, want = np.concatenate(run_ort()), np.concatenate(run_sparknet())
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= 1e-5, f"{name}: ONNX Runtime and sparknet differ by {err:.2e}"
    return _rate(run_sparknet, n, repeats), _rate(run_ort, n, repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--rows", type=int, default=2048, help="samples scored per timing (default 2048)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: a smoke test")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    import sparknet

    print(machine_header())
    print(f"sparknet {sparknet.__version__}, onnxruntime {ort.__version__}; one thread each")
    repeats = 1 if args.quick else args.repeats
    rows = 64 if args.quick else args.rows
    print(f"{'model':<34}{'batch':>6}{'sparknet/s':>13}{'ORT/s':>13}{'ORT / sparknet':>16}")
    with tempfile.TemporaryDirectory() as folder:
        for name, model, x, mask in _models(args.quick):
            sess = _session(model, folder)
            reps = -(-rows // len(x))
            X = np.concatenate([x] * reps)[:rows]
            M = None if mask is None else np.concatenate([mask] * reps)[:rows]
            for batch in (1, 32, 256):
                r_sn, r_ort = _compare(name, model, sess, X, M, batch, repeats)
                print(f"{name:<34}{batch:>6}{r_sn:>13,.0f}{r_ort:>13,.0f}{r_ort / r_sn:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

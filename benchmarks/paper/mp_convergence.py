"""Convergence of model parallelism: loss and gradient norm against steps for K = 1, 2, 4.

The paper proves that its distributed backpropagation computes what single-process
backpropagation does.  This trains softmax regression (784 -> 10) and the MLP
784-480-160-10 (ReLU) on the real MNIST with every dense layer cut into K = 1, 2 and 4
neuron blocks (:class:`~sparknet.cluster.model_parallel.ModelParallel` on Spark
``local[2]``, float64, plain SGD), all K starting from the *same* weights (K = 1's, cut into
the K blocks), on the same minibatches (``--batch`` rows in a fixed order), and beside
them one process (``Sequential``, the same weights and batches).  Per step: the
minibatch's mean loss (before the update) and the norm of the gradient the step applied
(``|w_before - w_after| / lr``, the weights gathered from the blocks).  The curves lie on
top of one another; the script prints the largest difference between K's and against the
one process.  Writes ``results/mp_convergence.csv`` and ``.png``.

    python benchmarks/paper/mp_convergence.py [--steps 50] [--in-process]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)
import numpy as np  # noqa: E402

NAME = "mp_convergence"
KS = (1, 2, 4)


def softmax_regression() -> list:
    from sparknet import Dense
    return [Dense(10, activation="softmax")]


def mlp() -> list:
    from sparknet import Dense
    return [Dense(480, activation="relu"), Dense(160, activation="relu"),
            Dense(10, activation="softmax")]


def set_weights(mp, weights: dict[int, dict[str, np.ndarray]], folder: str) -> None:
    """Give ``mp``'s blocks the whole-layer ``weights`` (``{layer: {"kernel": (out, in),
    "bias": (out,)}}``): its saved folder's block files get the slices of their neurons,
    and the model is restored from it.  Checked by gathering the weights back."""
    path = mp.save(folder)
    for b in mp.blocked:
        for k in range(b.blocks):
            f = os.path.join(path, f"layer{b.index:03d}_block{k:03d}.npz")
            with np.load(f, allow_pickle=False) as z:
                arrays = {n: z[n] for n in z.files}
            lo, hi = b.span(k)
            arrays["kernel"] = np.ascontiguousarray(weights[b.index]["kernel"][lo:hi])
            if "bias" in arrays:
                arrays["bias"] = np.ascontiguousarray(weights[b.index]["bias"][lo:hi])
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
                for n, a in arrays.items():
                    with zf.open(f"{n}.npy", "w") as fh:
                        np.lib.format.write_array(fh, a, allow_pickle=False)
    mp.restore(path)
    for i, w in weights.items():
        got = mp.get_layer_weights(i)
        for name, a in w.items():
            if not np.array_equal(got[name], a):
                raise RuntimeError(f"layer {i} {name}: the restored blocks differ from the "
                                   f"weights given")


def run(layers, K: int, spark, X, y, steps: int, batch: int, lr: float, init, tmp: str) -> dict:
    """``steps`` SGD steps of ``layers`` cut into ``K`` blocks from the weights ``init``."""
    from sparknet import SGD
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    n = len(layers)
    mp = ModelParallel(layers, BlockPlan(dict.fromkeys(range(n), K)), (784,), spark=spark,
                       dtype="float64", seed=0, optimizer=SGD(lr=lr), name=f"paper-conv-{K}")
    try:
        if init is None:
            init = {i: mp.get_layer_weights(i) for i in range(n)}
        else:
            set_weights(mp, init, os.path.join(tmp, f"K{K}-{n}"))
        losses, norms = [], []
        before = mp.to_sequential().params.copy()
        for s in range(steps):
            loss, _ = mp.train_on_batch(X[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch])
            after = mp.to_sequential().params.copy()
            losses.append(float(loss))
            norms.append(float(np.linalg.norm(before - after) / lr))
            before = after
    finally:
        mp.close()
    return {"loss": losses, "grad_norm": norms, "init": init}


def one_process(layers, X, y, steps: int, batch: int, lr: float, init) -> dict:
    """The same steps in one process (``Sequential``, float64) from the same weights."""
    from sparknet import SGD, Sequential
    model = Sequential(layers, input_shape=(784,), dtype="float64", seed=0)
    for i, sl in enumerate(model.param_slices()):
        for k, (a, b, _) in sl.items():
            model.params[a:b] = init[i][k].reshape(-1)
    opt = SGD(lr=lr)
    losses, norms = [], []
    for s in range(steps):
        before = model.params.copy()
        batch_rows = slice(s * batch, (s + 1) * batch)
        loss, _ = model.train_on_batch(X[batch_rows], y[batch_rows], optimizer=opt)
        losses.append(float(loss))
        norms.append(float(np.linalg.norm(before - model.params) / lr))
    return {"loss": losses, "grad_norm": norms}


def plot(results: dict) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG", flush=True)
        return
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.2), sharex=True)
    styles = {"one process": dict(color="black", linewidth=3.5, alpha=0.3)}
    for j, (net, runs) in enumerate(results.items()):
        for run, r in runs.items():
            st = (styles[run] if run in styles
                  else dict(linestyle=["-", "--", ":"][KS.index(int(run[4:]))], linewidth=1.4))
            steps = np.arange(1, len(r["loss"]) + 1)
            axes[0, j].plot(steps, r["loss"], label=run, **st)
            axes[1, j].plot(steps, r["grad_norm"], label=run, **st)
        axes[0, j].set_title(net, fontsize=9)
        axes[0, j].set_ylabel("minibatch loss")
        axes[1, j].set_ylabel("gradient norm")
        axes[1, j].set_xlabel("step")
        axes[0, j].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(C.RESULTS, f"{NAME}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {os.path.relpath(path)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mnist", default=C.DEFAULT_MNIST)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--in-process", action="store_true",
                    help="blocks in this process instead of Spark local[2]")
    args = ap.parse_args(argv)
    where = "in this process" if args.in_process else "Spark local[2]"
    print(C.header(f"Model parallelism, K = 1, 2, 4 blocks per layer ({where}): "
                   f"loss and gradient norm per step"), flush=True)
    X, y, _, _ = C.mnist(args.mnist)
    perm = np.random.default_rng(0).permutation(len(X))[:args.steps * args.batch]
    X, y = X[perm].astype(np.float64), y[perm]
    nets = {"softmax regression 784-10, SGD lr 0.5": (softmax_regression, 0.5),
            "MLP 784-480-160-10, SGD lr 0.1": (mlp, 0.1)}
    results: dict[str, dict] = {}
    rows: list[dict] = []
    sess = (contextlib.nullcontext(None) if args.in_process
            else C.session("local[2]", driver_memory="2g"))
    with sess as spark, tempfile.TemporaryDirectory(prefix="sparknet-paper-conv-") as tmp:
        for net, (make, lr) in nets.items():
            runs: dict[str, dict] = {}
            init = None
            for K in KS:
                r = run(make(), K, spark, X, y, args.steps, args.batch, lr, init, tmp)
                init = r.pop("init")
                runs[f"K = {K}"] = r
                print(f"{net}, K = {K}: loss {r['loss'][0]:.4f} -> {r['loss'][-1]:.4f}, "
                      f"gradient norm {r['grad_norm'][0]:.4f} -> {r['grad_norm'][-1]:.4f} "
                      f"(load {C.load1():.1f})", flush=True)
            runs["one process"] = one_process(make(), X, y, args.steps, args.batch, lr, init)
            results[net] = runs
            for run_name, r in runs.items():
                for s, (lo, g) in enumerate(zip(r["loss"], r["grad_norm"])):
                    rows.append({"net": net, "run": run_name, "step": s + 1, "loss": lo,
                                 "grad_norm": g,
                                 "where": "one process" if run_name == "one process" else where,
                                 "dtype": "float64"})
    C.write_csv(NAME, rows)
    plot(results)
    print()
    for net, runs in results.items():
        ref = runs["K = 1"]
        for key in ("loss", "grad_norm"):
            a = np.array(ref[key])
            dk = max(float(np.max(np.abs(np.array(runs[f"K = {K}"][key]) - a) / np.abs(a)))
                     for K in KS[1:])
            d1 = float(np.max(np.abs(np.array(runs["one process"][key]) - a) / np.abs(a)))
            print(f"{net}: {key}: largest relative difference between K = 1 and K = 2, 4: "
                  f"{dk:.2e}; K = 1 against one process: {d1:.2e} ({args.steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Transformer encoder over MNIST rows (28 steps of 28 pixels), single process.

    python examples/transformer_mnist.py ../shared/data/mnist [--epochs 10] [--layers 2]

Each image row is one token: a dense projection to ``d_model``, learned positions, a stack
of ``TransformerEncoder`` layers (pre-norm, gelu), mean pooling over the 28 tokens and a
softmax.  AdamW with warm-up and cosine decay, batch 64.  Prints the test accuracy after
every epoch and the training time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from sparknet import (
    AdamW,
    Dense,
    GlobalAveragePooling1D,
    LayerNormalization,
    LearningRateScheduler,
    PositionalEmbedding,
    Sequential,
    TransformerEncoder,
)
from sparknet.datasets import load_mnist
from sparknet.schedules import CosineDecay, LinearWarmup


def build_model(seed: int = 0, d_model: int = 64, heads: int = 4, ffn: int = 128,
                layers: int = 2, dropout: float = 0.1) -> Sequential:
    stack = [Dense(d_model), PositionalEmbedding(28)]
    stack += [TransformerEncoder(heads, ffn, dropout=dropout, activation="gelu", norm_first=True)
              for _ in range(layers)]
    stack += [LayerNormalization(), GlobalAveragePooling1D(), Dense(10, activation="softmax")]
    return Sequential(stack, input_shape=(28, 28), seed=seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mnist", nargs="?", default=os.path.join("..", "shared", "data", "mnist"),
                    help="the folder of the four MNIST IDX files (../shared/data/mnist)")
    ap.add_argument("--epochs", type=int, default=10, help="passes over the training set (10)")
    ap.add_argument("--batch-size", type=int, default=64, help="samples per step (64)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (2e-3)")
    ap.add_argument("--d-model", type=int, default=64, help="token width (64)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (4)")
    ap.add_argument("--ffn", type=int, default=128, help="feed-forward width (128)")
    ap.add_argument("--layers", type=int, default=2, help="encoder layers (2)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (1)")
    ap.add_argument("--limit", type=int, default=0,
                    help="train on the first N images only (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="initialisation and shuffling seed (0)")
    ap.add_argument("--save", default=None, help="write the trained model to this .npz file")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.mnist):
        print(f"error: MNIST folder {args.mnist!r} not found", file=sys.stderr)
        return 2
    X, y, Xt, yt = load_mnist(args.mnist, flat=False)
    X, Xt = X.reshape(-1, 28, 28), Xt.reshape(-1, 28, 28)
    if args.limit:
        X, y = X[:args.limit], y[:args.limit]
    model = build_model(args.seed, args.d_model, args.heads, args.ffn, args.layers)
    steps = args.epochs * -(-X.shape[0] // args.batch_size)
    warmup = min(500, steps // 10)
    schedule = LearningRateScheduler(LinearWarmup(CosineDecay(args.lr, decay_steps=steps),
                                                  warmup_steps=max(warmup, 1)))
    print(f"{model.n_params:,} parameters; {X.shape[0]:,} training images as 28 tokens of 28 "
          f"pixels, {args.epochs} epochs", flush=True)
    t0 = time.perf_counter()
    history = model.fit(X, y, epochs=args.epochs, batch_size=args.batch_size,
                        validation_data=(Xt, yt), optimizer=AdamW(lr=args.lr, weight_decay=0.01),
                        callbacks=[schedule], verbose=1, num_threads=args.threads)
    seconds = time.perf_counter() - t0
    for epoch, acc in enumerate(history.history["val_accuracy"], 1):
        print(f"epoch {epoch}: test accuracy {acc:.2%}")
    final = model.evaluate(Xt, yt)["accuracy"]
    print(f"test accuracy {final:.2%} after {args.epochs} epochs, {seconds:.0f} s of training")
    if args.save:
        model.save(args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())

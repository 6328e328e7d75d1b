"""A residual CNN with BatchNormalization on MNIST, single process.

    python examples/resnet_mnist.py ../shared/data/mnist [--epochs 8] [--threads 2]

conv5x5x32-BN-relu, pool, a residual block of two 3x3x32 convolutions (each followed by
BatchNormalization), pool, conv3x3x64-BN-relu, a residual block of two 3x3x64
convolutions, pool, dense 128 with dropout, softmax.  Adam with a cosine-decayed rate, batch
64.  Prints the test accuracy after every epoch (with the running statistics of the
BatchNormalization layers, i.e. inference mode) and the training time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from sparknet import (
    Activation,
    Adam,
    BatchNormalization,
    Conv2D,
    Dense,
    Dropout,
    Flatten,
    LearningRateScheduler,
    MaxPool2D,
    Residual,
    Sequential,
)
from sparknet.datasets import load_mnist
from sparknet.schedules import CosineDecay


def conv_bn_relu(filters: int, size: int) -> list:
    return [Conv2D(filters, size, padding="same", use_bias=False), BatchNormalization(),
            Activation("relu")]


def residual_block(filters: int) -> list:
    """``relu(x + BN(conv(relu(BN(conv(x))))))``: the basic block of a ResNet."""
    return [Residual([*conv_bn_relu(filters, 3),
                      Conv2D(filters, 3, padding="same", use_bias=False), BatchNormalization()]),
            Activation("relu")]


def build_model(seed: int = 0, width: int = 32) -> Sequential:
    return Sequential([
        *conv_bn_relu(width, 5),
        MaxPool2D(2),                                  # 28x28 -> 14x14
        *residual_block(width),
        MaxPool2D(2),                                  # 14x14 -> 7x7
        *conv_bn_relu(2 * width, 3),
        *residual_block(2 * width),
        MaxPool2D(2, padding="same"),                  # 7x7 -> 4x4
        Flatten(),
        Dropout(0.3),
        Dense(128, activation="relu"),
        Dense(10, activation="softmax"),
    ], input_shape=(28, 28, 1), seed=seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mnist", nargs="?", default=os.path.join("..", "shared", "data", "mnist"),
                    help="the folder of the four MNIST IDX files (../shared/data/mnist)")
    ap.add_argument("--epochs", type=int, default=8, help="passes over the training set (8)")
    ap.add_argument("--batch-size", type=int, default=64, help="samples per step (64)")
    ap.add_argument("--lr", type=float, default=2e-3, help="initial Adam learning rate (2e-3)")
    ap.add_argument("--width", type=int, default=32, help="channels of the first stage (32)")
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
    if args.limit:
        X, y = X[:args.limit], y[:args.limit]
    model = build_model(args.seed, args.width)
    steps = args.epochs * -(-X.shape[0] // args.batch_size)
    schedule = LearningRateScheduler(CosineDecay(args.lr, decay_steps=steps))
    print(f"{model.n_params:,} parameters, {model.n_state:,} running statistics; "
          f"{X.shape[0]:,} training images, {args.epochs} epochs", flush=True)
    t0 = time.perf_counter()
    history = model.fit(X, y, epochs=args.epochs, batch_size=args.batch_size,
                        validation_data=(Xt, yt), optimizer=Adam(lr=args.lr),
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

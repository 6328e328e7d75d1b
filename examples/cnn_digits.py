"""A small CNN on scikit-learn's 8x8 digits, single process.

    python examples/cnn_digits.py [--epochs 20] [--save digits_cnn.npz]

Images are channels-last ``(N, 8, 8, 1)``; the test set is a fixed, seeded, stratified
25% split.  Prints the per-epoch validation accuracy, the final test accuracy and the
training time.
"""
from __future__ import annotations

import argparse
import time

from sparknet import Conv2D, Dense, Dropout, Flatten, MaxPool2D, RMSprop, Sequential
from sparknet.datasets import load_digits


def build_model(seed: int = 0) -> Sequential:
    return Sequential([
        Conv2D(32, 3, padding="same", activation="relu"),
        Conv2D(32, 3, padding="same", activation="relu"),
        MaxPool2D(2),                                   # 8x8 -> 4x4
        Conv2D(64, 3, padding="same", activation="relu"),
        MaxPool2D(2),                                   # 4x4 -> 2x2
        Flatten(),
        Dropout(0.3),
        Dense(64, activation="relu"),
        Dense(10, activation="softmax"),
    ], input_shape=(8, 8, 1), seed=seed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", default=None, help="write the trained model to this .npz file")
    args = ap.parse_args(argv)

    X_train, y_train, X_test, y_test = load_digits(flat=False)
    model = build_model(args.seed)
    print(model.summary())
    t0 = time.perf_counter()
    opt = RMSprop(lr=args.lr)
    first = max(1, int(0.7 * args.epochs))  # then continue at 0.3x the learning rate
    model.fit(X_train, y_train, epochs=first, batch_size=args.batch_size, optimizer=opt,
              validation_data=(X_test, y_test), verbose=1)
    if args.epochs > first:
        opt.lr = 0.3 * args.lr
        model.fit(X_train, y_train, epochs=args.epochs - first, batch_size=args.batch_size,
                  optimizer=opt, validation_data=(X_test, y_test), verbose=1)
    elapsed = time.perf_counter() - t0
    result = model.evaluate(X_test, y_test)
    print(f"test accuracy {result['accuracy']:.4f} (loss {result['loss']:.4f}) "
          f"after {args.epochs} epochs in {elapsed:.1f} s")
    if args.save:
        model.save(args.save)
        print(f"model written to {args.save}")


if __name__ == "__main__":
    main()

"""Speedup against partitions of the paper's character LSTM (200 units) on Shakespeare.

The net: a 32-wide character embedding, LSTM(200) over windows of ``--seq-len`` (50)
characters, a softmax over the corpus's characters at every step (the next character);
the paper reports 1.59x on 5 nodes.  One process (``Sequential.fit``, one BLAS thread)
against sparknet's synchronous data-parallel rounds (``sync="average"``, tau about half a
partition's epoch of local steps, 2-3 rounds per epoch: what the trainer's
``local_steps="auto"`` makes for a net this slow) on ``local[1]``, ``local[2]`` and a
standalone cluster of 2 one-core workers,
on the first ``--chars`` characters of ``shakespeare.txt`` (default 400,000 of its
5.06 million, a twelfth of an epoch of the corpus, to keep the run short), RMSprop lr 2e-3,
batch 64, ``--epochs`` epochs of that text per Spark fit (the median kept).  The cost
model's prediction is measured on the same session just before each fit.  Writes
``results/speedup_lstm.csv`` and ``.png``.

    python benchmarks/paper/speedup_lstm.py [--chars 400000] [--epochs 2]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", default=C.DEFAULT_TEXT)
    ap.add_argument("--chars", type=int, default=400_000,
                    help="characters of the corpus used (default 400,000)")
    ap.add_argument("--seq-len", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each Spark fit (default 2)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sessions", nargs="+", default=list(C.SESSIONS), choices=list(C.SESSIONS))
    args = ap.parse_args(argv)
    X, Y, vocab = C.shakespeare(args.chars, args.seq_len, args.text)
    C.partitions_figure("speedup_lstm", "char LSTM(200), Shakespeare: speedup vs partitions",
                        lambda: C.char_lstm_model(vocab, args.seq_len), X, Y, args.batch,
                        args.epochs,
                        f"Shakespeare, first {args.chars:,} characters "
                        f"({len(X):,} windows of {args.seq_len})",
                        lr=2e-3, sessions=tuple(args.sessions), baseline_epochs=1,
                        local_steps=lambda p: max(1, math.ceil(len(X) / p / args.batch) // 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

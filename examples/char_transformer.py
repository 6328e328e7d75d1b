"""Character-level language model on Shakespeare with a causal Transformer, to set beside
``examples/char_lstm.py`` (the paper's 2-layer LSTM) at equal training time.

    python examples/char_transformer.py ../shared/data/shakespeare.txt --minutes 6

Embedding, learned positions, ``--layers`` causal ``TransformerEncoder`` layers (pre-norm,
gelu) and a softmax over the vocabulary at every position; trained on random windows of
``--seq-len`` characters.  The held-out text is the same tail as ``char_lstm.py``'s (5% of
the text, at most 30,000 characters), scored in consecutive windows: each character is
predicted from the characters before it in its window (the LSTM carries its state across
the whole tail, so it sees more context).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from sparknet import (
    AdamW,
    Dense,
    Embedding,
    LayerNormalization,
    PositionalEmbedding,
    Sequential,
    TransformerEncoder,
)
from sparknet.data import char_vocab
from sparknet.datasets import load_text
from sparknet.schedules import CosineDecay, LinearWarmup
from sparknet.threads import blas_threads

LN2 = math.log(2.0)


def build_model(vocab: int, seq_len: int, d_model: int, heads: int, ffn: int, layers: int,
                dropout: float, seed: int) -> Sequential:
    stack = [Embedding(vocab, d_model), PositionalEmbedding(seq_len)]
    stack += [TransformerEncoder(heads, ffn, dropout=dropout, activation="gelu", norm_first=True,
                                 causal=True) for _ in range(layers)]
    stack += [LayerNormalization(), Dense(vocab, activation="softmax")]
    return Sequential(stack, input_shape=(seq_len,), seed=seed)


def windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive, non-overlapping ``(inputs, next characters)`` windows of ``ids``."""
    n = (len(ids) - 1) // seq_len
    X = ids[:n * seq_len].reshape(n, seq_len)
    Y = ids[1:n * seq_len + 1].reshape(n, seq_len)
    return X, Y


def evaluate_bpc(model: Sequential, ids: np.ndarray, seq_len: int, batch: int = 64) -> float:
    X, Y = windows(ids, seq_len)
    tot_s = tot_w = 0.0
    for k in range(0, X.shape[0], batch):
        s, w, _ = model.loss_and_grad(X[k:k + batch], Y[k:k + batch], need_grad=False,
                                      training=False)
        tot_s, tot_w = tot_s + s, tot_w + w
    return tot_s / tot_w / LN2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=os.path.join("..", "shared", "data",
                                                            "shakespeare.txt"),
                    help="the text file (../shared/data/shakespeare.txt)")
    ap.add_argument("--seq-len", type=int, default=128, help="window length (128)")
    ap.add_argument("--d-model", type=int, default=128, help="token width (128)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (4)")
    ap.add_argument("--ffn", type=int, default=512, help="feed-forward width (512)")
    ap.add_argument("--layers", type=int, default=3, help="encoder layers (3)")
    ap.add_argument("--dropout", type=float, default=0.0, help="dropout (0)")
    ap.add_argument("--batch", type=int, default=32, help="windows per step (32)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (2e-3)")
    ap.add_argument("--minutes", type=float, default=6.0, help="time budget in minutes (6)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--print-every", type=int, default=50, help="steps between loss lines (50)")
    ap.add_argument("--eval-every", type=int, default=500,
                    help="steps between held-out scores (500)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.path):
        print(f"error: text file {args.path!r} not found", file=sys.stderr)
        return 2

    text = load_text(args.path)
    chars, ids = char_vocab(text)
    n_val = max(min(len(ids) // 20, 30_000), (args.seq_len + 1) * 16 + 1)   # as char_lstm.py
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    model = build_model(len(chars), args.seq_len, args.d_model, args.heads, args.ffn, args.layers,
                        args.dropout, args.seed)
    # the rate schedule assumes the budget's steps; the first 200 steps measure the pace
    opt = AdamW(lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(args.seed)
    print(f"{len(text):,} characters, vocabulary {len(chars)}, {model.n_params:,} parameters; "
          f"{args.layers} x TransformerEncoder(d_model {args.d_model}, {args.heads} heads, ffn "
          f"{args.ffn}), windows of {args.seq_len} x {args.batch}; uniform guess = "
          f"{math.log2(len(chars)):.2f} bits/char", flush=True)
    budget = args.minutes * 60.0
    schedule: LinearWarmup | None = None
    offsets = np.arange(args.seq_len + 1)
    t0 = time.perf_counter()
    step, run_s, run_w = 0, 0.0, 0.0
    with blas_threads(args.threads):
        while True:
            if step == 200 or (schedule is None and args.steps):
                pace = (time.perf_counter() - t0) / max(step, 1)
                total = args.steps or int(budget / max(pace, 1e-9))
                schedule = LinearWarmup(CosineDecay(args.lr, decay_steps=max(total - 200, 1),
                                                    min_lr=args.lr / 50), warmup_steps=200)
            opt.lr = (schedule(step) if schedule is not None
                      else args.lr * (step + 1) / 200)
            starts = rng.integers(0, len(train_ids) - args.seq_len - 1, size=args.batch)
            rows = train_ids[starts[:, None] + offsets]
            s, w, _ = model.loss_and_grad(rows[:, :-1], rows[:, 1:])
            if not np.isfinite(s):
                print(f"loss became {s} at step {step}; lower --lr", file=sys.stderr)
                return 1
            norm = float(np.linalg.norm(model.grads))
            if norm > 1.0:
                model.grads *= 1.0 / norm
            opt.step(model.params, model.grads)
            step += 1
            run_s, run_w = run_s + s, run_w + w
            elapsed = time.perf_counter() - t0
            done = elapsed >= budget or bool(args.steps and step >= args.steps)
            if step % args.print_every == 0 or done:
                bits = run_s / run_w / LN2
                print(f"step {step:5d}  {elapsed:7.1f} s  train {bits:.3f} bits/char", flush=True)
                run_s = run_w = 0.0
            if step % args.eval_every == 0 or done:
                bpc = evaluate_bpc(model, val_ids, args.seq_len)
                print(f"--- held-out: {bpc:.3f} bits/char after {elapsed:.0f} s", flush=True)
            if done:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Character-level language model on Shakespeare: a 2-layer, 200-unit LSTM trained by
truncated backpropagation through time (stateful, 100-step chunks), as in the paper.

It prints the training loss in bits per character, the loss on a held-out tail of the
text, and a 300-character sample now and then.

Usage::

    python examples/char_lstm.py ../shared/data/shakespeare.txt --minutes 10
    python examples/char_lstm.py ../shared/data/shakespeare.txt --steps 500 --sample-every 100

The training loop is written by hand (``loss_and_grad`` + ``optimizer.step``): the
recurrent layers are ``stateful=True``, so row ``i`` of each batch continues row ``i`` of
the previous one (:func:`sparknet.data.bptt_batches` lays the text out that way) and
the state is carried between chunks without backpropagating into the previous chunk.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from sparknet import LSTM, Dense, Embedding, Sequential
from sparknet.data import bptt_batches, char_vocab
from sparknet.datasets import load_text
from sparknet.layers.recurrent import reset_states
from sparknet.optim import RMSprop
from sparknet.threads import blas_threads

LN2 = math.log(2.0)


def build_model(vocab: int, hidden: int, layers: int, embed: int, seq_len: int,
                seed: int) -> Sequential:
    stack = [Embedding(vocab, embed)]
    stack += [LSTM(hidden, return_sequences=True, stateful=True) for _ in range(layers)]
    stack += [Dense(vocab, activation="softmax")]
    return Sequential(stack, input_shape=(seq_len,), seed=seed)


def sample(model: Sequential, chars: list[str], n: int, prime: str, temperature: float,
           rng: np.random.Generator) -> str:
    """Generate ``n`` characters after ``prime`` with a batch-of-one copy of ``model``."""
    gen = model.clone()            # same weights; its own (batch-of-one) state
    reset_states(gen)
    lut = {c: i for i, c in enumerate(chars)}
    ids = [lut[c] for c in prime if c in lut] or [0]
    out = gen.forward(np.array([ids]))           # read the prime
    text = []
    for _ in range(n):
        logits = out[0, -1].astype(np.float64) / max(temperature, 1e-6)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        nxt = int(rng.choice(len(chars), p=p))
        text.append(chars[nxt])
        out = gen.forward(np.array([[nxt]]))
    return "".join(text)


def evaluate_bpc(model: Sequential, ids: np.ndarray, seq_len: int, batch: int = 16) -> float:
    """Bits per character of ``model`` on ``ids`` (a fresh stateful pass over the stream)."""
    ev = model.clone()
    reset_states(ev)
    X, Y = bptt_batches(ids, batch_size=batch, seq_len=seq_len)
    tot_s = tot_w = 0.0
    for k in range(0, X.shape[0], batch):
        s, w, _ = ev.loss_and_grad(X[k:k + batch], Y[k:k + batch], need_grad=False, training=False)
        tot_s, tot_w = tot_s + s, tot_w + w
    return tot_s / tot_w / LN2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Character-level LSTM on Shakespeare (truncated BPTT).")
    ap.add_argument("path", nargs="?", help="the text file, e.g. ../shared/data/shakespeare.txt")
    ap.add_argument("--hidden", type=int, default=200, help="units per LSTM layer (200)")
    ap.add_argument("--layers", type=int, default=2, help="LSTM layers (2)")
    ap.add_argument("--embed", type=int, default=64, help="character embedding size (64)")
    ap.add_argument("--seq-len", type=int, default=100, help="BPTT chunk length (100)")
    ap.add_argument("--batch", type=int, default=32, help="parallel streams per batch (32)")
    ap.add_argument("--lr", type=float, default=2e-3, help="RMSprop learning rate (2e-3)")
    ap.add_argument("--clip", type=float, default=5.0, help="clip the gradient's global norm (5)")
    ap.add_argument("--minutes", type=float, default=10.0, help="time budget in minutes (10)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--chars", type=int, default=0, help="use only the first N characters (0: all)")
    ap.add_argument("--print-every", type=int, default=20, help="steps between loss lines (20)")
    ap.add_argument("--sample-every", type=int, default=200, help="steps between samples (200)")
    ap.add_argument("--sample-len", type=int, default=300, help="characters per sample (300)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0.8)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if not args.path:
        ap.print_usage(sys.stderr)
        print("error: give the path of the text to train on, e.g. ../shared/data/shakespeare.txt",
              file=sys.stderr)
        return 2
    if not os.path.isfile(args.path):
        print(f"error: text file {args.path!r} not found (the Shakespeare corpus is at "
              f"../shared/data/shakespeare.txt next to this repository)", file=sys.stderr)
        return 2

    text = load_text(args.path)
    if args.chars:
        text = text[:args.chars]
    chars, ids = char_vocab(text)
    # a held-out tail: 5% of the text, at most 30,000 characters (a quick evaluation)
    n_val = max(min(len(ids) // 20, 30_000), (args.seq_len + 1) * 16 + 1)
    if len(ids) - n_val < (args.seq_len + 1) * args.batch:
        print(f"error: the text ({len(ids)} characters) is too short for {args.batch} streams of "
              f"{args.seq_len}-step chunks", file=sys.stderr)
        return 2
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    X, Y = bptt_batches(train_ids, batch_size=args.batch, seq_len=args.seq_len)
    n_chunks = X.shape[0] // args.batch

    model = build_model(len(chars), args.hidden, args.layers, args.embed, args.seq_len, args.seed)
    opt = RMSprop(lr=args.lr)
    rng = np.random.default_rng(args.seed)
    print(f"{len(text):,} characters, vocabulary {len(chars)}, {model.n_params:,} parameters; "
          f"{args.layers} x LSTM({args.hidden}), chunks of {args.seq_len} steps x {args.batch} "
          f"streams ({n_chunks} chunks per pass); uniform guess = {math.log2(len(chars)):.2f} "
          "bits/char", flush=True)

    budget = args.minutes * 60.0
    t0 = time.perf_counter()
    step, run_s, run_w = 0, 0.0, 0.0
    with blas_threads():
        while True:
            k = step % n_chunks
            if k == 0:
                reset_states(model)          # a new pass over the text starts from a zero state
            sl = slice(k * args.batch, (k + 1) * args.batch)
            s, w, _ = model.loss_and_grad(X[sl], Y[sl])
            if not np.isfinite(s):
                print(f"loss became {s} at step {step}; lower --lr", file=sys.stderr)
                return 1
            norm = float(np.linalg.norm(model.grads))
            if norm > args.clip:
                model.grads *= args.clip / norm
            opt.step(model.params, model.grads)
            step += 1
            run_s, run_w = run_s + s, run_w + w
            elapsed = time.perf_counter() - t0
            done = elapsed >= budget or (args.steps and step >= args.steps)
            if step % args.print_every == 0 or done:
                print(f"step {step:5d}  pass {step / n_chunks:5.2f}  {elapsed:7.1f} s  "
                      f"train {run_s / run_w / LN2:.3f} bits/char", flush=True)
                run_s = run_w = 0.0
            if step % args.sample_every == 0 or done:
                bpc = evaluate_bpc(model, val_ids, args.seq_len)
                print(f"--- held-out: {bpc:.3f} bits/char after {elapsed:.0f} s; sample:",
                      flush=True)
                print(sample(model, chars, args.sample_len, "\n", args.temperature, rng),
                      flush=True)
                print("---", flush=True)
            if done:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())

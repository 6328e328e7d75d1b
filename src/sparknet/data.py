"""Sequence data helpers: padding with masks, and batches for truncated BPTT.

Example::

    X, mask = pad_sequences([[3, 1, 4], [1, 5], [9, 2, 6, 5]])      # token ids
    X.shape, mask.shape            # (3, 4), (3, 4)
    model.fit(X, y, mask=mask)     # masked steps add nothing to loss or gradients
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sparknet._validation import non_negative_int, positive_int

__all__ = ["pad_sequences", "lengths_to_mask", "char_vocab", "bptt_batches"]


def pad_sequences(seqs: Sequence[Any], maxlen: int | None = None, padding: str = "post",
                  truncating: str = "post", value: Any = 0,
                  dtype: str | type | np.dtype | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pad (and cut) variable-length sequences into one array plus a mask.

    Args:
        seqs: a list of sequences; each is ``(length,)`` (token ids or scalars) or
            ``(length, features...)``; all must share the trailing ``features`` shape.
            Lengths may be 0.
        maxlen: length ``T`` of the result; default: the longest sequence.
        padding: ``"post"`` (pad at the end, default) or ``"pre"`` (pad at the start).
        truncating: for sequences longer than ``maxlen``: ``"post"`` keeps the first
            ``maxlen`` steps (default), ``"pre"`` keeps the last ``maxlen``.
        value: the fill value of padded steps.
        dtype: dtype of the result; default int64 when every sequence holds integers
            (token ids), float32 otherwise.

    Returns:
        ``(X, mask)``: ``X`` of shape ``(N, T, features...)`` and ``mask`` ``(N, T)`` bool,
        True at real steps, False at padded ones.

    Raises:
        ValueError: for an empty list, a bad ``padding``/``truncating``/``maxlen``,
            sequences whose feature shapes differ (the message names the first one that
            differs), or non-numeric entries.
    """
    if padding not in ("post", "pre"):
        raise ValueError(f"padding must be 'post' or 'pre', got {padding!r}")
    if truncating not in ("post", "pre"):
        raise ValueError(f"truncating must be 'post' or 'pre', got {truncating!r}")
    if isinstance(seqs, np.ndarray) and seqs.dtype != object:
        seqs = list(seqs)
    try:
        n = len(seqs)
    except TypeError as exc:
        raise ValueError("pad_sequences takes a list of sequences") from exc
    if n == 0:
        raise ValueError("pad_sequences got no sequences")
    arrs = []
    feat = None
    for i, s in enumerate(seqs):
        try:
            a = np.asarray(s)
        except ValueError as exc:
            raise ValueError(f"sequence {i} is itself ragged (its steps differ in size)") from exc
        if a.dtype == object or a.dtype.kind not in "biuf":
            raise ValueError(f"sequence {i} is not numeric (dtype {a.dtype}); steps of one "
                             f"sequence must all have the same shape")
        if a.ndim == 0:
            raise ValueError(f"sequence {i} is a scalar; each sequence must be a list/array of "
                             "steps")
        if a.shape[0] > 0:
            if feat is None:
                feat, first = a.shape[1:], i
            elif a.shape[1:] != feat:
                raise ValueError(f"sequence {i} has steps of shape {a.shape[1:]} but sequence "
                                 f"{first} has {feat}; all steps must share one shape")
        arrs.append(a)
    if feat is None:
        raise ValueError("every sequence is empty; nothing to pad")
    maxlen = max(a.shape[0] for a in arrs) if maxlen is None else positive_int(maxlen, "maxlen")
    if dtype is None:
        dtype = np.int64 if all(a.dtype.kind in "biu" for a in arrs if a.size) else np.float32
    X = np.full((n, maxlen) + tuple(feat), value, dtype=dtype)
    mask = np.zeros((n, maxlen), dtype=bool)
    for i, a in enumerate(arrs):
        L = a.shape[0]
        if L == 0:
            continue
        if L > maxlen:
            a = a[:maxlen] if truncating == "post" else a[L - maxlen:]
            L = maxlen
        if padding == "post":
            X[i, :L] = a
            mask[i, :L] = True
        else:
            X[i, maxlen - L:] = a
            mask[i, maxlen - L:] = True
    return X, mask


def lengths_to_mask(lengths: Any, maxlen: int | None = None, padding: str = "post") -> np.ndarray:
    """An ``(N, T)`` bool mask from sequence lengths.

    Args:
        lengths: ``(N,)`` non-negative integers.
        maxlen: ``T`` (default: the largest length); lengths above it are cut.
        padding: ``"post"``: the valid steps come first; ``"pre"``: they come last.

    Raises:
        ValueError: for negative or non-integer lengths or a bad ``padding``.
    """
    L = np.asarray(lengths)
    if L.ndim != 1 or L.dtype.kind not in "iu" or (L.size and L.min() < 0):
        raise ValueError(f"lengths must be a 1-D array of non-negative integers, got {L!r}")
    if padding not in ("post", "pre"):
        raise ValueError(f"padding must be 'post' or 'pre', got {padding!r}")
    T = int(L.max()) if maxlen is None else non_negative_int(maxlen, "maxlen")
    steps = np.arange(T)
    if padding == "post":
        return steps[None, :] < L[:, None]
    return steps[None, :] >= (T - L)[:, None]


def char_vocab(text: str) -> tuple[list[str], np.ndarray]:
    """The sorted characters of ``text`` and ``text`` as int64 ids into that list."""
    if not isinstance(text, str):
        raise ValueError(f"char_vocab takes a str, got {type(text).__name__}")
    if not text:
        raise ValueError("char_vocab got an empty text")
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((lut[c] for c in text), dtype=np.int64, count=len(text))
    return chars, ids


def bptt_batches(tokens: Any, batch_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Lay a token stream out for stateful training by truncated BPTT.

    The stream is cut into ``batch_size`` contiguous streams, each read in chunks of
    ``seq_len`` steps.  Rows ``k * batch_size .. (k + 1) * batch_size - 1`` of the result
    are chunk ``k`` of every stream, so row ``i`` of batch ``k + 1`` continues row ``i`` of
    batch ``k``: feed it in order with a fixed batch size (``Sequential.fit(X, Y,
    batch_size=batch_size, shuffle=False)`` with ``stateful=True`` recurrent layers).

    Args:
        tokens: 1-D int token ids.
        batch_size: number of parallel streams ``B``.
        seq_len: steps per chunk.

    Returns:
        ``(X, Y)``, both ``(K * B, seq_len)`` int64, ``Y`` the next token of each ``X``.

    Raises:
        ValueError: if the stream is too short for one chunk per stream.
    """
    t = np.asarray(tokens)
    if t.ndim != 1 or t.dtype.kind not in "iu":
        raise ValueError(f"tokens must be a 1-D integer array, got shape {t.shape} dtype {t.dtype}")
    batch_size = positive_int(batch_size, "batch_size")
    seq_len = positive_int(seq_len, "seq_len")
    per_stream = (t.shape[0] - 1) // batch_size
    K = per_stream // seq_len
    if K == 0:
        raise ValueError(f"a stream of {t.shape[0]} tokens is too short for {batch_size} streams "
                         f"of at least {seq_len + 1} tokens")
    L = K * seq_len
    x = np.stack([t[i * per_stream:i * per_stream + L] for i in range(batch_size)])
    y = np.stack([t[i * per_stream + 1:i * per_stream + L + 1] for i in range(batch_size)])
    # (B, K, S) -> (K, B, S) -> (K*B, S)
    X = x.reshape(batch_size, K, seq_len).transpose(1, 0, 2).reshape(K * batch_size, seq_len)
    Y = y.reshape(batch_size, K, seq_len).transpose(1, 0, 2).reshape(K * batch_size, seq_len)
    return np.ascontiguousarray(X, dtype=np.int64), np.ascontiguousarray(Y, dtype=np.int64)

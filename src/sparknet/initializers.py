"""Seeded weight initialisers (Glorot / He), writing into preallocated views."""
from __future__ import annotations

import numpy as np

NAMES = ("glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "zeros", "orthogonal")


def check_name(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"unknown initializer {name!r}; choose one of {', '.join(NAMES)}")
    return name


def fill(out: np.ndarray, name: str, fan_in: int, fan_out: int, rng: np.random.Generator) -> None:
    """Fill ``out`` in place with initializer ``name`` for the given fans."""
    fan_in = max(int(fan_in), 1)
    fan_out = max(int(fan_out), 1)
    if name == "zeros":
        out[...] = 0
    elif name == "glorot_uniform":
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        out[...] = rng.uniform(-lim, lim, size=out.shape)
    elif name == "glorot_normal":
        out[...] = rng.normal(0.0, np.sqrt(2.0 / (fan_in + fan_out)), size=out.shape)
    elif name == "he_uniform":
        lim = np.sqrt(6.0 / fan_in)
        out[...] = rng.uniform(-lim, lim, size=out.shape)
    elif name == "he_normal":
        out[...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=out.shape)
    elif name == "orthogonal":
        rows = out.shape[0]
        cols = int(np.prod(out.shape[1:])) if out.ndim > 1 else 1
        a = rng.normal(size=(max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q = q * np.sign(np.diag(r))
        q = q if rows >= cols else q.T
        out[...] = q[:rows, :cols].reshape(out.shape)
    else:
        check_name(name)

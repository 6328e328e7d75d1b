"""Bundled and on-disk data sets: scikit-learn's digits, MNIST from IDX files, text."""
from __future__ import annotations

import gzip
import io
import os

import numpy as np
from numpy.typing import DTypeLike

#: ``(X_train, y_train, X_test, y_test)``
Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_digits(test_size: float = 0.25, seed: int = 0, flat: bool = True) -> Split:
    """scikit-learn's bundled 8x8 digits (1,797 images), scaled to [0, 1], split with a
    fixed seed, stratified.

    Returns ``(X_train, y_train, X_test, y_test)``; images are ``(N, 64)`` if ``flat``,
    else ``(N, 8, 8, 1)`` (channels last).
    """
    try:
        from sklearn.datasets import load_digits as _ld
        from sklearn.model_selection import train_test_split
    except ImportError as exc:  # pragma: no cover
        raise ImportError("load_digits needs scikit-learn: pip install scikit-learn") from exc
    d = _ld()
    X = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=seed, stratify=y)
    if not flat:
        Xtr, Xte = Xtr.reshape(-1, 8, 8, 1), Xte.reshape(-1, 8, 8, 1)
    return Xtr, ytr, Xte, yte


def _open(path: str) -> gzip.GzipFile | io.BufferedReader:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (optionally gzipped): big-endian magic, dims, then data."""
    dtypes: dict[int, DTypeLike] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4",
                                    0x0D: ">f4", 0x0E: ">f8"}
    with _open(path) as fh:
        head = fh.read(4)
        if len(head) != 4 or head[0] != 0 or head[1] != 0 or head[2] not in dtypes:
            raise ValueError(f"{path!r} is not an IDX file (bad magic {head!r})")
        ndim = head[3]
        dims = np.frombuffer(fh.read(4 * ndim), dtype=">i4").astype(np.int64)
        data = np.frombuffer(fh.read(), dtype=np.dtype(dtypes[head[2]]))
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path!r}: header says {tuple(dims)} ({int(np.prod(dims))} values), "
                         f"file holds {data.size}")
    return data.reshape(tuple(dims))


def _find(folder: str, stem: str) -> str:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz",
                 stem.replace("-idx", ".idx")):
        p = os.path.join(folder, name)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"MNIST file {stem}[.gz] not found in {folder!r}")


def load_mnist(path: str, flat: bool = True, dtype: type[np.floating] = np.float32) -> Split:
    """MNIST from a folder of the four IDX files (gzipped or not).

    Pass the folder, e.g. ``../shared/data/mnist``.  Pixels are scaled to [0, 1].
    Returns ``(X_train, y_train, X_test, y_test)`` with images ``(N, 784)`` if
    ``flat``, else ``(N, 28, 28, 1)``.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"MNIST folder {path!r} does not exist; pass the folder holding "
                                f"train-images-idx3-ubyte.gz etc. (here: ../shared/data/mnist)")
    out: list[np.ndarray] = []
    for prefix in ("train", "t10k"):
        imgs = read_idx(_find(path, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find(path, f"{prefix}-labels-idx1-ubyte"))
        if imgs.ndim != 3 or labels.ndim != 1 or imgs.shape[0] != labels.shape[0]:
            raise ValueError(f"MNIST {prefix}: images {imgs.shape} and labels {labels.shape} "
                             "disagree")
        X = imgs.astype(dtype) / dtype(255.0)
        X = X.reshape(X.shape[0], -1) if flat else X.reshape(X.shape[0], 28, 28, 1)
        out += [X, labels.astype(np.int64)]
    Xtr, ytr, Xte, yte = out
    return Xtr, ytr, Xte, yte


def load_text(path: str) -> str:
    """Read a text corpus (e.g. ``../shared/data/shakespeare.txt``) as one string."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"text file {path!r} not found; pass the path of the corpus "
                                f"(here: ../shared/data/shakespeare.txt)")
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        return fh.read()

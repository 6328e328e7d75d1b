"""Input checks that fail early with messages naming what is wrong."""
from __future__ import annotations

from typing import Any, Literal, Sequence, overload

import numpy as np
from numpy.typing import DTypeLike


@overload
def positive_int(value: Any, what: str, *, allow_none: Literal[False] = ..., extra: str = "") -> int: ...
@overload
def positive_int(value: Any, what: str, *, allow_none: bool, extra: str = "") -> int | None: ...


def positive_int(value: Any, what: str, *, allow_none: bool = False, extra: str = "") -> int | None:
    """``value`` as an ``int`` when it is a positive integer (not a bool); else ``ValueError``
    naming ``what``.  ``allow_none`` lets ``None`` through; ``extra`` names other accepted
    values in the message (``"or 'auto'"``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        alt = " or None" if allow_none else ""
        raise ValueError(f"{what} must be a positive integer{alt}{(' ' + extra) if extra else ''}, "
                         f"got {value!r}")
    return int(value)


def check_array(X: Any, name: str = "X", sample_shape: Sequence[int] | None = None,
                dtype: DTypeLike = np.float32, allow_int: bool = False) -> np.ndarray:
    """Return ``X`` as a C-contiguous array of ``dtype`` (or int64 when ``allow_int``).

    Raises ``ValueError`` naming the problem: non-numeric dtype, ragged rows, no rows,
    NaN or infinity, or a per-sample shape other than ``sample_shape``.
    """
    try:
        arr = np.asarray(X)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} is ragged (rows of different lengths); pad sequences first "
                         f"with sparknet.data.pad_sequences") from exc
    if arr.dtype == object:
        raise ValueError(f"{name} has dtype object (ragged rows or non-numeric values); "
                         f"pass a rectangular numeric array (pad sequences with "
                         f"sparknet.data.pad_sequences)")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} has non-numeric dtype {arr.dtype}; pass numbers")
    if arr.ndim == 0:
        raise ValueError(f"{name} is a scalar; pass an array with one row per sample")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 samples)")
    if sample_shape is not None and tuple(arr.shape[1:]) != tuple(sample_shape):
        got, want = tuple(arr.shape[1:]), tuple(sample_shape)
        if len(got) == 1 and len(want) == 1:
            raise ValueError(f"{name} has {got[0]} features per sample, the model expects {want[0]}")
        raise ValueError(f"{name} has per-sample shape {got}, the model expects {want}")
    if allow_int and arr.dtype.kind in "biu":
        return np.ascontiguousarray(arr, dtype=np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            first = np.argwhere(bad)[0]
            raise ValueError(f"{name} contains NaN or infinity (first at index {tuple(int(i) for i in first)})")
    return np.ascontiguousarray(arr, dtype=dtype)


def check_labels(y: Any, n: int, n_classes: int | None, name: str = "y",
                 lead_shape: Sequence[int] | None = None) -> np.ndarray:
    """Class ids as int64; checks length, integrality and range ``[0, n_classes)``."""
    arr = np.asarray(y)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} has non-numeric dtype {arr.dtype}; pass integer class ids")
    if arr.ndim == 0 or arr.shape[0] != n:
        raise ValueError(f"X has {n} samples but {name} has {arr.shape[0] if arr.ndim else 0}")
    if lead_shape is not None and tuple(arr.shape[1:]) != tuple(lead_shape):
        raise ValueError(f"{name} has per-sample shape {tuple(arr.shape[1:])}, expected {tuple(lead_shape)}")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinity")
        if not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} holds non-integer values; cross-entropy needs class ids")
    labels = arr.astype(np.int64)
    if n_classes is not None and labels.size:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds label {bad} outside [0, {n_classes}) "
                             f"(the model has {n_classes} outputs)")
    return np.ascontiguousarray(labels)


def check_targets(y: Any, n: int, out_shape: Sequence[int], dtype: DTypeLike, name: str = "y") -> np.ndarray:
    """Regression targets: same per-sample shape as the model output."""
    arr = check_array(y, name=name, dtype=dtype)
    if arr.shape[0] != n:
        raise ValueError(f"X has {n} samples but {name} has {arr.shape[0]}")
    if tuple(arr.shape[1:]) != tuple(out_shape):
        if arr.ndim == 1 and tuple(out_shape) == (1,):
            return arr.reshape(-1, 1)
        raise ValueError(f"{name} has per-sample shape {tuple(arr.shape[1:])}, "
                         f"the model outputs {tuple(out_shape)}")
    return arr


def check_mask(mask: Any, x_shape: Sequence[int], name: str = "mask") -> np.ndarray | None:
    """A (N, T) mask of 0/1 matching the first two axes of X."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype.kind not in "biuf":
        raise ValueError(f"{name} has non-numeric dtype {m.dtype}")
    if len(x_shape) < 2 or m.shape != tuple(x_shape[:2]):
        raise ValueError(f"{name} has shape {m.shape}; it must be (N, T) = {tuple(x_shape[:2])}")
    return np.ascontiguousarray(m != 0)

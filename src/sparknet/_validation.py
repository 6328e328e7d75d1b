"""Input checks that fail early with messages naming what is wrong."""
from __future__ import annotations

from typing import Any, Literal, Sequence, overload

import numpy as np
from numpy.typing import DTypeLike


@overload
def positive_int(value: Any, what: str, *, allow_none: Literal[False] = ...,
                 extra: str = "") -> int: ...
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


def non_negative_int(value: Any, what: str) -> int:
    """``value`` as an ``int`` when it is an integer >= 0 (not a bool); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def check_bool(value: Any, what: str) -> bool:
    """``value`` as a ``bool`` when it is one (or a numpy bool, or the int 0 or 1)."""
    if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{what} must be True or False, got {value!r}")


def check_name(value: Any, what: str) -> str:
    """A name: a string."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


def check_float(value: Any, what: str, low: float = -np.inf, high: float = np.inf, *,
                low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a finite ``float`` in the interval from ``low`` to ``high`` (open at a side
    when ``*_open``); anything else (NaN, infinity, a string, None) raises ``ValueError`` naming
    ``what``, the interval and the value."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    f = float(value) if ok else float("nan")
    if ok and np.isfinite(f):
        ok = (f > low if low_open else f >= low) and (f < high if high_open else f <= high)
    else:
        ok = False
    if not ok:
        if low == 0 and low_open and high == np.inf:
            rule = "a positive finite number"
        elif high == np.inf:
            rule = f"a finite number >= {low:g}"
        else:
            rule = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{what} must be {rule}, got {value!r}")
    return f


def check_shape(value: Any, what: str) -> tuple[int, ...]:
    """A shape: a sequence of positive integers (not a string, not floats)."""
    items: Any = value
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, np.ndarray)):
        items = None
    elif any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0 for d in value):
        items = None
    if items is None:
        raise ValueError(f"{what} must be a sequence of positive integers (the per-sample shape), "
                         f"got {value!r}")
    return tuple(int(d) for d in items)


def is_pandas(value: Any) -> bool:
    """A pandas DataFrame or Series (told by its type's module; pandas is not imported)."""
    return type(value).__module__.split(".")[0] == "pandas" and hasattr(value, "to_numpy")


def refuse_pandas(value: Any, where: str, spark_only: bool = False) -> None:
    """Raise ``TypeError`` for a pandas DataFrame or Series where ``where`` reads Spark data
    (or numpy arrays), saying how to pass it."""
    if not is_pandas(value):
        return
    kind = type(value).__name__
    spark = ("a Spark DataFrame (spark.createDataFrame(df), then VectorAssembler(inputCols=[...], "
             "outputCol='features') for the feature columns)")
    if spark_only:
        raise TypeError(f"{where} takes {spark}, got a pandas {kind}")
    raise TypeError(f"{where} got a pandas {kind}: pass {spark}, or numpy arrays X and y "
                    f"(df[feature_columns].to_numpy(), df[label_column].to_numpy())")


#: what a Spark DataFrame or RDD given to a part that takes arrays is told, per part
_SPARK_INPUT_HINTS = {
    "sequential": ("a Sequential's fit, predict and evaluate run in this process on numpy "
                   "arrays. On the cluster, DataParallelTrainer(model, spark).fit(...) trains on "
                   "it (sparknet.cluster) and SparkNetClassificationModel.from_network(model)"
                   ".transform(df) scores a DataFrame (sparknet.ml; SparkNetRegressionModel for a "
                   "regressor); a small one may be collected to numpy arrays first"),
    "model_parallel": ("ModelParallel trains and predicts on numpy arrays, which the driver "
                       "cuts into minibatches for the blocks: collect the features and labels "
                       "to numpy first (rows = df.select('features', 'label').collect(); "
                       "X = np.stack([r.features.toArray() for r in rows]))"),
}


def refuse_spark(value: Any, name: str = "X", part: str = "sequential") -> None:
    """Raise ``TypeError`` for a Spark DataFrame or RDD handed to a part that takes arrays
    (``part``: a one-process ``Sequential``, or ``"model_parallel"``), saying what takes it or
    how to pass it (told by its type's module; pyspark is not imported)."""
    kind = type(value)
    if kind.__module__.split(".")[0] != "pyspark" or not (
            kind.__name__ == "DataFrame" or "RDD" in kind.__name__):
        return
    what = "DataFrame" if kind.__name__ == "DataFrame" else "RDD"
    raise TypeError(f"{name} is a Spark {what}: {_SPARK_INPUT_HINTS[part]}")


def check_not_class_labels(y: Any, last: Any) -> None:
    """Refuse class labels that would silently train as regression: no loss was given and the
    model's last layer ``last`` does not end in softmax, so the default is mean squared error."""
    labels = np.asarray(y)
    if labels.dtype.kind not in "iub" or labels.size == 0:
        return
    classes = np.unique(labels)
    if classes.size <= 2:
        return
    raise ValueError(
        f"y holds {classes.size} distinct integer labels ({classes[0]}..{classes[-1]}) but the "
        f"model ends in {type(last).__name__} {last.name!r} without a softmax and no loss was "
        f"given, so it would train as mean squared error on the label values: for "
        f"classification end with Dense({classes.size}, activation='softmax'), or keep the "
        f"logits (a network from PyTorch) and pass loss='sparse_categorical_crossentropy'; for "
        f"regression on integer targets pass loss='mse'")


def check_sample_weight(sample_weight: Any, n: int, dtype: DTypeLike) -> np.ndarray:
    """``(n,)`` finite, non-negative per-sample weights that do not all vanish."""
    sw = check_array(sample_weight, "sample_weight", dtype=dtype)
    if sw.shape != (n,):
        raise ValueError(f"sample_weight has shape {sw.shape}, expected ({n},)")
    neg = np.flatnonzero(sw < 0)
    if neg.size:
        raise ValueError(f"sample_weight holds a negative weight {float(sw[neg[0]])!r} at index "
                         f"{int(neg[0])}; weights must be >= 0")
    if not sw.any():
        raise ValueError("sample_weight is all zero: no sample would count")
    return sw


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
            raise ValueError(f"{name} has {got[0]} features per sample, the model expects "
                             f"{want[0]}")
        raise ValueError(f"{name} has per-sample shape {got}, the model expects {want}")
    if allow_int and arr.dtype.kind in "biu":
        return np.ascontiguousarray(arr, dtype=np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            first = np.argwhere(bad)[0]
            raise ValueError(f"{name} contains NaN or infinity (first at index "
                             f"{tuple(int(i) for i in first)})")
    target = np.dtype(dtype)
    if arr.dtype.kind == "f" and target.kind == "f" and target.itemsize < arr.dtype.itemsize:
        big = np.abs(arr) > np.finfo(target).max
        if big.any():
            first = np.argwhere(big)[0]
            raise ValueError(f"{name} holds values too large for {target.name} (first at index "
                             f"{tuple(int(i) for i in first)}: {float(arr[tuple(first)])!r}); "
                             f"rescale it")
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
        hint = ""
        if arr.ndim == len(lead_shape) + 2 and n_classes is not None and arr.shape[-1] == n_classes:
            hint = f"; cross-entropy takes class ids, not one-hot rows: pass {name}.argmax(axis=-1)"
        raise ValueError(f"{name} has per-sample shape {tuple(arr.shape[1:])}, expected "
                         f"{tuple(lead_shape)}{hint}")
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


def check_targets(y: Any, n: int, out_shape: Sequence[int], dtype: DTypeLike,
                  name: str = "y") -> np.ndarray:
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
    if m.dtype.kind == "f" and not np.isfinite(m).all():
        raise ValueError(f"{name} contains NaN or infinity; a mask holds 0 (padding) or 1 "
                         f"(a real step)")
    return np.ascontiguousarray(m != 0)

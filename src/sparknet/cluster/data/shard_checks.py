"""The last step of every shard build on the executors: the arrays made contiguous in the
training dtype, and the partition's :class:`~sparknet.cluster.data.shard_report.ShardReport`
(row count, the first NaN, the label range) from which the driver raises errors naming the
column and value.

Shared by the Arrow and RDD builds (:mod:`sparknet.cluster.data.sharding`) and the packed JVM
rows (:mod:`sparknet.cluster.data.packed_rows`).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from sparknet.cluster.data.shard_report import ShardReport


def summarise(x: np.ndarray | None, y: np.ndarray | None, classification: bool,
              found: Mapping[str, Any]) -> ShardReport:
    """The partition's :class:`ShardReport`: ``found`` (what the build found already) with
    the row count, the first non-finite feature and label, and the labels' range."""
    report = dict(found)
    n = 0 if y is None else int(y.shape[0])
    report["rows"] = n
    if x is not None and n:
        bad = ~np.isfinite(x)
        if bad.any():
            r, c = np.argwhere(bad)[0][:2] if x.ndim > 1 else (np.argwhere(bad)[0][0], 0)
            report["x_bad"] = (int(r), int(c), float(x[r].reshape(-1)[c]))
    if y is not None and n:
        yf = y.reshape(n, -1)
        bad = ~np.isfinite(yf)
        if bad.any():
            report["y_bad"] = int(np.argwhere(bad)[0][0])
        elif classification:
            nonint = yf != np.round(yf)
            if nonint.any():
                report["y_nonint"] = float(yf[np.argwhere(nonint)[0][0], 0])
            report["y_range"] = (float(yf.min()), float(yf.max()))
    return ShardReport(**report)


def no_rows(dtype: Any, y_dtype: Any = np.int64) -> dict[str, np.ndarray]:
    """The arrays of a shard without rows (or whose rows the driver will reject)."""
    return {"x": np.zeros((0, 0), dtype), "y": np.zeros(0, y_dtype)}


def finish(x: np.ndarray, y: np.ndarray, classification: bool, dtype: Any,
           found: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], ShardReport]:
    """A partition's arrays as the shard keeps them (contiguous ``x`` in ``dtype``; ``y`` as
    int64 class ids or in ``dtype``), and its report with the checks' time."""
    t0 = time.perf_counter()
    report = summarise(x, y, classification, found)
    report = replace(report, check_seconds=time.perf_counter() - t0)
    x = np.ascontiguousarray(x, dtype=dtype)
    if classification:
        yy = np.asarray(y, dtype=np.float64).reshape(-1)
        y = np.where(np.isfinite(yy), yy, 0).astype(np.int64)
    else:
        y = np.ascontiguousarray(y, dtype=dtype)
    return {"x": x, "y": y}, report

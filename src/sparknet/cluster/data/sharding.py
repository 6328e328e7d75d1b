"""Training data onto the executors, once: DataFrames (through Arrow), RDDs of
``(x, y)`` pairs, or numpy arrays become one contiguous ``(rows, features)`` array and
one label array per partition, resident for the whole fit (see
:mod:`sparknet.cluster.resident.driver`).

Every check that can fail runs before any training round: column names and types on
the driver, then the conversion job reports per partition its row count, vector
lengths, the first NaN and the label range, and the driver raises a ``ValueError``
naming the column and value.

The shards of a cached DataFrame or a persisted RDD may stay for the next fit on the same
data (``reuse=True``): :mod:`sparknet.cluster.data.shard_cache` keeps them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from sparknet._validation import positive_int
from sparknet.cluster.data.labels import check_label_range
from sparknet.cluster.data.numpy_input import (  # noqa: F401 - split_indices: re-exported
    check_numpy,
    from_numpy,
    split_indices,
)
from sparknet.cluster.data.shard_cache import (  # noqa: F401 - the reuse names: re-exported
    MAX_REUSED,
    give_back,
    keep,
    kept_shards,
    release_shards,
    reuse_key,
    take_kept,
)
from sparknet.cluster.data.shard_checks import finish, no_rows
from sparknet.cluster.data.shard_report import ShardReport, report_of
from sparknet.cluster.resident.driver import Resident

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

    from sparknet.cluster.engine.base import Engine


@dataclass
class ShardedData:
    """Training (or validation) data resident on the executors.

    Attributes:
        resident: the :class:`~sparknet.cluster.resident.driver.Resident` holding, per
            partition, ``x`` (rows, features) and ``y`` (rows,) or (rows, targets).
        rows: rows per partition, in partition order.
        dim: features per row (flat).
        source: ``"dataframe"``, ``"rdd"`` or ``"numpy"`` (for messages).
        phases: seconds of each step of putting the data there (empty when reused).
        reused: whether these shards were already resident (built by an earlier fit).
        cache_key: the reuse key (``None``: not reusable, deleted by :meth:`close`).
    """

    resident: Resident
    rows: list[int]
    dim: int
    source: str
    phases: dict[str, float] = field(default_factory=dict)
    reused: bool = False
    cache_key: tuple | None = None

    @property
    def total(self) -> int:
        return int(sum(self.rows))

    @property
    def num_partitions(self) -> int:
        return len(self.rows)

    def close(self) -> None:
        """Done with the shards: reusable ones go back to the cache, others are deleted."""
        if self.cache_key is None or not give_back(self):
            self.resident.close()


# ----------------------------------------------------------------- executor side builds
def list_column(col: Any, what: str, found: dict[str, Any]) -> np.ndarray:
    """An Arrow list column -> (values (n, d) float array, lengths info) or a 1-D column."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or \
            pa.types.is_fixed_size_list(col.type):
        n = len(col)
        if col.null_count:
            nulls = col.is_null().to_numpy(zero_copy_only=False)
            found[f"{what}_null"] = int(np.flatnonzero(nulls)[0])
            return np.zeros((n, 0))
        if pa.types.is_fixed_size_list(col.type):
            lengths = np.full(n, col.type.list_size)
        else:
            offs = np.asarray(col.offsets)
            lengths = np.diff(offs)
        vals = col.flatten().to_numpy(zero_copy_only=False)
        if n and lengths.min() != lengths.max():
            lo, hi = int(lengths.min()), int(lengths.max())
            found[f"{what}_lengths"] = (lo, hi, int(np.flatnonzero(lengths != lengths[0])[0]))
            return np.zeros((n, 0))
        d = int(lengths[0]) if n else 0
        found[f"{what}_dim"] = d
        return np.asarray(vals, dtype=np.float64 if vals.dtype.kind != "f"
                          else vals.dtype).reshape(n, d)
    if col.null_count:
        found[f"{what}_null"] = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


class _ArrowBuild:
    """Executor side: the record batches of one partition -> contiguous x and y."""

    def __init__(self, classification: bool, dtype: str) -> None:
        self.classification, self.dtype = classification, dtype

    def __call__(self, index: int, batches: Iterable) -> tuple[dict, ShardReport]:
        import pyarrow as pa

        batches = list(batches)
        found: dict[str, Any] = {}
        if not batches or sum(b.num_rows for b in batches) == 0:
            return no_rows(self.dtype, np.int64 if self.classification
                           else self.dtype), ShardReport()
        table = pa.Table.from_batches(batches)
        x = list_column(table.column(0), "x", found)
        y = list_column(table.column(1), "y", found)
        if "x_null" in found or "x_lengths" in found:
            x = np.zeros((table.num_rows, 0))
        if "y_null" in found or "y_lengths" in found:
            y = np.zeros(table.num_rows)
        return finish(x, y, self.classification, self.dtype, found)


class _PairsBuild:
    """Executor side: ``(x, y)`` pairs of one RDD partition -> contiguous x and y."""

    def __init__(self, classification: bool, dtype: str) -> None:
        self.classification, self.dtype = classification, dtype

    def __call__(self, index: int, it: Iterable) -> tuple[dict, ShardReport]:
        xs: list[np.ndarray] = []
        ys: list[Any] = []
        pair_bad: tuple[int, str] | None = None
        for k, item in enumerate(it):
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                pair_bad = pair_bad or (k, type(item).__name__)
                continue
            xs.append(np.asarray(item[0]))
            ys.append(item[1])
        if pair_bad is not None or not xs:
            return no_rows(self.dtype), ShardReport(pair_bad=pair_bad)
        shapes = {a.shape for a in xs}
        if len(shapes) > 1:
            sizes = sorted(int(np.prod(s)) for s in shapes)
            first = next(k for k, a in enumerate(xs) if a.shape != xs[0].shape)
            return no_rows(self.dtype), ShardReport(rows=len(xs),
                                                    x_lengths=(sizes[0], sizes[-1], first))
        if xs[0].dtype.kind not in "biuf" or np.asarray(ys).dtype.kind not in "biuf":
            bad = f"{xs[0].dtype} / {np.asarray(ys).dtype}"
            return no_rows(self.dtype), ShardReport(rows=len(xs), dtype_bad=bad)
        x = np.stack(xs).reshape(len(xs), -1)
        return finish(x, np.asarray(ys, dtype=np.float64), self.classification, self.dtype,
                      {"x_dim": int(x.shape[1])})


def resident_from_numpy(engine: Engine, X: np.ndarray, Y: np.ndarray, num_partitions: int | None,
                        seed: int, name: str, what: str) -> Any:
    """The resident shards of checked numpy input on ``engine``'s cluster, split by
    :func:`~sparknet.cluster.data.numpy_input.split_indices` (piece ``i`` in partition ``i``): one
    broadcast a piece on Classic, rows of pickled chunks under Connect
    (:mod:`sparknet.cluster.data.numpy_connect`)."""
    sc = engine.sc
    if sc is None:  # no SparkContext to broadcast with: the pieces go as rows
        from sparknet.cluster.data.numpy_connect import from_numpy as connect_from_numpy

        return connect_from_numpy(engine,  # type: ignore[arg-type]
                                  X, Y, num_partitions, seed, name)
    return from_numpy(sc, X, Y, num_partitions, seed, name, what)


# ------------------------------------------------------------------------- driver side
def is_dataframe(data: Any) -> bool:
    """Whether ``data`` is a Spark DataFrame, Classic or Connect."""
    try:
        from pyspark.sql import DataFrame
    except ImportError:  # pragma: no cover
        return False
    if isinstance(data, DataFrame):
        return True
    try:  # Spark Connect DataFrames
        from pyspark.sql.connect.dataframe import DataFrame as CDF
        return isinstance(data, CDF)
    except Exception:  # pragma: no cover
        return False


def is_rdd(data: Any) -> bool:
    """Whether ``data`` is a Spark RDD."""
    from pyspark import RDD
    return isinstance(data, RDD)


def _dataframe_columns(df: DataFrame, features_col: str, label_col: str, dtype: str,
                       classification: bool) -> tuple[DataFrame, str | None]:
    """Select features and label (JVM side) as ``x`` (a Vector, or an array of floats or
    doubles) and ``y``, and the kind of ``x``: ``"vector"``, ``"float"`` or ``"double"``
    when the JVM can hand the rows over (a numeric label), else None (Arrow reads them)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    from sparknet.cluster.engine.base import functions_for

    F, vector_to_array = functions_for(df)
    names = df.columns
    for col, role in ((features_col, "features"), (label_col, "label")):
        if col not in names:
            raise ValueError(f"the DataFrame has no {role} column {col!r} (its columns: {names})")
    schema = {f.name: f.dataType for f in df.schema.fields}
    ftype = schema[features_col]

    def named(name: str) -> Any:  # backquoted: a dot in a name is part of it, not a struct field
        return F.col("`" + name.replace("`", "``") + "`")
    fcol = named(features_col)
    kind: str | None
    if isinstance(ftype, VectorUDT):
        kind = "vector"
    elif isinstance(ftype, T.ArrayType) and isinstance(ftype.elementType, T.NumericType):
        kind = "float" if isinstance(ftype.elementType, T.FloatType) else "double"
        fcol = fcol.cast(f"array<{kind}>")
    else:
        raise ValueError(f"features column {features_col!r} has type {ftype.simpleString()}; "
                         f"use an ML Vector column or an array of numbers")
    ltype = schema[label_col]
    if isinstance(ltype, T.NumericType) or isinstance(ltype, T.BooleanType):
        lcol = named(label_col).cast("double")
    elif (not classification and isinstance(ltype, T.ArrayType)
          and isinstance(ltype.elementType, T.NumericType)):
        lcol, kind = named(label_col).cast("array<double>"), None
    elif not classification and isinstance(ltype, VectorUDT):
        # a null Vector stays null (Spark's vector_to_array fails on it): the shard's report
        # names its row
        vec = named(label_col)
        lcol, kind = F.when(vec.isNotNull(), vector_to_array(vec, dtype="float64")), None
    else:
        want = "numeric class ids (index strings with StringIndexer)" if classification \
            else "numbers, arrays of numbers or Vectors"
        raise ValueError(f"label column {label_col!r} has type {ltype.simpleString()}; use {want}")
    return df.select(fcol.alias("x"), lcol.alias("y")), kind


def _arrow_features(ftype: Any, dtype: str, df: Any = None) -> Any:
    """Column ``x`` (of type ``ftype``) as an array of ``dtype`` elements, for Arrow
    (functions of ``df``'s kind of session)."""
    from pyspark.ml.linalg import VectorUDT

    from sparknet.cluster.engine.base import functions_for

    F, vector_to_array = functions_for(df)

    if isinstance(ftype, VectorUDT):
        # a null Vector stays null (Spark's vector_to_array fails on it, in the JVM): the
        # shard's report names its row (ShardReport.x_null)
        vec = F.col("x")
        return F.when(vec.isNotNull(), vector_to_array(vec, dtype=dtype)).alias("x")
    return F.col("x").cast("array<float>" if dtype == "float32" else "array<double>").alias("x")


def shard_data(data: Any, y: Any = None, *, sc: "SparkContext | Engine", num_partitions: int | None,
               features_col: str = "features", label_col: str = "label", dtype: Any = np.float32,
               classification: bool = True, n_classes: int | None = None,
               sample_shape: tuple | None = None, seed: int = 0, what: str = "training data",
               name: str = "data", reuse: bool = False) -> ShardedData:
    """Put training data on the executors, one contiguous shard per partition, checked.

    Args:
        data: a Spark DataFrame (``features_col`` an ML Vector or array column,
            ``label_col`` numeric), an RDD of ``(x, y)`` pairs, or a numpy array ``X``
            (with ``y``).
        y: labels when ``data`` is a numpy array.
        sc: the SparkContext, or the session's :class:`~sparknet.cluster.engine.base.Engine`
            (under Spark Connect: DataFrame and numpy input; no reuse).
        num_partitions: shards wanted; ``None`` keeps the DataFrame's/RDD's partitions
            (numpy: ``sc.defaultParallelism``).
        features_col: features column of a DataFrame.
        label_col: label column of a DataFrame.
        dtype: float dtype of the features (the model's).
        classification: labels are class ids (checked integral and in range).
        n_classes: number of classes (the model's outputs) for the range check.
        sample_shape: per-sample shape the model expects (its ``input_shape``); the
            flat feature length must equal its product.
        seed: seeds the split of numpy input.
        what: how messages call this data (``"training data"``, ``"validation data"``).
        name: prefix of the resident state's key.
        reuse: take the shards of an earlier call on the same cached DataFrame or
            persisted RDD (same columns, dtype and partitions) when there are some,
            and leave these for later calls (see
            :mod:`~sparknet.cluster.data.shard_cache`); ``close()`` then gives them back
            instead of deleting them.

    Returns:
        :class:`ShardedData` (``phases``: the seconds of each step).

    Raises:
        ValueError: missing column, unsupported column type, empty data, vectors of
            different lengths, NaN/infinity/null, non-integer labels or labels outside
            ``[0, n_classes)``, feature length not matching the model.
    """
    from sparknet.cluster.engine.base import engine_for

    t0 = time.perf_counter()
    engine = engine_for(sc)
    classic: SparkContext | None = getattr(engine, "sc", None)  # None under Spark Connect
    if classic is None:
        reuse = False  # reuse follows Classic's persisted RDDs
    dtype = np.dtype(dtype).name
    if num_partitions is not None:
        num_partitions = positive_int(num_partitions, "num_partitions")
    source = "dataframe" if is_dataframe(data) else "rdd" if is_rdd(data) else "numpy"
    key = reuse_key(data, y, source, classic, features_col, label_col, dtype, classification,
                    num_partitions) if reuse and classic is not None else None
    if key is not None and classic is not None:
        hit = take_kept(key, classic)
        if hit is not None:
            try:
                hit.dim = _check_meta(hit.resident, what, hit.source,
                                      *_names(hit.source, features_col, label_col),
                                      classification, n_classes, sample_shape)
            except ValueError:
                hit.close()
                raise
            hit.phases = {"reuse lookup": time.perf_counter() - t0}
            return hit
    if source == "dataframe":
        if y is not None:
            raise ValueError("pass labels inside the DataFrame (label_col), not as y")
        res = _from_dataframe(data, features_col, label_col, dtype, classification, num_partitions,
                              name, engine)
    elif source == "rdd":
        if y is not None:
            raise ValueError("an RDD must hold (x, y) pairs; do not pass y separately")
        res = _from_rdd(data, dtype, classification, num_partitions, name)
    else:
        X, Y = check_numpy(data, y, dtype, classification, n_classes, sample_shape, what)
        res = resident_from_numpy(engine, X, Y, num_partitions, seed, name, what)
    t_built = time.perf_counter()
    try:
        dim = _check_meta(res, what, source, *_names(source, features_col, label_col),
                          classification, n_classes, sample_shape)
    except ValueError:
        res.close()
        raise
    phases = _job_phases(res, t_built - t0 - res.build_seconds)
    phases["checks (driver)"] = time.perf_counter() - t_built
    out = ShardedData(res, [report_of(i).rows for i in res.infos], dim, source, phases)
    if key is not None and keep(key, out):
        out.cache_key = key
    return out


def _names(source: str, features_col: str, label_col: str) -> tuple[str, str]:
    """What messages call the features and the labels of ``source``."""
    return {"dataframe": (features_col, label_col), "rdd": ("x", "y")}.get(source, ("X", "y"))


def _job_phases(res: Resident, plan: float) -> dict[str, float]:
    """The steps of building ``res``: ``plan`` (driver seconds before the job), then the
    job's (:meth:`Resident.build_phases`), its build split into conversion and checks."""
    job = res.build_phases()
    check = max((report_of(i).check_seconds for i in res.infos), default=0.0)
    check = min(check, job.get("build", 0.0))
    # rows handed over by the JVM (packed.py): its part ran before the builder started
    jvm = min(max((report_of(i).jvm_seconds for i in res.infos), default=0.0),
              job.get("start", 0.0))
    phases = {"plan (driver)": max(plan, 0.0), "worker start, imports": job.get("start", 0.0) - jvm}
    if jvm:
        phases["convert in the JVM"] = jvm
    return {**phases, "convert to numpy": job.get("build", 0.0) - check,
            "checks (executors)": check, "spill": job.get("spill", 0.0),
            "shard job: scheduling, results": job["rest"]}


def _from_dataframe(data: DataFrame, features_col: str, label_col: str, dtype: str,
                    classification: bool, num_partitions: int | None, name: str,
                    engine: "Engine") -> Resident:
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:  # pragma: no cover - pyarrow is installed with pyspark[sql]
        raise ImportError("reading a DataFrame needs pyarrow (Arrow batches, not rows), one "
                          "of sparknet's own dependencies: pip install 'pyarrow>=12'") from exc
    df, kind = _dataframe_columns(data, features_col, label_col, dtype, classification)
    # (the select is narrow: ``data``'s partitions, whose ``rdd`` a fit has usually built already)
    if num_partitions is not None and engine.num_partitions(data) != num_partitions:
        # (a Connect DataFrame's partitions are not known before it runs: None)
        df = df.repartition(int(num_partitions))
    if kind is not None and engine.sc is not None:  # the JVM packs the rows (Classic)
        from sparknet.cluster.data.packed_rows import PackedBuild, packed_columns

        packed = packed_columns(df, kind, dtype)
        if packed is not None:
            return Resident.from_dataframe(packed, PackedBuild(classification, dtype), name=name,
                                           on_lost="rebuild")
    df = df.select(_arrow_features(df.schema.fields[0].dataType, dtype, df), "y")
    return engine.resident_from_dataframe(df, _ArrowBuild(classification, dtype), name, "rebuild",
                                          None)


def _from_rdd(rdd: RDD, dtype: str, classification: bool, num_partitions: int | None,
              name: str) -> Resident:
    if num_partitions is not None and rdd.getNumPartitions() != num_partitions:
        rdd = rdd.repartition(int(num_partitions))
    return Resident(rdd, _PairsBuild(classification, dtype), name=name, on_lost="rebuild")


def _check_meta(res: Resident, what: str, source: str, fcol: str, lcol: str, classification: bool,
                n_classes: int | None, sample_shape: tuple | None) -> int:
    infos = res.infos
    fdesc = (f"features column {fcol!r}" if source == "dataframe"
             else ("x of the (x, y) pairs" if source == "rdd" else fcol))
    ldesc = (f"label column {lcol!r}" if source == "dataframe"
             else ("y of the (x, y) pairs" if source == "rdd" else lcol))
    where = lambda info, r: f"partition {info.index}, row {r}"  # noqa: E731
    drop = "; drop or fill the null rows first, e.g. df.na.drop()" if source == "dataframe" else ""
    reports = [report_of(i) for i in infos]
    for info, m in zip(infos, reports):
        if m.pair_bad is not None:
            k, t = m.pair_bad
            raise ValueError(f"{what}: the RDD must hold (x, y) pairs; found a {t} "
                             f"({where(info, k)})")
        if m.dtype_bad is not None:
            raise ValueError(f"{what}: the RDD's (x, y) pairs must be numeric, got dtypes "
                             f"{m.dtype_bad}")
        if m.x_null is not None:
            raise ValueError(f"{what}: {fdesc} has a null vector ({where(info, m.x_null)}){drop}")
        if m.x_lengths is not None:
            lo, hi, r = m.x_lengths
            raise ValueError(f"{what}: {fdesc} holds vectors of different lengths ({lo} and {hi}; "
                             f"first odd one at {where(info, r)})")
        if m.y_null is not None:
            raise ValueError(f"{what}: {ldesc} has a null value ({where(info, m.y_null)}){drop}")
        if m.y_lengths is not None:
            lo, hi, r = m.y_lengths
            raise ValueError(f"{what}: {ldesc} holds arrays of different lengths ({lo} and {hi})")
    total = sum(m.rows for m in reports)
    if total == 0:
        kind = {"dataframe": "the DataFrame has no rows", "rdd": "the RDD is empty",
                "numpy": "no rows"}[source]
        raise ValueError(f"{what} is empty: {kind}")
    dims = {m.x_dim for m in reports if m.rows and m.x_dim is not None}
    if len(dims) > 1:
        raise ValueError(f"{what}: {fdesc} holds vectors of different lengths ({min(dims)} and "
                         f"{max(dims)}, in different partitions)")
    dim = dims.pop() if dims else 0
    if dim == 0:
        raise ValueError(f"{what}: {fdesc} holds empty vectors (length 0)")
    for info, m in zip(infos, reports):
        if m.x_bad is not None:
            r, c, v = m.x_bad
            raise ValueError(f"{what}: {fdesc} contains {v} (NaN or infinity) at {where(info, r)}, "
                             f"element {c}")
        if m.y_bad is not None:
            raise ValueError(f"{what}: {ldesc} contains NaN or infinity ({where(info, m.y_bad)})")
        if classification and m.y_nonint is not None:
            raise ValueError(f"{what}: {ldesc} holds the non-integer label {m.y_nonint}; "
                             f"cross-entropy needs class ids")
    if classification and n_classes is not None:
        check_label_range(infos, n_classes, what, ldesc)
    if sample_shape is not None and int(np.prod(sample_shape)) != dim:
        raise ValueError(f"{what}: {fdesc} has {dim} values per row, the model expects "
                         f"{int(np.prod(sample_shape))} (input_shape {tuple(sample_shape)})")
    return dim

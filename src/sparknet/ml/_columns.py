"""DataFrame columns -> the flat float arrays the network reads (driver side, JVM work).

Feature columns may be

* an ML ``Vector`` column (from ``VectorAssembler``, ``StandardScaler``, ...),
* an ``array<number>`` column (reshaped to the declared ``inputShape`` for conv and
  recurrent nets),
* an ``array<array<number>>`` column: variable-length sequences of feature vectors.
  They are padded (after their last step) or cut to ``T`` steps, and every step gets
  one more value, ``1`` for a real step and ``0`` for padding, which the
  :class:`~sparknet.layers.SequenceMask` layer put in front of the network turns into
  the ``(N, T)`` mask the recurrent layers use.

Every conversion here is a Spark SQL expression (no Python row code); the checks that
need the data run as one aggregation job, before any training round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass
class FeatureKind:
    """What a features column holds.

    Attributes:
        kind: ``"vector"``, ``"array"`` or ``"sequence"``.
        size: values per row when known from the schema (Vector metadata), else None.
    """

    kind: str
    size: int | None = None


def quote(col: str) -> str:
    """``col`` as a SQL identifier (backquoted), so dots and spaces in it stay part of
    the name."""
    return "`" + col.replace("`", "``") + "`"


def feature_kind(df: DataFrame, col: str, role: str = "features") -> FeatureKind:
    """Classify the features column ``col`` of ``df`` from its schema.

    Raises:
        ValueError: the column is missing or has a type the network cannot read.
    """
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if col not in df.columns:
        raise ValueError(f"the DataFrame has no {role} column {col!r} (its columns: {df.columns})")
    field = df.schema[col]
    dt = field.dataType
    if isinstance(dt, VectorUDT):
        size = None
        attr = (field.metadata or {}).get("ml_attr") or {}
        if "num_attrs" in attr:
            size = int(attr["num_attrs"])
        elif "attrs" in attr:
            size = sum(len(v) for v in attr["attrs"].values())
        return FeatureKind("vector", size)
    if isinstance(dt, T.ArrayType):
        el = dt.elementType
        if isinstance(el, T.NumericType):
            return FeatureKind("array")
        if isinstance(el, T.ArrayType) and isinstance(el.elementType, T.NumericType):
            return FeatureKind("sequence")
    raise ValueError(f"{role} column {col!r} has type {dt.simpleString()}; use an ML Vector column "
                     f"(e.g. from VectorAssembler), an array of numbers, or an array of arrays of "
                     f"numbers (sequences)")


def flat_features(df: DataFrame, col: str, kind: FeatureKind, dtype: str,
                  seq_shape: tuple[int, int] | None = None) -> Column:
    """A Column holding ``col`` as a flat ``array<float|double>``.

    Sequences become ``T * (F + 1)`` values per row: each of the first ``T`` steps
    followed by its mask value (1), padding steps all zero.

    Args:
        df: the DataFrame.
        col: features column.
        kind: from :func:`feature_kind`.
        dtype: ``"float32"`` or ``"float64"``.
        seq_shape: ``(T, F)`` for sequences.
    """
    from sparknet.cluster.engine.base import functions_for

    F, vector_to_array = functions_for(df)
    elem = "FLOAT" if dtype == "float32" else "DOUBLE"
    if kind.kind == "vector":
        # a null Vector stays null (Spark's vector_to_array fails on it, in a Java trace),
        # for the scoring task to report with the column's name
        vec = F.col(quote(col))
        return F.when(vec.isNotNull(), vector_to_array(vec, dtype=dtype))
    if kind.kind == "array":
        return F.col(quote(col)).cast(f"array<{elem.lower()}>")
    if seq_shape is None:
        raise ValueError(f"features column {col!r} holds sequences: pass their (T, F) shape")
    T_, F_ = seq_shape
    q = quote(col)
    one, zero = f"CAST(1 AS {elem})", f"CAST(0 AS {elem})"
    # steps past a sequence's end are padding; a null/short step stays short, so the
    # row's length is wrong and the size checks name it
    return F.expr(
        f"flatten(transform(sequence(0, {T_ - 1}), i -> IF(i < size({q}), "
        f"concat(transform({q}[i], v -> CAST(v AS {elem})), array({one})), "
        f"array_repeat({zero}, {F_ + 1}))))")


def sequence_stats(df: DataFrame, col: str) -> dict[str, Any]:
    """One aggregation job over a sequence column: row count, null rows, the longest
    sequence, the smallest and largest step length, and null steps.

    Returns:
        dict with ``rows``, ``null_rows``, ``max_len``, ``min_step``, ``max_step``,
        ``null_steps``.
    """
    from sparknet.cluster.engine.base import functions_for

    F, _ = functions_for(df)
    c = F.col(quote(col))
    step_sizes = F.transform(c, lambda s: F.coalesce(F.size(s), F.lit(-1)))
    row = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(c.isNull(), 1).otherwise(0)).alias("null_rows"),
        F.max(F.size(c)).alias("max_len"),
        F.min(F.array_min(step_sizes)).alias("min_step"),
        F.max(F.array_max(step_sizes)).alias("max_step"),
    ).collect()[0]
    return row.asDict()


def check_sequences(stats: dict[str, Any], col: str, features: int | None,
                    what: str) -> tuple[int, int]:
    """Turn :func:`sequence_stats` into ``(longest sequence, step length)`` or a ValueError."""
    if not stats["rows"]:
        raise ValueError(f"{what} is empty: the DataFrame has no rows")
    if stats["null_rows"]:
        raise ValueError(f"{what}: sequence column {col!r} has {stats['null_rows']} null rows")
    lo, hi = stats["min_step"], stats["max_step"]
    if lo is None or hi is None or (stats["max_len"] or 0) == 0:
        raise ValueError(f"{what}: sequence column {col!r} holds only empty sequences")
    if lo == -1:
        raise ValueError(f"{what}: sequence column {col!r} has a null step")
    if lo != hi:
        raise ValueError(f"{what}: sequence column {col!r} has steps of different lengths ({lo} "
                         f"and {hi}); every step must hold the same number of features")
    if features is not None and hi != features:
        raise ValueError(f"{what}: sequence column {col!r} has {hi} features per step, the network "
                         f"expects {features}")
    return int(stats["max_len"]), int(hi)


def vector_size_check(kind: FeatureKind, col: str, expected: int, what: str) -> None:
    """Raise early when the schema already tells the vector size and it is wrong."""
    if kind.kind == "vector" and kind.size is not None and kind.size != expected:
        raise ValueError(f"{what}: features column {col!r} holds vectors of size {kind.size} "
                         f"(from its metadata), the network expects {expected} values")


def declared_outputs(config: dict[str, Any]) -> int | None:
    """The outputs per row a network config declares without being built: the units of
    a last ``Dense`` layer (None for other last layers)."""
    layers = config.get("layers") or []
    last = layers[-1] if layers else {}
    units = (last.get("config") or {}).get("units") if last.get("class") == "Dense" else None
    return int(units) if isinstance(units, int) else None


def check_indicator(df: DataFrame, col: str) -> None:
    """The validation indicator column ``col``: present and boolean."""
    from pyspark.sql import types as T

    if col not in df.columns:
        raise ValueError(f"validationIndicatorCol: the DataFrame has no column {col!r} (its "
                         f"columns: {df.columns})")
    dt = df.schema[col].dataType
    if not isinstance(dt, T.BooleanType):
        raise ValueError(f"validationIndicatorCol: column {col!r} has type {dt.simpleString()}; "
                         f"it must be boolean (true: a validation row), e.g. "
                         f"df.withColumn({col!r}, F.rand(seed=0) < 0.2)")


def label_width(df: DataFrame, col: str) -> int | None:
    """Values per row of a regression label column: 1 for numbers, a Vector's size from
    its metadata or else from the first non-null row (one small job), an array's from the
    first non-null row; None when unknown (no such column or row: the load names it)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    from sparknet.cluster.engine.base import functions_for

    F, vector_to_array = functions_for(df)
    if col not in df.columns:
        return None
    field = df.schema[col]
    dt = field.dataType
    if isinstance(dt, (T.NumericType, T.BooleanType)):
        return 1
    if isinstance(dt, VectorUDT):
        attr = (field.metadata or {}).get("ml_attr") or {}
        if "num_attrs" in attr:
            return int(attr["num_attrs"])
        size = F.size(vector_to_array(F.col(quote(col))))
    elif isinstance(dt, T.ArrayType):
        size = F.size(F.col(quote(col)))
    else:
        return None
    row = df.where(F.col(quote(col)).isNotNull()).select(size).limit(1).collect()
    return int(row[0][0]) if row else None

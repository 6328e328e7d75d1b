"""What building one training shard found: the report an executor sends to the driver.

Every shard build (a DataFrame's Arrow batches, rows packed by the JVM, an RDD of
``(x, y)`` pairs, numpy pieces) ends with a :class:`ShardReport`, a frozen dataclass that
crosses the process as it is (pickled with the shard's
:class:`~sparknet.cluster.resident.shards.ShardInfo`).  The driver reads its fields, never
string keys, and turns the first problem it names into an error naming the column, the
partition and the row (:mod:`sparknet.cluster.data.sharding`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparknet.cluster.resident.shards import ShardInfo


@dataclass(frozen=True)
class ShardReport:
    """One partition's rows and the first problem of each kind found in them.

    Attributes:
        rows: rows in the shard.
        x_dim: values per row of the features (``None``: not known, the shard is empty or
            was refused).
        x_bad: ``(row, element, value)`` of the first NaN or infinite feature value.
        x_null: the row of the first null features vector.
        x_lengths: ``(shortest, longest, first odd row)`` of features vectors of different
            lengths.
        y_dim: values per label of a column of label arrays (``None``: one value a row).
        y_bad: the row of the first NaN or infinite label.
        y_null: the row of the first null label.
        y_lengths: ``(shortest, longest, first odd row)`` of label arrays of different lengths.
        y_nonint: the first label that is not a whole number (classification).
        y_range: the smallest and largest label (classification).
        pair_bad: ``(position, type name)`` of the first RDD item that is not an ``(x, y)`` pair.
        dtype_bad: the dtypes of non-numeric ``(x, y)`` pairs.
        check_seconds: the executor's seconds spent on the checks.
        jvm_seconds: seconds the JVM spent handing the rows over (packed rows).
    """

    rows: int = 0
    x_dim: int | None = None
    x_bad: tuple[int, int, float] | None = None
    x_null: int | None = None
    x_lengths: tuple[int, int, int] | None = None
    y_dim: int | None = None
    y_bad: int | None = None
    y_null: int | None = None
    y_lengths: tuple[int, int, int] | None = None
    y_nonint: float | None = None
    y_range: tuple[float, float] | None = None
    pair_bad: tuple[int, str] | None = None
    dtype_bad: str | None = None
    check_seconds: float = 0.0
    jvm_seconds: float = 0.0

    @property
    def refused(self) -> bool:
        """Whether the shard's rows were refused before they were read (no arrays kept)."""
        return any(v is not None for v in (self.x_null, self.x_lengths, self.y_null, self.y_lengths,
                                            self.pair_bad, self.dtype_bad))


def report_of(info: ShardInfo) -> ShardReport:
    """The report of a training shard (``TypeError`` for a shard built by another kind of
    build, which would be a bug)."""
    if not isinstance(info.meta, ShardReport):
        raise TypeError(f"partition {info.index} of {info.key} was built without a ShardReport "
                        f"(got {type(info.meta).__name__})")
    return info.meta


def refused_by_jvm(tag: str) -> ShardReport:
    """The report of rows ``PackRows`` (``sparknet/jvm/PackRows.java``) refused, from the one line
    it sends: ``"x_null <row>"``, ``"x_lengths <shortest> <longest> <row>"`` or
    ``"y_null <row>"`` (``ValueError`` for any other)."""
    kind, *nums = tag.split()
    try:
        values = [int(v) for v in nums]
        if kind == "x_null" and len(values) == 1:
            return ShardReport(x_null=values[0])
        if kind == "x_lengths" and len(values) == 3:
            return ShardReport(x_lengths=(values[0], values[1], values[2]))
        if kind == "y_null" and len(values) == 1:
            return ShardReport(y_null=values[0])
    except ValueError:
        pass
    raise ValueError(f"the JVM's row packer sent an unknown report {tag!r}")

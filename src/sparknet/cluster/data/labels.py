"""Class ids in sharded training data: their range over the shards, checked against the
model's outputs before the first round."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparknet.cluster.data.shard_report import report_of

if TYPE_CHECKING:
    from sparknet.cluster.resident.driver import ShardInfo


def label_range(infos: list[ShardInfo]) -> tuple[float, float] | None:
    """Smallest and largest class id over all shards (None without labels)."""
    ranges = [r for r in (report_of(i).y_range for i in infos) if r is not None]
    return (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)) if ranges else None


def label_desc(source: str, label_col: str) -> str:
    return {"dataframe": f"label column {label_col!r}",
            "rdd": "y of the (x, y) pairs"}.get(source, "y")


def check_label_range(infos: list[ShardInfo], n_classes: int, what: str, ldesc: str) -> None:
    """Raise ``ValueError`` when a class id lies outside ``[0, n_classes)``."""
    rng = label_range(infos)
    if rng is None:
        return
    lo, hi = rng
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what}: {ldesc} holds the label {bad:g}, outside [0, {n_classes}) "
                         f"(the model has {n_classes} outputs)")

"""The shards of cached data kept on the executors from one fit to the next.

The shards of a *cached* DataFrame (``df.cache()``) or a persisted RDD stay on the executors
after the fit and serve the next fit on the same data, columns and partitioning without a job
(:func:`~sparknet.cluster.data.sharding.shard_data` with ``reuse=True``), keyed by the cache's
own RDD (a DataFrame's in-memory column buffers, or the persisted RDD) plus the columns, dtype
and partitions (:func:`reuse_key`): different rows are a different cache, built anew, as is the
data after ``unpersist()`` (the entry is dropped then).  At most :data:`MAX_REUSED` sets are
kept (least recently used out first); :func:`kept_shards` lists them and
:func:`release_shards` frees them all.

A fit borrows a kept set (:func:`take_kept`) or leaves a new one (:func:`keep`), and gives it
back when done (:func:`give_back`, from
:meth:`ShardedData.close <sparknet.cluster.data.sharding.ShardedData.close>`); a set lent to
one fit is not lent to another meanwhile.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from pyspark import SparkContext

    from sparknet.cluster.data.sharding import ShardedData

log = logging.getLogger(__name__)

#: Sets of shards kept for reuse (training and validation data count one each).
MAX_REUSED = 4


def reuse_key(data: Any, y: Any, source: str, sc: SparkContext, features_col: str,
              label_col: str, dtype: str, classification: bool,
              num_partitions: int | None) -> tuple | None:
    """The reuse key of a cached DataFrame or a persisted RDD (``source``: ``"dataframe"``,
    ``"rdd"`` or ``"numpy"``): the application, the id of the cache's RDD, the columns, dtype
    and partitions; ``None`` for anything else (numpy input, uncached data whose source may
    change, Spark Connect)."""
    try:
        if y is None and source == "dataframe":
            manager = data.sparkSession._jsparkSession.sharedState().cacheManager()
            cached = manager.lookupCachedData(data._jdf)
            if cached.isEmpty():
                return None
            buffers = cached.get().cachedRepresentation().cacheBuilder().cachedColumnBuffers()
            rdd_id = int(buffers.id())
            return (sc.applicationId, rdd_id, "dataframe", features_col, label_col, dtype,
                    classification, num_partitions)
        if y is None and source == "rdd" and data.is_cached:
            return (sc.applicationId, int(data._jrdd.id()), "rdd", dtype, classification,
                    num_partitions)
    except Exception as exc:  # internals of another Spark version: no reuse
        log.debug("shards not reusable: %s", exc)
    return None


class _ShardCache:
    """The reusable shards of this driver: key -> :class:`ShardedData`, least recently
    used first.  An entry lent to a fit is not lent again until it is given back."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, ShardedData] = OrderedDict()
        self._busy: set[tuple] = set()
        self._lock = threading.Lock()

    def take(self, key: tuple, sc: SparkContext) -> ShardedData | None:
        self.prune(sc)
        with self._lock:
            d = self._entries.get(key)
            if d is None or key in self._busy:
                return None
            self._busy.add(key)
            self._entries.move_to_end(key)
        d.reused = True
        return d

    def put(self, key: tuple, d: ShardedData) -> bool:
        """Keep ``d`` (lent to its caller until given back); False when ``key`` is taken."""
        with self._lock:
            if key in self._entries:
                return False
            self._entries[key] = d
            self._busy.add(key)
            old = [k for k in self._entries
                   if k not in self._busy][:max(0, len(self._entries) - MAX_REUSED)]
            evicted = [self._entries.pop(k) for k in old]
        for e in evicted:
            e.resident.close()
        return True

    def give_back(self, d: ShardedData) -> bool:
        """End a loan; False when ``d`` is no longer kept (released meanwhile)."""
        key = d.cache_key
        with self._lock:
            if key is None or self._entries.get(key) is not d:
                return False
            self._busy.discard(key)
            return True

    def prune(self, sc: SparkContext) -> None:
        """Drop the entries whose cache is gone (``unpersist()``) or whose application ended."""
        with self._lock:  # fits load their training and validation data side by side
            keys = list(self._entries)
        try:
            kept = sc._jsc.getPersistentRDDs()
            gone = [k for k in keys if k[0] != sc.applicationId or not kept.containsKey(k[1])]
        except Exception:  # pragma: no cover - context stopped
            gone = keys
        self.release([k for k in gone if k not in self._busy])

    def kept(self) -> list[ShardedData]:
        """The entries, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def release(self, keys: Iterable[tuple] | None = None) -> int:
        """Delete the entries ``keys`` (default all); lent ones are deleted when given back."""
        with self._lock:
            chosen = list(self._entries) if keys is None else [k
                                                               for k in keys if k in self._entries]
            dropped = [self._entries.pop(k) for k in chosen]
        for d in (d for d in dropped if d.cache_key not in self._busy):
            d.resident.close()
        return len(dropped)


_REUSE = _ShardCache()


def take_kept(key: tuple, sc: SparkContext) -> ShardedData | None:
    """The kept set of shards under ``key``, lent to the caller until :func:`give_back`
    (marked ``reused``); None when there is none or it is lent already.  Entries whose cache
    is gone (``unpersist()``) or whose application ended are dropped first."""
    return _REUSE.take(key, sc)


def keep(key: tuple, d: ShardedData) -> bool:
    """Keep ``d`` under ``key`` for later fits (lent to its caller until :func:`give_back`;
    the least recently used unlent sets beyond :data:`MAX_REUSED` are deleted); False when
    ``key`` is kept already."""
    return _REUSE.put(key, d)


def give_back(d: ShardedData) -> bool:
    """End the loan of ``d``; False when it is no longer kept (released meanwhile: the caller
    deletes it)."""
    return _REUSE.give_back(d)


def kept_shards() -> list[ShardedData]:
    """The sets of training and validation shards kept for reuse, least recently used
    first (each with its :attr:`~sparknet.cluster.data.sharding.ShardedData.resident`: its
    shards' folders on the hosts);
    :func:`release_shards` deletes them."""
    return _REUSE.kept()


def release_shards() -> int:
    """Delete every set of training and validation shards kept for reuse (files on the
    executors' hosts, store entries, anchors); returns how many sets.  A set a running
    fit holds is deleted when that fit ends."""
    return _REUSE.release()

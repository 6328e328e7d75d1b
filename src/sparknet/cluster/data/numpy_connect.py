"""Numpy input under Spark Connect: the client's arrays, split as on Classic
(:func:`~sparknet.cluster.data.numpy_input.split_indices`), sent as rows of pickled chunks
and concatenated into one shard a piece on the executors."""
from __future__ import annotations

import pickle
from typing import Any, Iterator

import numpy as np

from sparknet.cluster.data.numpy_input import split_indices
from sparknet.cluster.data.shard_report import ShardReport
from sparknet.cluster.engine.connect import CHUNK_BYTES, ConnectEngine, ConnectResident


class _NumpyChunks:
    """Executor side of numpy input: the pickled ``(piece, chunk, x, y)`` rows of one
    piece, in chunk order, concatenated into its shard (checked on the client)."""

    def __call__(self, index: int, batches: Iterator[Any]) -> tuple[dict, ShardReport]:
        chunks: list[tuple[int, int, bytes]] = []
        for b in batches:
            cols = b.to_pydict()
            chunks += zip(cols["piece"], cols["chunk"], cols["blob"])
        if not chunks:
            raise RuntimeError(f"partition {index} received no rows of numpy input")
        pieces = {p for p, _, _ in chunks}
        if pieces != {index}:
            raise RuntimeError(f"numpy input: partition {index} received piece(s) "
                               f"{sorted(pieces)}, expected piece {index} alone")
        parts = [pickle.loads(blob) for _, _, blob in sorted(chunks, key=lambda c: c[1])]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        return {"x": x, "y": y}, ShardReport(rows=int(y.shape[0]),
                                             x_dim=int(x.shape[1]) if x.shape[0] else 0)


def from_numpy(engine: ConnectEngine, X: np.ndarray, Y: np.ndarray, num_partitions: int | None,
               seed: int, name: str) -> ConnectResident:
    """The resident shards of checked numpy input under Connect: the same split as on
    Classic (:func:`~sparknet.cluster.data.numpy_input.split_indices`), piece ``i`` in
    partition ``i``.  Every piece is cut into the same number of chunks (at most
    ``CHUNK_BYTES`` (8 MiB) each), so the range partitioning by piece puts one piece in
    each partition."""
    parts = int(num_partitions or engine.default_parallelism())
    index = split_indices(X.shape[0], parts, seed)
    row_bytes = X.itemsize * int(np.prod(X.shape[1:])) + Y.itemsize * int(np.prod(Y.shape[1:]))
    n_chunks = max(1, -(-max(len(i) for i in index) * row_bytes // CHUNK_BYTES))
    rows = []
    for p, idx in enumerate(index):
        for c, sub in enumerate(np.array_split(idx, n_chunks)):
            rows.append((p, c, pickle.dumps((np.ascontiguousarray(X[sub]),
                                             np.ascontiguousarray(Y[sub])),
                                            protocol=pickle.HIGHEST_PROTOCOL)))
    df = engine.spark.createDataFrame(rows, "piece int, chunk int, blob binary").repartitionByRange(
        parts, "piece")
    return ConnectResident(df, _NumpyChunks(), name=name, on_lost="rebuild", engine=engine)

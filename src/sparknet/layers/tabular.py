"""``ColumnEmbedding``: embeddings for the categorical positions of a feature vector.

Tabular data reach a network as one float vector per row, as Spark's ``VectorAssembler``
builds it after ``StringIndexer``: numeric columns as they are, categorical ones as
category ids stored as floats (``0.0, 1.0, ...``).  This layer looks each categorical id
up in a table of its own column and hands the embeddings on together with the numeric
values, so the network learns one vector per category instead of reading an id as a
magnitude (or a one-hot vector as wide as the column's cardinality).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import sparknet._embedding as _embedding
from sparknet._validation import non_negative_int, positive_int
from sparknet.layers.base import Layer, ParamSpec, register

__all__ = ["ColumnEmbedding"]

#: float32 holds every integer up to 2**24 exactly, and no longer every one above
_FLOAT32_EXACT = 2 ** 24


def _sizes(value: Any, n: int, what: str) -> list[int]:
    """One positive int per categorical column, from an int or a list of ``n`` ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{what} must be a positive integer or a list of one per column "
                             f"({n} columns), got {list(value)!r} ({len(value)} values)")
        return [positive_int(v, f"{what}[{i}]") for i, v in enumerate(value)]
    return [positive_int(value, what, extra="or a list of one per column")] * n


@register
class ColumnEmbedding(Layer):
    """Embed the categorical positions of flat feature vectors; pass the others through.

    For each position ``columns[k]``, the row's value is a category id in
    ``[0, input_dims[k])``, looked up in the table ``embeddings_<position>`` of shape
    ``(input_dims[k], output_dims[k])``.  The output of a row is the embeddings of
    ``columns[0], columns[1], ...`` in that order, concatenated, **followed by** the
    numeric positions (every position not in ``columns``) in increasing order::

        out = [E_c0[x[c0]], E_c1[x[c1]], ..., x[numeric positions in order]]

    Args:
        columns: positions in the feature vector that hold category ids (distinct).
        input_dims: the cardinality of each: one int for all, or a list (one per column).
            ``StringIndexer`` ids run from 0 to its number of labels minus one; with
            ``handleInvalid="keep"`` add one for the bucket of unseen labels.
        output_dims: the embedding width of each: one int for all, or a list.
        embeddings_initializer: ``"normal"`` (standard normal, as
            :class:`~sparknet.layers.Embedding` and ``torch.nn.Embedding``) or
            ``"uniform"`` (uniform on [-0.05, 0.05]).
        name: layer name.

    Input shape: ``(N, F)`` floats.  Output shape:
    ``(N, F - len(columns) + sum(output_dims))``.  Parameters: one table per column,
    ``embeddings_<position> (input_dim, output_dim)``, in the order of ``columns``.

    The input gradient (when asked for) is the output gradient of the numeric positions,
    and zero at the categorical ones.

    Raises:
        ValueError: bad arguments (at construction); a position outside the feature vector
            (when built); an id that is not an integer in ``[0, input_dim)`` (negative, too
            large, fractional, NaN), naming the position, the value and the row: for the
            whole input before training (:meth:`check_input`) and for every batch.
    """

    def __init__(self, columns: Sequence[int], input_dims: int | Sequence[int],
                 output_dims: int | Sequence[int], embeddings_initializer: str = "normal",
                 name: str | None = None) -> None:
        super().__init__(name)
        if not isinstance(columns, (list, tuple)) or not columns:
            raise ValueError(f"ColumnEmbedding columns must be a non-empty list of positions in "
                             f"the feature vector, got {columns!r}")
        cols = [non_negative_int(c, f"ColumnEmbedding columns[{i}]") for i, c in enumerate(columns)]
        if len(set(cols)) != len(cols):
            twice = sorted({c for c in cols if cols.count(c) > 1})
            raise ValueError(f"ColumnEmbedding columns must be distinct, got {cols!r} "
                             f"(position {twice[0]} twice)")
        self.columns = cols
        self.input_dims = _sizes(input_dims, len(cols), "ColumnEmbedding input_dims")
        self.output_dims = _sizes(output_dims, len(cols), "ColumnEmbedding output_dims")
        if embeddings_initializer not in ("normal", "uniform"):
            raise ValueError(f"ColumnEmbedding embeddings_initializer must be 'normal' or "
                             f"'uniform', got {embeddings_initializer!r}")
        self.embeddings_initializer = embeddings_initializer
        #: the positions passed through, in increasing order (set when built)
        self.numeric_columns: list[int] = []
        self._ids: np.ndarray | None = None

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 1:
            raise ValueError(f"ColumnEmbedding {self.name!r} takes flat feature vectors (N, F), "
                             f"got per-sample shape {tuple(input_shape)}")
        n_features = input_shape[0]
        outside = [c for c in self.columns if c >= n_features]
        if outside:
            raise ValueError(f"ColumnEmbedding {self.name!r}: column {outside[0]} is outside the "
                             f"feature vector of {n_features} values (positions 0 to "
                             f"{n_features - 1})")
        if self.dtype == np.float32 and max(self.input_dims) > _FLOAT32_EXACT:
            raise ValueError(f"ColumnEmbedding {self.name!r}: input_dims {max(self.input_dims)} "
                             f"needs ids above 2**24, which float32 features cannot hold "
                             f"exactly; use a float64 model")
        taken = set(self.columns)
        self.numeric_columns = [c for c in range(n_features) if c not in taken]
        return (len(self.numeric_columns) + sum(self.output_dims),)

    def _table(self, k: int) -> str:
        return f"embeddings_{self.columns[k]}"

    def param_specs(self) -> list[ParamSpec]:
        return [(self._table(k), (v, d))
                for k, (v, d) in enumerate(zip(self.input_dims, self.output_dims))]

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        for k in range(len(self.columns)):
            table = params[self._table(k)]
            if self.embeddings_initializer == "normal":
                table[...] = rng.standard_normal(table.shape)
            else:
                table[...] = rng.uniform(-0.05, 0.05, table.shape)

    # -- ids --------------------------------------------------------------
    def check_input(self, x: np.ndarray) -> None:
        """Every categorical value of the whole input a valid id, before any step."""
        self._check_ids(x, "row {}")

    def _check_ids(self, x: Any, where: str) -> np.ndarray:
        """The category ids of ``x`` as ``(len(columns), N)`` int64 (one contiguous row per
        column); a ValueError names the first bad value's position, value and row (``where``,
        formatted with the row index)."""
        in_shape, _ = self._shapes()
        arr = np.asarray(x)
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise ValueError(f"ColumnEmbedding {self.name!r} takes numeric feature vectors, got "
                             f"dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[1] != in_shape[0]:
            raise ValueError(f"ColumnEmbedding {self.name!r} takes (N, {in_shape[0]}) feature "
                             f"vectors, got shape {arr.shape}")
        sub = arr[:, self.columns]                                     # (N, C)
        dims = np.asarray(self.input_dims)
        with np.errstate(invalid="ignore"):
            ok = (sub >= 0) & (sub < dims)                             # False for NaN
            if arr.dtype.kind == "f":
                ok &= sub == np.floor(sub)
        if not ok.all():
            row, k = (int(i) for i in np.argwhere(~ok)[0])
            value = sub[row, k].item()
            raise ValueError(f"ColumnEmbedding {self.name!r}: column {self.columns[k]} holds "
                             f"{value!r} at {where.format(row)}, which is not a category id: ids "
                             f"of that column are integers in [0, {self.input_dims[k]})")
        return np.ascontiguousarray(sub.T, dtype=np.int64)

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        _, (width,) = self._shapes()
        ids = self._check_ids(x, "row {} of the batch")
        n = ids.shape[1]
        out = np.empty((n, width), dtype=self.dtype)
        off = 0
        for k, dim in enumerate(self.output_dims):
            rows = np.empty((n, dim), dtype=self.dtype)
            _embedding.embedding_forward(ids[k], self.params[self._table(k)], rows)
            out[:, off:off + dim] = rows                               # E_k[ids_k]
            off += dim
        out[:, off:] = np.asarray(x)[:, self.numeric_columns]
        self._ids = ids
        return out

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if self._ids is None:
            raise RuntimeError(f"ColumnEmbedding {self.name!r}: backward called before forward")
        in_shape, _ = self._shapes()
        off = 0
        for k, dim in enumerate(self.output_dims):
            d = np.ascontiguousarray(dy[:, off:off + dim], dtype=self.dtype)     # (N, dim)
            # dE_k = 0; dE_k[ids_k[i]] += d[i]
            _embedding.embedding_backward(self._ids[k], d, self.grads[self._table(k)])
            off += dim
        if not self.need_input_grad:
            return None
        dx = np.zeros((dy.shape[0], in_shape[0]), dtype=self.dtype)
        dx[:, self.numeric_columns] = dy[:, off:]
        return dx

    def get_config(self) -> dict[str, Any]:
        return {"columns": list(self.columns), "input_dims": list(self.input_dims),
                "output_dims": list(self.output_dims),
                "embeddings_initializer": self.embeddings_initializer, "name": self.name}

"""Embedding: token ids to dense vectors, the first layer of a network over text (before the
recurrent layers of :mod:`sparknet.layers.recurrent` or attention).

With ``mask_zero=True`` id 0 is padding: the layer emits the ``(N, T)`` mask ``ids != 0`` that
the layers after it honour (see :func:`sparknet.data.pad_sequences`).  The lookup and its
gradient run in the kernels of :mod:`sparknet._embedding`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import sparknet._embedding as _embedding
from sparknet._validation import check_bool, positive_int
from sparknet.layers.base import Layer, ParamSpec, register

__all__ = ["Embedding"]


@register
class Embedding(Layer):
    """Token ids to dense vectors: ``out[..., :] = embeddings[ids[...]]``.

    Args:
        vocab: number of distinct ids; valid ids are ``0 .. vocab - 1``.
        dim: size of each vector.
        mask_zero: treat id 0 as padding: the layer then emits the mask ``ids != 0``
            (combined with any mask passed in) for the layers after it.
        embeddings_initializer: ``"normal"`` (standard normal, as ``torch.nn.Embedding``)
            or ``"uniform"`` (uniform on [-0.05, 0.05]).
        name: layer name.

    Input shape: integer ids ``(N, T)`` (any shape ``(N, ...)``).  Output shape:
    ``(N, T, dim)``.  Parameter: ``embeddings (vocab, dim)``.  There is no gradient with
    respect to the ids: :meth:`backward` returns None.

    Raises:
        ValueError: (at call time) for ids outside ``[0, vocab)`` or non-integer input.
    """

    accepts_int_input = True

    def __init__(self, vocab: int, dim: int, mask_zero: bool = False,
                 embeddings_initializer: str = "normal", name: str | None = None) -> None:
        super().__init__(name)
        self.vocab = positive_int(vocab, "Embedding vocab")
        self.dim = positive_int(dim, "Embedding dim")
        self.mask_zero = check_bool(mask_zero, "Embedding mask_zero")
        if embeddings_initializer not in ("normal", "uniform"):
            raise ValueError(f"Embedding embeddings_initializer must be 'normal' or 'uniform', "
                             f"got {embeddings_initializer!r}")
        self.embeddings_initializer = embeddings_initializer
        self._ids: np.ndarray | None = None

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) < 1:
            raise ValueError(f"Embedding {self.name!r} takes ids of shape (N, T), got per-sample "
                             f"shape {tuple(input_shape)}")
        return tuple(input_shape) + (self.dim,)

    def param_specs(self) -> list[ParamSpec]:
        return [("embeddings", (self.vocab, self.dim))]

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        if self.embeddings_initializer == "normal":
            params["embeddings"][...] = rng.standard_normal(params["embeddings"].shape)
        else:
            params["embeddings"][...] = rng.uniform(-0.05, 0.05, params["embeddings"].shape)

    def check_input(self, x: np.ndarray) -> None:
        """Every token id of the whole input in ``[0, vocab)`` and integral, before any step."""
        self._check_ids(x)

    def _check_ids(self, x: Any) -> np.ndarray:
        ids = np.asarray(x)
        if ids.dtype == object or ids.dtype.kind not in "biuf":
            raise ValueError(f"Embedding {self.name!r} takes integer token ids, got dtype "
                             f"{ids.dtype} (ragged lists? pad them with "
                             "sparknet.data.pad_sequences)")
        if ids.ndim < 2:
            raise ValueError(f"Embedding {self.name!r} takes ids of shape (N, T), got {ids.shape}")
        if ids.dtype.kind == "f":
            if not (np.isfinite(ids).all() and np.all(ids == np.round(ids))):
                raise ValueError(f"Embedding {self.name!r} got non-integer token ids")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.vocab:
                bad = lo if lo < 0 else hi
                where = tuple(int(i) for i in np.argwhere(ids == bad)[0])
                raise ValueError(f"Embedding {self.name!r}: token id {bad} at index {where} is "
                                 f"outside [0, {self.vocab}) (vocab={self.vocab})")
        return ids

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        self._check_built()
        ids = self._check_ids(x)
        flat = ids.reshape(-1)
        out = np.empty((flat.shape[0], self.dim), dtype=self.dtype)
        _embedding.embedding_forward(flat, self.params["embeddings"], out)
        self._ids = ids
        return out.reshape(ids.shape + (self.dim,))

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        if not self.mask_zero or self._ids is None:
            return mask
        m = self._ids != 0
        if m.ndim > 2:
            m = m.reshape(m.shape[0], m.shape[1], -1).all(axis=2)
        return m if mask is None else (np.asarray(mask) != 0) & m

    def backward(self, dy: np.ndarray) -> None:
        if self._ids is None:
            raise RuntimeError(f"Embedding {self.name!r}: backward called before forward")
        flat = self._ids.reshape(-1)
        d = np.ascontiguousarray(dy, dtype=self.dtype).reshape(flat.shape[0], self.dim)
        _embedding.embedding_backward(flat, d, self.grads["embeddings"])
        return None

    def get_config(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "dim": self.dim, "mask_zero": self.mask_zero,
                "embeddings_initializer": self.embeddings_initializer, "name": self.name}

"""``SequenceMask``: padded sequences carrying their own mask, for data that travels as
one flat array per row (Spark DataFrames, the data-parallel trainer)."""
from __future__ import annotations

from typing import Any

import numpy as np

from sparknet.layers.base import Layer, register

__all__ = ["SequenceMask"]


@register
class SequenceMask(Layer):
    """Split the last feature of every step off as the step's mask.

    Input ``(N, T, F + 1)``: the first ``F`` values of a step are its features, the last
    is ``1`` for a real step and ``0`` for a padded one.  Output ``(N, T, F)``: the
    features, with the mask ``last value > 0.5`` handed to the layers after it (combined
    with any mask passed in), so recurrent layers skip padded steps and the loss ignores
    them.  :class:`sparknet.ml.SparkNetClassifier` puts this layer in front of a
    recurrent network when the features column holds variable-length sequences.

    Args:
        name: layer name.

    Input shape: ``(N, T, F + 1)``.  Output shape: ``(N, T, F)``.  No parameters.
    """

    supports_masking = True

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._mask: np.ndarray | None = None

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 2 or input_shape[-1] < 2:
            raise ValueError(f"SequenceMask {self.name!r} takes steps of (features + 1 mask "
                             "value), shape (T, F + 1) with F >= 1; got per-sample shape "
                             f"{tuple(input_shape)}")
        return (int(input_shape[0]), int(input_shape[1]) - 1)

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x)
        m = x[..., -1] > 0.5
        if mask is not None:
            m &= np.asarray(mask) != 0
        self._mask = m
        return np.ascontiguousarray(x[..., :-1])

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return self._mask

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if not self.need_input_grad:
            return None
        dx = np.zeros(dy.shape[:-1] + (dy.shape[-1] + 1,), dtype=dy.dtype)
        dx[..., :-1] = dy
        return dx

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name}

"""Global pooling: :class:`GlobalAveragePooling1D`, :class:`GlobalMaxPooling1D` over the
steps of ``(N, T, C)`` sequences, :class:`GlobalAveragePooling2D`,
:class:`GlobalMaxPooling2D` over the pixels of ``(N, H, W, C)`` images; each gives
``(N, C)``, one value per channel.

The 1-D layers take the ``(N, T)`` sequence mask (from ``Embedding(mask_zero=True)``,
:class:`~sparknet.layers.SequenceMask` or ``fit(..., mask=...)``): the mean and the
maximum then run over each sample's valid steps only, as PyTorch's ``x[n, valid].mean(0)``
and ``x[n, valid].max(0)`` would.  A sample with no valid step has no mean nor maximum:
its output is 0 and its input gradient 0.  Their output has no time axis, so no mask
goes further.

The 2-D layers are PyTorch's ``adaptive_avg_pool2d`` / ``adaptive_max_pool2d`` to 1x1,
flattened; they are the 1-D layers over the ``H * W`` pixels in row-major order.

Max pooling sends each gradient to the first maximal step (pixel, in row-major order)
of its channel, as PyTorch does.  The reductions are the nogil kernels of
:mod:`sparknet._pool_global`.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

import sparknet._pool_global as _pool_global
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, register

__all__ = ["GlobalAveragePooling1D", "GlobalMaxPooling1D",
           "GlobalAveragePooling2D", "GlobalMaxPooling2D"]


# ------------------------------------------------------------------ the maths
def _mask_bytes(mask: np.ndarray | None) -> np.ndarray | None:
    """A boolean ``(N, T)`` mask as the C-contiguous ``uint8`` view the kernels read."""
    return None if mask is None else np.ascontiguousarray(mask, dtype=np.bool_).view(np.uint8)


def masked_max(x: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(y, arg)``: ``y[n, c]`` the maximum of ``x[n, t, c]`` (C-contiguous ``(N, T, C)``)
    over the steps with ``mask[n, t]`` (all steps when None) and ``arg[n, c]`` its first
    step; ``y`` is 0 and ``arg`` -1 for a sample with no valid step."""
    N, _, C = x.shape
    y = np.empty((N, C), dtype=x.dtype)
    arg = np.empty((N, C), dtype=np.int32)
    _pool_global.max_forward(x, _mask_bytes(mask), y, arg)
    return y, arg


def masked_max_backward(dy: np.ndarray, arg: np.ndarray, T: int) -> np.ndarray:
    """``dx`` ``(N, T, C)``: each ``dy[n, c]`` at step ``arg[n, c]``, zero elsewhere (and
    everywhere for ``arg`` -1)."""
    dx = np.empty((dy.shape[0], T, dy.shape[1]), dtype=dy.dtype)
    _pool_global.max_backward(np.ascontiguousarray(dy), arg, dx)
    return dx


def masked_mean(x: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(y, inv)``: ``y[n, c]`` the mean of ``x[n, t, c]`` (C-contiguous ``(N, T, C)``)
    over the steps with ``mask[n, t]`` (all steps when None) and ``inv[n]`` one over their
    count; both 0 for a sample with no valid step."""
    N, _, C = x.shape
    y = np.empty((N, C), dtype=x.dtype)
    inv = np.empty(N, dtype=x.dtype)
    _pool_global.mean_forward(x, _mask_bytes(mask), y, inv)
    return y, inv


def masked_mean_backward(dy: np.ndarray, mask: np.ndarray | None, inv: np.ndarray,
                         T: int) -> np.ndarray:
    """``dx[n, t, c] = mask[n, t] * inv[n] * dy[n, c]``."""
    dx = np.empty((dy.shape[0], T, dy.shape[1]), dtype=dy.dtype)
    _pool_global.mean_backward(np.ascontiguousarray(dy), _mask_bytes(mask), inv, dx)
    return dx


# ------------------------------------------------------------------ the layers
class _GlobalPool(Layer):
    """Shared shape logic: per-sample input of ``rank`` axes, the last one channels."""

    #: axes of one sample, and how an error message names them
    rank: ClassVar[int] = 2
    layout: ClassVar[str] = "(T, C) (steps, channels last)"
    kind: ClassVar[str] = "sequences (T, C)"

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != self.rank:
            raise InputRankError(f"{type(self).__name__} {self.name!r} needs per-sample shape "
                                 f"{self.layout}, got {tuple(input_shape)} (rank "
                                 f"{len(input_shape)})", layout=self.kind, rank=self.rank,
                                 got=input_shape)
        return (int(input_shape[-1]),)

    def _steps(self, x: Any) -> np.ndarray:
        """The batch checked against the built shape, as ``(N, steps, C)``."""
        in_shape = self._shapes()[0]
        x = np.asarray(x)
        if x.shape[1:] != in_shape:
            want = ", ".join(str(d) for d in in_shape)
            raise ValueError(f"{type(self).__name__} {self.name!r} expects a batch of shape "
                             f"(N, {want}), got an array of shape {x.shape}")
        x = np.ascontiguousarray(x, dtype=self.dtype)
        return x.reshape(x.shape[0], -1, x.shape[-1])

    def _check_grad(self, dy: np.ndarray, n: int) -> np.ndarray:
        d = np.asarray(dy, dtype=self.dtype)
        C = self._shapes()[1][0]
        if d.shape != (n, C):
            raise ValueError(f"{type(self).__name__} {self.name!r}: gradient has shape "
                             f"{d.shape}, the output was {(n, C)}")
        return d

    def _input_shaped(self, dx: np.ndarray) -> np.ndarray:
        return dx.reshape((dx.shape[0],) + self._shapes()[0])

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return None

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name}


class _GlobalPool1D(_GlobalPool):
    """Masked global pooling over the steps of ``(N, T, C)``."""

    supports_masking = True

    def _mask(self, mask: np.ndarray | None, N: int, T: int) -> np.ndarray | None:
        if mask is None:
            return None
        m = np.asarray(mask)
        if m.shape != (N, T):
            raise ValueError(f"{type(self).__name__} {self.name!r}: mask has shape {m.shape}, "
                             f"expected (N, T) = {(N, T)} for input of {T} steps")
        return m if m.dtype == np.bool_ else m != 0


@register
class GlobalAveragePooling1D(_GlobalPool1D):
    """Mean over the steps of each sample, per channel, skipping masked steps.

    ``y[n, c] = sum over valid t of x[n, t, c] / (number of valid steps of n)``; all ``T``
    steps are valid without a mask.  A sample with no valid step outputs 0 (and gets a
    zero gradient).

    Args:
        name: layer name.

    Input shape: ``(N, T, C)`` and an optional ``(N, T)`` mask.  Output shape: ``(N, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x3 = self._steps(x)
        self._m = self._mask(mask, x3.shape[0], x3.shape[1])
        y, self._inv = masked_mean(x3, self._m)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = self._check_grad(dy, self._inv.shape[0])
        if not self.need_input_grad:
            return None
        return masked_mean_backward(d, self._m, self._inv, self._shapes()[0][0])


@register
class GlobalMaxPooling1D(_GlobalPool1D):
    """Maximum over the steps of each sample, per channel, skipping masked steps.

    The first maximal valid step of each channel wins and alone receives the gradient.
    A sample with no valid step outputs 0 (and gets a zero gradient).

    Args:
        name: layer name.

    Input shape: ``(N, T, C)`` and an optional ``(N, T)`` mask.  Output shape: ``(N, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x3 = self._steps(x)
        y, self._arg = masked_max(x3, self._mask(mask, x3.shape[0], x3.shape[1]))
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = self._check_grad(dy, self._arg.shape[0])
        if not self.need_input_grad:
            return None
        return masked_max_backward(d, self._arg, self._shapes()[0][0])


class _GlobalPool2D(_GlobalPool):
    """Global pooling over the pixels of ``(N, H, W, C)``, as over ``H * W`` steps."""

    rank: ClassVar[int] = 3
    layout: ClassVar[str] = "(H, W, C) (channels last)"
    kind: ClassVar[str] = "images (H, W, C)"


@register
class GlobalAveragePooling2D(_GlobalPool2D):
    """Mean over the pixels of each image, per channel (PyTorch's
    ``adaptive_avg_pool2d(x, 1)``, flattened).

    Args:
        name: layer name.

    Input shape: ``(N, H, W, C)``.  Output shape: ``(N, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        y, self._inv = masked_mean(self._steps(x), None)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = self._check_grad(dy, self._inv.shape[0])
        if not self.need_input_grad:
            return None
        H, W, _ = self._shapes()[0]
        return self._input_shaped(masked_mean_backward(d, None, self._inv, H * W))


@register
class GlobalMaxPooling2D(_GlobalPool2D):
    """Maximum over the pixels of each image, per channel (PyTorch's
    ``adaptive_max_pool2d(x, 1)``, flattened); the first maximal pixel in row-major
    order wins and alone receives the gradient.

    Args:
        name: layer name.

    Input shape: ``(N, H, W, C)``.  Output shape: ``(N, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        y, self._arg = masked_max(self._steps(x), None)
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = self._check_grad(dy, self._arg.shape[0])
        if not self.need_input_grad:
            return None
        H, W, _ = self._shapes()[0]
        return self._input_shaped(masked_max_backward(d, self._arg, H * W))

"""Zero padding as a layer of its own: :class:`ZeroPadding2D` around images ``(N, H, W, C)``,
:class:`ZeroPadding1D` around sequences ``(N, T, C)``, as Keras' layers of those names and
PyTorch's ``nn.ZeroPad2d`` / ``nn.ZeroPad1d``.

A convolution pads by itself (``padding=p``, ``"same"``); a padding layer is for what it
does not cover: uneven padding (``((0, 1), (0, 1))``) and padding before a pool, as in
Keras' ResNet50 (``ZeroPadding2D(1)`` then ``MaxPooling2D(3, strides=2)``), where zeros
may win a max that sparknet's padded pools would leave to the image.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, register

__all__ = ["ZeroPadding1D", "ZeroPadding2D"]

def _side(value: Any, what: str) -> tuple[int, int]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or not all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) and p >= 0
            for p in items):
        raise ValueError(f"{what} must be an integer >= 0 or a pair (before, after) of them, "
                         f"got {value!r}")
    return int(items[0]), int(items[1])


def _sides(padding: int | tuple[Any, ...] | list[Any], axes: int,
           kind: str) -> tuple[tuple[int, int], ...]:
    """``padding`` as ``((before, after), ...)``, one pair per spatial axis."""
    what = f"{kind} padding"
    if axes == 1:
        return (_side(padding, what),)
    items = padding if isinstance(padding, (tuple, list)) else (padding,) * axes
    if len(items) != axes:
        raise ValueError(f"{what} must be an int, {axes} of them (one per axis) or {axes} "
                         f"pairs (before, after), got {padding!r}")
    return tuple(_side(p, what) for p in items)


class _ZeroPadding(Layer):
    """What both layers share: the zeros before and after each spatial axis."""

    axes = 2
    layout = "images (H, W, C)"

    def __init__(self, padding: int | tuple[Any, ...] | list[Any] = 1,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.padding = _sides(padding, self.axes, type(self).__name__)

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != self.axes + 1:
            raise InputRankError(
                f"{type(self).__name__} {self.name!r} needs {self.layout}, channels last, got "
                f"per-sample shape {tuple(input_shape)} (rank {len(input_shape)})",
                layout=self.layout, rank=self.axes + 1, got=input_shape)
        spatial = [int(s) + a + b for s, (a, b) in zip(input_shape, self.padding)]
        return (*spatial, int(input_shape[-1]))

    def _window(self) -> tuple[slice, ...]:
        """The input's place in the padded output."""
        shape = self._shapes()[0]
        return (slice(None),) + tuple(slice(a, a + s) for s, (a, _) in zip(shape, self.padding))

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x = np.asarray(x)
        if x.shape[1:] != self._shapes()[0]:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects samples of shape "
                             f"{self._shapes()[0]}, got a batch of shape {x.shape}")
        y = np.zeros((x.shape[0],) + self._shapes()[1], dtype=self.dtype)
        y[self._window()] = x
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if not self.need_input_grad:
            return None
        return np.ascontiguousarray(dy[self._window()], dtype=self.dtype)

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        if mask is not None:
            raise ValueError(f"{type(self).__name__} {self.name!r} does not support masking, "
                             f"but an (N, T) sequence mask reached it: pad the sequences with "
                             f"zeros and pass no mask")
        return None

    def get_config(self) -> dict[str, Any]:
        return {"padding": [list(p) for p in self.padding], "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "_ZeroPadding":
        config = dict(config)
        padding = config.pop("padding", 1)
        if cls.axes == 1 and isinstance(padding, list) and len(padding) == 1:
            padding = padding[0]
        return cls(padding, **config)


@register
class ZeroPadding2D(_ZeroPadding):
    """Zeros around each image: ``(N, H, W, C)`` -> ``(N, t + H + b, l + W + r, C)``.

    Args:
        padding: an int ``p`` (``p`` rows and columns on every side), ``(ph, pw)``, or
            ``((top, bottom), (left, right))``, as Keras' ``ZeroPadding2D``.
        name: layer name.
    """

    axes = 2
    layout = "images (H, W, C)"


@register
class ZeroPadding1D(_ZeroPadding):
    """Zeros around each sequence: ``(N, T, C)`` -> ``(N, before + T + after, C)``.

    Args:
        padding: an int ``p`` (``p`` steps at both ends) or ``(before, after)``.
        name: layer name.
    """

    axes = 1
    layout = "sequences (T, C)"

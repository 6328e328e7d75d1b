"""``Residual``: a skip connection around a stack of layers, ``y = x + f(x)``, or, with a
projection shortcut ``g``, ``y = g(x) + f(x)``.

The stack ``f`` is the block's children, run in order (parameter names ``"0.kernel"``,
``"1.gamma"``, ...), so a ResNet block is
``Residual([Conv2D(c, 3, padding="same"), BatchNormalization(), Activation("relu"),
Conv2D(c, 3, padding="same"), BatchNormalization()])`` followed by ``Activation("relu")``.
A block that downsamples or widens takes a shortcut of its own (``"shortcut.0.kernel"``,
...), as torchvision's ``downsample``: ``Residual([Conv2D(2 * c, 3, strides=2,
padding="same"), ...], shortcut=[Conv2D(2 * c, 1, strides=2), BatchNormalization()])``.
Blocks nest (a ``Residual`` among the layers of another), pass masks through, and carry
their children's non-trained state (running statistics) like any layer.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sparknet.layers.base import Layer, register
from sparknet.layers.container import Container

__all__ = ["Residual"]


@register
class Residual(Container):
    """Add the input to the output of a stack of layers: ``y = x + f(x)``; or, given a
    ``shortcut`` stack ``g``, add the two stacks' outputs: ``y = g(x) + f(x)``.

    ``f`` runs ``layers`` in order, as a :class:`~sparknet.model.Sequential` would: layers
    that support masks get the mask of their input, and the block hands on its input's
    mask unchanged.  Without a shortcut ``f`` must keep the per-sample shape; with one,
    ``f`` and ``g`` must map the input to one shape.  A stack that does not is refused when
    the block is built, naming the block and the shapes.

    The gradient is ``dx = dy + f'(dy)`` (``g'(dy) + f'(dy)`` with a shortcut).  When the
    model asks the block for no input gradient (it is the first layer), the first layer of
    each stack skips its own as well.

    Args:
        layers: the layers of ``f``, first to last (at least one); their parameter and
            state names are prefixed by their position (``"0."``, ``"1."``, ...).
        shortcut: the layers of ``g``, first to last (``None``, the default: the identity);
            their names are prefixed ``"shortcut.0."``, ``"shortcut.1."``, ...
        name: layer name.

    Input shape: any ``(N, ...)`` the layers take.  Output shape: the same, or with a
    shortcut, the stacks' output shape.

    Raises:
        ValueError: ``layers`` or ``shortcut`` empty, not layers or holding one layer twice
            (at construction); the stacks' shapes not as above (when built).
    """

    supports_masking = True

    def __init__(self, layers: Sequence[Layer], shortcut: Sequence[Layer] | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        seen: set[int] = set()
        body = self.check_stack(layers, "Residual layers", seen)
        short = [] if shortcut is None else self.check_stack(shortcut, "Residual shortcut", seen)
        self.children = {str(i): layer for i, layer in enumerate(body)}
        self.children.update({f"shortcut.{i}": layer for i, layer in enumerate(short)})

    @property
    def layers(self) -> list[Layer]:
        """The layers of ``f``, first to last."""
        return [c for p, c in self.children.items() if not p.startswith("shortcut.")]

    @property
    def shortcut(self) -> list[Layer] | None:
        """The layers of the shortcut ``g``, first to last; ``None`` for the identity."""
        short = [c for p, c in self.children.items() if p.startswith("shortcut.")]
        return short or None

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = input_shape
        for prefix in self.children:
            if not prefix.startswith("shortcut."):
                shape = self._build_child(prefix, shape)
        if self.shortcut is None:
            if tuple(shape) != tuple(input_shape):
                raise ValueError(f"Residual {self.name!r} adds its input to the output of its "
                                 f"layers, which must keep the per-sample shape: they map "
                                 f"{tuple(input_shape)} to {tuple(shape)} (give the block a "
                                 f"shortcut=[...] that maps the input to that shape)")
            return input_shape
        short = input_shape
        for prefix in self.children:
            if prefix.startswith("shortcut."):
                short = self._build_child(prefix, short)
        if tuple(short) != tuple(shape):
            raise ValueError(f"Residual {self.name!r} adds the outputs of its layers and of its "
                             f"shortcut, which must have one shape: they map "
                             f"{tuple(input_shape)} to {tuple(shape)} and {tuple(short)}")
        return tuple(shape)

    def check_input(self, x: np.ndarray) -> None:
        """The first child's checks of a whole input array (the block as a model's first layer)."""
        self.layers[0].check_input(x)

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        h = self._forward_stack(self.layers, x, training, mask)
        short = self.shortcut
        skip = x if short is None else self._forward_stack(short, x, training, mask)
        # a new array: the children may keep their outputs (and the block's input) for backward
        return np.add(skip, h, dtype=self.dtype)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        # the children may overwrite the gradient they get; dy is still needed for the skip
        d = self._backward_stack(self.layers, np.array(dy, dtype=self.dtype, order="C", copy=True))
        short = self.shortcut
        if short is not None:
            ds = self._backward_stack(short, np.array(dy, dtype=self.dtype, order="C", copy=True))
            if ds is None or d is None:
                return None
            return np.add(ds, d.reshape(ds.shape), dtype=self.dtype)   # g'(dy) + f'(dy)
        if d is None:
            return None
        if dy.dtype == self.dtype and dy.flags.writeable and dy.flags.c_contiguous:
            np.add(dy, d.reshape(dy.shape), out=dy)   # dx = dy + f'(dy), in the caller's dy
            return dy
        return np.add(dy, d.reshape(dy.shape), dtype=self.dtype)

    def __repr__(self) -> str:
        body = ", ".join(repr(layer) for layer in self.layers)
        short = self.shortcut
        if short is None:
            return f"Residual([{body}])"
        return f"Residual([{body}], shortcut=[{', '.join(repr(layer) for layer in short)}])"

    # -- (de)serialisation ------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"layers": self.children_to_config(self.layers),
                                  "name": self.name}
        short = self.shortcut
        if short is not None:
            config["shortcut"] = self.children_to_config(short)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Residual":
        config = dict(config)
        where = f"Residual {config.get('name', 'residual')!r}"
        layers = cls.children_from_config(config.pop("layers", None), f"{where} layers")
        short = config.pop("shortcut", None)
        shortcut = None if short is None else cls.children_from_config(short, f"{where} shortcut")
        return cls(layers, shortcut=shortcut, **config)


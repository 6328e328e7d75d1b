"""``Residual``: a skip connection around a stack of layers, ``y = x + f(x)``.

The stack ``f`` is the block's children, run in order (parameter names ``"0.kernel"``,
``"1.gamma"``, ...), so a ResNet block is
``Residual([Conv2D(c, 3, padding="same"), BatchNormalization(), Activation("relu"),
Conv2D(c, 3, padding="same"), BatchNormalization()])`` followed by ``Activation("relu")``.
Blocks nest (a ``Residual`` among the layers of another), pass masks through, and carry
their children's non-trained state (running statistics) like any layer.
"""
from __future__ import annotations

from typing import Any, Sequence, cast

import numpy as np

from sparknet.layers.base import Layer, MaskedLayer, register
from sparknet.layers.container import Container

__all__ = ["Residual"]


@register
class Residual(Container):
    """Add the input to the output of a stack of layers: ``y = x + f(x)``.

    ``f`` runs ``layers`` in order, as a :class:`~sparknet.model.Sequential` would: layers
    that support masks get the mask of their input, and the block hands on its input's
    mask unchanged.  ``f`` must keep the per-sample shape; a stack that changes it is
    refused when the block is built, naming the block and both shapes.

    The gradient is ``dx = dy + f'(dy)``.  When the model asks the block for no input
    gradient (it is the first layer), its first child skips its own as well.

    Args:
        layers: the layers of ``f``, first to last (at least one); their parameter and
            state names are prefixed by their position (``"0."``, ``"1."``, ...).
        name: layer name.

    Input shape: any ``(N, ...)`` the layers take.  Output shape: the same.

    Raises:
        ValueError: ``layers`` empty, not layers or holding one layer twice (at
            construction); ``f`` changing the per-sample shape (when built).
    """

    supports_masking = True

    def __init__(self, layers: Sequence[Layer], name: str | None = None) -> None:
        super().__init__(name)
        if isinstance(layers, Layer) or not isinstance(layers, (list, tuple)):
            raise ValueError(f"Residual layers must be a list of layers, got {layers!r}")
        if not layers:
            raise ValueError("Residual layers must hold at least one layer, got []")
        seen: set[int] = set()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise ValueError(f"Residual layers[{i}] must be a sparknet Layer, got "
                                 f"{type(layer).__name__}")
            if id(layer) in seen:
                raise ValueError(f"Residual layers[{i}] ({type(layer).__name__} {layer.name!r}) "
                                 f"appears twice; give each position its own layer")
            seen.add(id(layer))
        self.children = {str(i): layer for i, layer in enumerate(layers)}

    @property
    def layers(self) -> list[Layer]:
        """The layers of ``f``, first to last."""
        return list(self.children.values())

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = input_shape
        for prefix in self.children:
            shape = self._build_child(prefix, shape)
        if tuple(shape) != tuple(input_shape):
            raise ValueError(f"Residual {self.name!r} adds its input to the output of its layers, "
                             f"which must keep the per-sample shape: they map {tuple(input_shape)} "
                             f"to {tuple(shape)}")
        return input_shape

    def check_input(self, x: np.ndarray) -> None:
        """The first child's checks of a whole input array (the block as a model's first layer)."""
        self.layers[0].check_input(x)

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        h, m = x, mask
        for layer in self.children.values():
            if layer.supports_masking:
                h = cast(MaskedLayer, layer).forward(h, training=training, mask=m)
            else:
                h = layer.forward(h, training=training)
            m = layer.compute_mask(m)
        # a new array: the children may keep their outputs (and the block's input) for backward
        return np.add(x, h, dtype=self.dtype)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        layers = self.layers
        # the children may overwrite the gradient they get; dy is still needed for the skip
        d: np.ndarray | None = np.array(dy, dtype=self.dtype, order="C", copy=True)
        first = layers[0]
        first.need_input_grad = self.need_input_grad
        try:
            for i in range(len(layers) - 1, -1, -1):
                if d is None:   # a layer inside the block returned no input gradient
                    raise RuntimeError(f"Residual {self.name!r}: layer {i + 1} "
                                       f"({layers[i + 1].name!r}) returned no input gradient")
                d = layers[i].backward(d)
        finally:
            first.need_input_grad = True
        if not self.need_input_grad:
            return None
        if d is None:
            raise RuntimeError(f"Residual {self.name!r}: layer 0 ({first.name!r}) returned no "
                               f"input gradient")
        if dy.dtype == self.dtype and dy.flags.writeable and dy.flags.c_contiguous:
            np.add(dy, d.reshape(dy.shape), out=dy)   # dx = dy + f'(dy), in the caller's dy
            return dy
        return np.add(dy, d.reshape(dy.shape), dtype=self.dtype)

    def __repr__(self) -> str:
        return f"Residual([{', '.join(repr(layer) for layer in self.children.values())}])"

    # -- (de)serialisation ------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"layers": self.children_to_config(self.children.values()), "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Residual":
        config = dict(config)
        where = f"Residual {config.get('name', 'residual')!r} layers"
        layers = cls.children_from_config(config.pop("layers", None), where)
        return cls(layers, **config)

"""``Container``: a layer made of other layers (residual blocks, Transformer encoders,
bidirectional wrappers).

A container owns its children's parameters and state the way ``Sequential`` owns its
layers': it declares them under prefixed names (``"0.kernel"``, ``"attention.bias"``), so
they sit in the model's one flat parameter buffer and one flat state buffer, and it splits
the views it is bound to among its children.  A subclass builds its children in
``_build`` (each through :meth:`Container._build_child`) and runs them in ``forward`` /
``backward``; saving and loading go through :meth:`get_config`, which nests the
children's own configs.
"""
from __future__ import annotations

from typing import Any, Iterable, cast

import numpy as np

from sparknet.layers.base import (
    Layer,
    MaskedLayer,
    ParamSpec,
    layer_from_config,
    layer_to_config,
)


class Container(Layer):
    """Base class of layers that hold child layers.

    Subclasses set :attr:`children` as ``{prefix: layer}`` (insertion order is the order
    of their parameters) before :meth:`build`, and build each child with
    :meth:`_build_child` from their ``_build``.
    """

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.children: dict[str, Layer] = {}

    # -- construction -----------------------------------------------------
    def _build_child(self, prefix: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Build child ``prefix`` for per-sample ``shape`` (seeded from this layer's
        generator); returns its output shape.  Errors name the child."""
        child = self.children[prefix]
        child.rng = np.random.default_rng([int(self.rng.integers(2 ** 62)), len(prefix)])
        try:
            return child.build(shape, self.dtype)
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__} {self.name!r}, {prefix} "
                             f"({type(child).__name__} {child.name!r}): {exc}") from exc

    def param_specs(self) -> list[ParamSpec]:
        return [(f"{p}.{n}", s) for p, c in self.children.items() for n, s in c.param_specs()]

    def state_specs(self) -> list[ParamSpec]:
        return [(f"{p}.{n}", s) for p, c in self.children.items() for n, s in c.state_specs()]

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        for i, (prefix, child) in enumerate(self.children.items()):
            seed = [int(rng.integers(2 ** 62)), i]
            child.init_params(_split(params, prefix), np.random.default_rng(seed))

    def bind(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        super().bind(params, grads)
        for prefix, child in self.children.items():
            child.bind(_split(params, prefix), _split(grads, prefix))

    def init_state(self, state: dict[str, np.ndarray]) -> None:
        for prefix, child in self.children.items():
            child.init_state(_split(state, prefix))

    def bind_state(self, state: dict[str, np.ndarray]) -> None:
        super().bind_state(state)
        for prefix, child in self.children.items():
            child.bind_state(_split(state, prefix))

    @staticmethod
    def check_stack(layers: Any, where: str, seen: set[int], empty: bool = False) -> list[Layer]:
        """``layers`` as a list of layers (``empty``: may be empty), none of them in ``seen``
        or twice (``seen`` gets them); a ``ValueError`` naming the place (``where``, e.g.
        ``"Residual layers"``) otherwise."""
        if isinstance(layers, Layer) or not isinstance(layers, (list, tuple)):
            raise ValueError(f"{where} must be a list of layers, got {layers!r}")
        if not layers and not empty:
            raise ValueError(f"{where} must hold at least one layer, got []")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise ValueError(f"{where}[{i}] must be a sparknet Layer, got "
                                 f"{type(layer).__name__}")
            if id(layer) in seen:
                raise ValueError(f"{where}[{i}] ({type(layer).__name__} {layer.name!r}) "
                                 f"appears twice; give each position its own layer")
            seen.add(id(layer))
        return list(layers)

    # -- running stacks of children ----------------------------------------
    def _forward_stack(self, layers: list[Layer], x: np.ndarray, training: bool,
                       mask: np.ndarray | None) -> np.ndarray:
        """The output of the children ``layers`` run in order on ``x``, as a ``Sequential``
        runs its layers: each that supports masks gets the mask of its input."""
        h, m = x, mask
        for layer in layers:
            if layer.supports_masking:
                h = cast(MaskedLayer, layer).forward(h, training=training, mask=m)
            else:
                h = layer.forward(h, training=training)
            m = layer.compute_mask(m)
        return h

    def _backward_stack(self, layers: list[Layer], d: np.ndarray | None) -> np.ndarray | None:
        """The input gradient of the children ``layers`` (run by :meth:`_forward_stack`) for
        output gradient ``d``; None when this layer needs none (its first child is told to
        skip its own)."""
        first = layers[0]
        first.need_input_grad = self.need_input_grad
        try:
            for i in range(len(layers) - 1, -1, -1):
                if d is None:   # a layer inside the block returned no input gradient
                    raise RuntimeError(f"{type(self).__name__} {self.name!r}: layer {i + 1} "
                                       f"({layers[i + 1].name!r}) returned no input gradient")
                d = layers[i].backward(d)
        finally:
            first.need_input_grad = True
        if not self.need_input_grad:
            return None
        if d is None:
            raise RuntimeError(f"{type(self).__name__} {self.name!r}: layer 0 ({first.name!r}) "
                               f"returned no input gradient")
        return d

    def sublayers(self) -> Iterable[Layer]:
        """Every layer inside this one, depth first (children of children included)."""
        for child in self.children.values():
            yield child
            if isinstance(child, Container):
                yield from child.sublayers()

    # -- (de)serialisation ------------------------------------------------
    @staticmethod
    def children_to_config(layers: Iterable[Layer]) -> list[dict[str, Any]]:
        return [layer_to_config(layer) for layer in layers]

    @staticmethod
    def children_from_config(specs: Any, where: str) -> list[Layer]:
        if not isinstance(specs, (list, tuple)):
            raise ValueError(f"{where}: expected a list of layer configs, got {specs!r}")
        return [s if isinstance(s, Layer) else layer_from_config(s, f"{where}[{i}]")
                for i, s in enumerate(specs)]


def _split(views: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries of ``views`` under ``prefix.``, with the prefix removed."""
    head = prefix + "."
    return {k[len(head):]: v for k, v in views.items() if k.startswith(head)}

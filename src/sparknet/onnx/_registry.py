"""The exporter registry: one function per layer class, writing that layer's operators."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from sparknet.layers.base import Layer
from sparknet.onnx._builder import Builder

#: ``fn(layer, builder, x) -> y``: adds the layer's nodes reading tensor ``x``, returns
#: the name of its output tensor
ExportFn = Callable[[Any, Builder, str], str]
F = TypeVar("F", bound=ExportFn)


@dataclass(frozen=True)
class Exporter:
    """One registry entry.  ``any_layout``: the function takes its input channels-first
    or channels-last (it reads ``Builder.channels_first``); the others are given
    sparknet's own, channels-last layout."""

    fn: ExportFn
    any_layout: bool = False


#: layer class -> its exporter (the exact class: a subclass may compute something else)
EXPORTERS: dict[type[Layer], Exporter] = {}


def register_exporter(*classes: type[Layer], any_layout: bool = False) -> Callable[[F], F]:
    """Decorator: ``fn`` exports the layers of ``classes``."""

    def deco(fn: F) -> F:
        for cls in classes:
            EXPORTERS[cls] = Exporter(fn, any_layout)
        return fn

    return deco


def export_layer(layer: Layer, b: Builder, x: str) -> str:
    """Add ``layer``'s nodes to ``b`` reading ``x``; returns its output tensor.

    Raises:
        ValueError: the layer's class has no exporter (naming the layer and its class).
    """
    entry = EXPORTERS.get(type(layer))
    if entry is None:
        known = ", ".join(sorted(c.__name__ for c in EXPORTERS))
        raise ValueError(
            f"layer {layer.name!r} ({type(layer).__name__}) cannot be exported to ONNX: "
            f"no exporter for {type(layer).__name__} (layers with one: {known})"
        )
    in_shape, _ = layer._shapes()
    if not entry.any_layout:
        x = b.channels_last_of(x, 1 + len(in_shape), f"{layer.name}/to_channels_last")
    return entry.fn(layer, b, x)

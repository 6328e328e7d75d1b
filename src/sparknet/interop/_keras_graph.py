"""A Keras 3 functional model read as one chain of layers, with skip connections.

The model's operations are read in their order.  Each layer that reads one tensor extends
the chain of that tensor; ``Add()([x, y])`` (or ``x + y``) is a skip connection:
``Residual([...])`` of the layers from where the two branches part to the longer one, with
the other's as its ``shortcut`` (none: the identity); ``Concatenate`` (on the last axis),
``Multiply`` and an ``Add`` of more tensors are a ``Parallel`` of the branches; a
``MultiHeadAttention`` called as ``mha(x, x)`` is self-attention.  Anything else (a layer
called twice, several inputs or outputs, other operations) is refused, naming the layer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np

from sparknet.interop._chains import shared_start
from sparknet.layers import Layer, MultiHeadAttention, Parallel, Residual

__all__ = ["chain_of", "layers_of", "Chain", "Merge", "Skip"]


@dataclass(eq=False, frozen=True)
class Skip:
    """A skip connection: the input of ``body`` (or the output of ``shortcut``, when it has
    layers) added to its output (``name``: the Add)."""

    name: str
    body: tuple[Chain, ...]
    shortcut: tuple[Chain, ...] = ()


@dataclass(eq=False, frozen=True)
class Merge:
    """Branches from one tensor joined by ``Concatenate`` on the last axis, ``Multiply``,
    or an ``Add`` of more than two (``name``: the merging layer)."""

    name: str
    branches: tuple[tuple[Chain, ...], ...]
    merge: str


Chain = Union[Any, Skip, Merge]  # a Keras layer, a skip connection, or merged branches


def _where(op: Any) -> str:
    return f"Keras layer {op.name!r} ({type(op).__name__})"


def _is_add(op: Any) -> bool:
    import keras

    return isinstance(op, keras.layers.Add) or (
        type(op).__name__ == "Add" and type(op).__module__.startswith("keras.src.ops")
    )


def chain_of(model: Any) -> tuple[Chain, ...]:
    """The chain of ``model``'s layers from its input to its output, with its skip
    connections and merged branches.

    Raises:
        ValueError: the first operation sparknet cannot express (a layer called twice, an
            operation with no equivalent, a tensor added to itself, ...), named.
    """
    import keras

    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(
            f"the Keras model has {len(model.inputs)} inputs and {len(model.outputs)} outputs; "
            f"sparknet models read one tensor and give one"
        )
    values: dict[int, tuple[Chain, ...]] = {id(model.inputs[0]): ()}
    others: dict[int, Any] = {}  # tensors of operations that are not layers: masks, or refused

    def chain(t: Any, op: Any) -> tuple[Chain, ...]:
        if id(t) in others:
            o = others[id(t)]
            raise ValueError(
                f"{_where(op)} reads the output of Keras operation {o.name!r} "
                f"({type(o).__name__}), which has no sparknet equivalent"
            )
        if id(t) not in values:
            raise ValueError(f"{_where(op)} reads a tensor that is not computed from the input")
        return values[id(t)]

    depths = model._nodes_by_depth  # the model's calls, from the input (deepest) on
    nodes = [n for d in sorted(depths, reverse=True) for n in depths[d]]
    calls = Counter(id(n.operation) for n in nodes)
    out: tuple[Chain, ...]
    for node in nodes:
        op = node.operation
        if isinstance(op, keras.layers.InputLayer):
            continue
        if calls[id(op)] > 1:
            raise ValueError(
                f"{_where(op)} is called {calls[id(op)]} times in the model; sparknet layers "
                f"do not share weights"
            )
        if not isinstance(op, keras.layers.Layer) and not _is_add(op):
            others.update((id(t), op) for t in node.output_tensors)
            continue
        # the tensors it reads, less the mask Keras hands on (sparknet's layers pass masks)
        given = [
            node.arguments.args,
            {k: v for k, v in node.arguments.kwargs.items() if k != "mask"},
        ]
        inputs = [t for t in keras.tree.flatten(given) if isinstance(t, keras.KerasTensor)]
        if _is_add(op):
            if not isinstance(op, keras.layers.Layer) and any(
                getattr(t, "_keras_mask", None) is not None for t in inputs
            ):
                raise ValueError(
                    f"{_where(op)}: x + y of masked tensors, which drops Keras' mask (sparknet "
                    f"keeps it): write keras.layers.Add()([x, y])"
                )
            if len(inputs) != 2:
                out = _merge(op, [chain(t, op) for t in inputs], "add")
                for t in node.output_tensors:
                    values[id(t)] = out
                continue
            a, b = (chain(t, op) for t in inputs)
            common = shared_start([a, b])
            body, shortcut = a[common:], b[common:]
            if len(shortcut) > len(body):  # the block's layers are the longer branch
                body, shortcut = shortcut, body
            if not body:
                raise ValueError(f"{_where(op)} adds a tensor to itself")
            out = a[:common] + (Skip(op.name, body, shortcut),)
        elif isinstance(op, (keras.layers.Concatenate, keras.layers.Multiply)):
            if isinstance(op, keras.layers.Concatenate) and op.axis not in (
                -1,
                len(op.output.shape) - 1,
            ):
                raise ValueError(
                    f"{_where(op)}: axis={op.axis}; sparknet joins branches on the last axis"
                )
            merge = "concat" if isinstance(op, keras.layers.Concatenate) else "multiply"
            out = _merge(op, [chain(t, op) for t in inputs], merge)
        elif isinstance(op, keras.layers.MultiHeadAttention):
            if len({id(t) for t in inputs}) != 1:
                raise ValueError(
                    f"{_where(op)} attends to another tensor than its queries; sparknet's "
                    f"MultiHeadAttention is self-attention, mha(x, x)"
                )
            out = chain(inputs[0], op) + (op,)
        elif len(inputs) != 1:
            raise ValueError(f"{_where(op)} reads {len(inputs)} tensors; sparknet layers read one")
        else:
            out = chain(inputs[0], op) + (op,)
        for t in node.output_tensors:
            values[id(t)] = out
    return chain(model.outputs[0], model)


def _merge(op: Any, chains: list[tuple[Chain, ...]], merge: str) -> tuple[Chain, ...]:
    """The chain of ``op`` merging ``chains``: their common start, then the branches."""
    common = shared_start(chains)
    return chains[0][:common] + (Merge(op.name, tuple(c[common:] for c in chains), merge),)


def layers_of(chain: tuple[Chain, ...], convert: Callable[[Any], list[Layer]]) -> list[Layer]:
    """The sparknet layers of ``chain``: ``convert`` for each Keras layer, a ``Residual`` of
    its body's (and its shortcut's) for each skip."""
    out: list[Layer] = []
    for step in chain:
        if isinstance(step, Skip):
            short = layers_of(step.shortcut, convert)
            out.append(Residual(layers_of(step.body, convert), shortcut=short or None))
        elif isinstance(step, Merge):
            branches = [layers_of(b, convert) for b in step.branches]
            out.append(Parallel(branches, merge=step.merge))
        else:
            out += convert(step)
    return out


def attention(k: Any) -> tuple[Layer, Callable[[], None]]:
    """Keras ``MultiHeadAttention`` as sparknet's, whose projections keep PyTorch's layout:
    ``num_heads * key_dim`` must be the input width, and the values as wide as the keys."""
    D, H, kd = int(k.query_dense.kernel.shape[0]), k.num_heads, k.key_dim
    if H * kd != D or (k.value_dim or kd) != kd or k._output_shape is not None:
        raise ValueError(
            f"{_where(k)}: num_heads * key_dim = {H} * {kd} must equal the input width {D}, "
            f"with value_dim = key_dim and no output_shape (sparknet's MultiHeadAttention "
            f"keeps PyTorch's layout): use key_dim={D // H}"
        )
    if k._attention_axes is not None and tuple(k._attention_axes) not in ((1,), (-2,)):
        raise ValueError(
            f"{_where(k)}: attention_axes={k._attention_axes}; sparknet attends over the steps"
        )
    layer = MultiHeadAttention(H, dropout=float(k.dropout), use_bias=k.use_bias)

    def setter() -> None:
        import keras

        def np64(v: Any) -> np.ndarray:
            return np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64)

        dense = (k.query_dense, k.key_dense, k.value_dense)
        layer.params["in_proj_weight"][...] = np.concatenate(
            [np64(d.kernel).reshape(D, D).T for d in dense]
        )
        layer.params["out_proj_weight"][...] = np64(k.output_dense.kernel).reshape(D, D).T
        if k.use_bias:
            layer.params["in_proj_bias"][...] = np.concatenate(
                [np64(d.bias).reshape(D) for d in dense]
            )
            layer.params["out_proj_bias"][...] = np64(k.output_dense.bias)

    return layer, setter

"""A PyTorch module with its own ``forward()`` as a sparknet model (:func:`from_graph`).

``forward()`` is traced with ``torch.fx`` into a graph of module calls and tensor functions.
The graph is read as one chain from the input to the output:

- a module call is the module's layer, converted as in an ``nn.Sequential``;
- ``F.relu``, ``torch.flatten``, ``F.max_pool2d``, ``x.view(x.size(0), -1)``, ``x.mean(1)``
  and the other tensor functions ``function_module`` knows are the module they stand for;
- ``a + b`` is a skip connection: ``Residual([...])`` of the modules from the point where the
  two branches part to ``a`` (the longer branch), with the modules to ``b`` as its
  ``shortcut`` (none: the identity); ``torch.cat([a, b, ...], dim=1)`` on the channels and
  ``a * b`` are a ``Parallel`` of the branches (Inception, DenseNet, SwiGLU);
- an ``nn.LSTM``'s ``out, _ = lstm(x)`` and ``out[:, -1]`` (or ``h[-1]``) are its sequences and
  its last step; ``attn(x, x, x)[0]`` of an ``nn.MultiheadAttention`` is self-attention;
- ``x.transpose(1, 2)`` of a sequence swaps torch's ``(N, T, C)`` and ``(N, C, T)``, which
  are the same ``(N, T, C)`` tensor in sparknet's channels-last layout.

Anything else (a parameter read outside a module, a module called twice, control flow on
tensor values) is refused, naming the node of ``forward()`` it comes from.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import fx, nn

from sparknet.interop._chains import shared_start
from sparknet.interop._from_torch_functions import (
    GRAPH_CONVERTERS,
    Refused,
    Transpose,
    View,
    function_module,
    function_name,
    node_error,
)
from sparknet.interop._from_torch_messages import input_shape_of
from sparknet.interop._from_torch_modules import (
    SPATIAL,
    Walk,
    build_model,
)
from sparknet.interop._torch import RecurrentOutput
from sparknet.layers import (
    Parallel,
    Residual,
)
from sparknet.model import Sequential

__all__ = ["from_graph", "is_own_forward"]


# -- the graph, read as a chain ---------------------------------------------------------
@dataclass(eq=False, frozen=True)
class _Step:
    """One module of the chain: ``name`` is how messages name it."""

    name: str
    module: nn.Module


@dataclass(eq=False, frozen=True)
class _Skip:
    """A skip connection: the input of ``body`` (or the output of ``shortcut``, when it has
    modules) added to its output."""

    name: str
    body: tuple[Chain, ...]
    shortcut: tuple[Chain, ...] = ()


@dataclass(eq=False, frozen=True)
class _Merge:
    """Branches from one tensor joined by ``torch.cat`` on ``dim`` or multiplied."""

    name: str
    branches: tuple[tuple[Chain, ...], ...]
    merge: str
    dim: int = -1


Chain = Union[_Step, _Skip, _Merge]


@dataclass(frozen=True)
class _Value:
    """What a node of the graph holds: a tensor computed by the chain ``steps`` from the
    input, or (``kind``) a recurrent module's ``(output, state)`` tuple and its parts, an
    attention module's ``(output, weights)``, a tensor's shape or batch size."""

    steps: tuple[Chain, ...]
    kind: str = "tensor"
    module: nn.Module | None = None


_IDENTITIES = ("contiguous",)
_ADDS = (operator.add, torch.add, "add", operator.iadd)
_TRANSPOSES = ((1, 2), (2, 1), (-1, -2), (-2, -1), (1, -1), (-1, 1))


class _Reader:
    """Reads the traced graph of ``gm`` into one chain of steps."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.values: dict[fx.Node, _Value] = {}
        self.used: dict[str, fx.Node] = {}
        self.sequences: dict[fx.Node, tuple[Chain, ...]] = {}

    def tensor(self, node: Any, at: fx.Node) -> tuple[Chain, ...]:
        """The chain computing tensor ``node`` (the argument of node ``at``)."""
        if not isinstance(node, fx.Node) or node not in self.values:
            raise node_error(at, f"reads {node!r}, which is not a tensor computed from the input")
        v = self.values[node]
        if v.kind == "sequences":  # every step (one RecurrentOutput for all uses)
            if node not in self.sequences:
                step = _Step(f"{node.name} (its output)", RecurrentOutput(True))
                self.sequences[node] = v.steps + (step,)
            return self.sequences[node]
        if v.kind != "tensor":
            raise node_error(
                at, f"reads {node.name!r}, which is {_KIND_NAMES[v.kind]}, not a tensor"
            )
        return v.steps

    def read(self) -> tuple[Chain, ...]:
        out: tuple[Chain, ...] | None = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if node.users and self.values:
                    raise node_error(node, "a second input; sparknet models read one tensor")
                if node.users:
                    self.values[node] = _Value(())
            elif node.op == "get_attr":
                raise node_error(
                    node,
                    f"reads {node.target!r} directly (a parameter or buffer used outside its "
                    f"module, e.g. x @ self.weight or x + self.pos); sparknet reads modules: "
                    f"put it in a module such as nn.Linear",
                )
            elif node.op == "call_module":
                self.values[node] = self.module(node)
            elif node.op in ("call_function", "call_method"):
                self.values[node] = self.function(node)
            elif node.op == "output":
                out = self.tensor(node.args[0], node)
        assert out is not None
        return out

    def module(self, node: fx.Node) -> _Value:
        m = self.gm.get_submodule(str(node.target))
        name = str(node.target)
        if any(True for _ in m.parameters(recurse=True)):
            if name in self.used:
                raise node_error(
                    node,
                    f"calls {name!r} a second time (first at "
                    f"{self.used[name].name!r}); sparknet layers do not "
                    f"share weights",
                )
            self.used[name] = node
        step = _Step(name, m)
        if isinstance(m, nn.MultiheadAttention):
            args = list(node.args) + [
                node.kwargs.get(k) for k in ("query", "key", "value") if k in node.kwargs
            ]
            if len(args) != 3 or len({id(a) for a in args}) != 1:
                raise node_error(
                    node,
                    "attention with different queries, keys and values; "
                    "sparknet's MultiHeadAttention is self-attention, "
                    "attn(x, x, x)",
                )
            if any(node.kwargs.get(k) is not None for k in ("key_padding_mask", "attn_mask")) or (
                node.kwargs.get("is_causal")
            ):
                raise node_error(
                    node,
                    "attention with a key_padding_mask, attn_mask or "
                    "is_causal, which sparknet cannot read from forward()",
                )
            return _Value(self.tensor(args[0], node) + (step,), "attention", m)
        if len(node.args) != 1 or node.kwargs:
            raise node_error(
                node,
                f"calls {name!r} with {len(node.args)} arguments and "
                f"{dict(node.kwargs)}; sparknet layers read one tensor",
            )
        if isinstance(m, RecurrentOutput) and isinstance(node.args[0], fx.Node):
            v = self.values.get(node.args[0])
            if v is not None and v.kind == "recurrent":
                return _Value(v.steps + (step,))
        if isinstance(m, nn.RNNBase):
            return _Value(self.tensor(node.args[0], node) + (step,), "recurrent", m)
        if type(m) not in GRAPH_CONVERTERS:
            raise node_error(
                node, f"module {name!r} ({type(m).__name__}) has no sparknet equivalent"
            )
        return _Value(self.tensor(node.args[0], node) + (step,))

    def function(self, node: fx.Node) -> _Value:
        target, args = node.target, node.args
        if target is operator.getitem:
            return self.item(node)
        if target in _ADDS:
            return self.add(node)
        if target in (torch.cat, torch.concat, torch.concatenate):
            dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
            return self.join(node, list(args[0]), "concat", int(dim))
        if target in (operator.mul, torch.mul, "mul") and all(
            isinstance(a, fx.Node) and self.values.get(a, _Value(())).kind == "tensor"
            for a in args[:2]
        ):
            return self.join(node, list(args[:2]), "multiply")
        if target is getattr and args[1] == "shape":
            return _Value(self.tensor(args[0], node), "shape")
        if target == "size":
            return _Value(self.tensor(args[0], node), "batch" if args[1:] == (0,) else "shape")
        if target in _IDENTITIES:
            return _Value(self.tensor(args[0], node))
        if target in ("view", "reshape", torch.reshape):
            return self.view(node)
        if target in ("transpose", torch.transpose, "permute", torch.permute):
            dims = (
                tuple(args[1:])
                if target in ("transpose", torch.transpose)
                else tuple(args[1] if len(args) == 2 else args[1:])
            )
            if dims not in _TRANSPOSES + ((0, 2, 1), (0, -1, -2)):
                raise node_error(
                    node,
                    f"swaps axes {dims}; sparknet swaps only a sequence's "
                    f"steps and channels, x.transpose(1, 2)",
                )
            return _Value(self.tensor(args[0], node) + (_Step(node.name, Transpose()),))
        if target in (F.log_softmax, torch.log_softmax, "log_softmax"):
            raise node_error(
                node,
                "sparknet has no log-softmax output: its classifiers end "
                "in softmax (the same predicted classes, and what its "
                "cross-entropy reads); end forward() with "
                "F.softmax(x, dim=1) or with the logits",
            )
        made = function_module(target, node)
        if made is None:
            raise node_error(node, f"{function_name(target)} has no sparknet equivalent")
        if any(isinstance(a, fx.Node) for a in list(args[1:]) + list(node.kwargs.values())):
            raise node_error(
                node, "a setting computed from a tensor; sparknet's settings are fixed numbers"
            )
        return _Value(self.tensor(args[0], node) + (_Step(node.name, made),))

    def view(self, node: fx.Node) -> _Value:
        args = node.args
        sizes = list(args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:])
        if len(sizes) == 2 and isinstance(sizes[1], int):
            lead = sizes[0]
            batch = (
                isinstance(lead, fx.Node) and getattr(self.values.get(lead), "kind", "") == "batch"
            )
            if batch or (lead == -1 and sizes[1] != -1):
                size = None if sizes[1] == -1 else sizes[1]
                return _Value(self.tensor(args[0], node) + (_Step(node.name, View(size)),))
        raise node_error(
            node,
            "a reshape other than to one row per sample; sparknet reshapes "
            "with x.view(x.size(0), -1) (a flatten)",
        )

    def item(self, node: fx.Node) -> _Value:
        base, index = node.args
        v = self.values.get(base) if isinstance(base, fx.Node) else None
        kind = "none" if v is None else v.kind
        if v is not None:
            rnn = v.module
            if kind == "recurrent" and index in (0, 1):
                nxt = "sequences" if index == 0 else ("hc" if isinstance(rnn, nn.LSTM) else "state")
                return _Value(v.steps, nxt, rnn)
            if (kind, index) == ("hc", 0):
                return _Value(v.steps, "state", rnn)
            if (kind, index) == ("attention", 0):
                return _Value(v.steps)
            if (kind, index) == ("shape", 0):
                return _Value(v.steps, "batch")
            last = (slice(None), -1), (slice(None), -1, slice(None))
            if (kind == "sequences" and index in last) or (kind, index) == ("state", -1):
                assert isinstance(rnn, nn.RNNBase)
                if rnn.bidirectional:
                    raise node_error(
                        node,
                        f"the last step of a bidirectional {type(rnn).__name__}, which is "
                        f"not both directions' final state; pass the module's output "
                        f"through sparknet.interop.RecurrentOutput() instead",
                    )
                return _Value(
                    v.steps + (_Step(f"{node.name} (its last step)", RecurrentOutput(False)),)
                )
        raise node_error(
            node,
            f"indexes {_KIND_NAMES.get(kind, 'a tensor')} with {index!r}; "
            f"sparknet reads an RNN's output (out, _ = rnn(x)), its last "
            f"step (out[:, -1] or h[-1]) and attention's output "
            f"(attn(x, x, x)[0])",
        )

    def add(self, node: fx.Node) -> _Value:
        if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
            raise node_error(node, "an add of other than two tensors")
        a, b = (self.tensor(x, node) for x in node.args)
        common = shared_start([a, b])
        body, shortcut = a[common:], b[common:]
        if len(shortcut) > len(body):  # the block's layers are the longer branch
            body, shortcut = shortcut, body
        if not body:
            raise node_error(
                node,
                "adds a tensor to itself; sparknet's Residual adds a block's "
                "input (or shortcut) to the output of its layers",
            )
        return _Value(a[:common] + (_Skip(node.name, body, shortcut),))

    def join(self, node: fx.Node, tensors: list[Any], merge: str, dim: int = -1) -> _Value:
        """Branches from the point where the tensors' chains part, merged."""
        chains = [self.tensor(t, node) for t in tensors]
        common = shared_start(chains)
        branches = tuple(c[common:] for c in chains)
        return _Value(chains[0][:common] + (_Merge(node.name, branches, merge, dim),))


_KIND_NAMES = {
    "recurrent": "a recurrent module's (output, state) tuple",
    "sequences": "a recurrent module's output",
    "hc": "an LSTM's (h, c) state",
    "state": "a recurrent module's final state",
    "attention": "an attention module's (output, weights) tuple",
    "shape": "a tensor's shape",
    "batch": "a batch size",
    "none": "a value not computed from the input",
}


def _flat(chain: tuple[Chain, ...]) -> list[tuple[int | str, nn.Module]]:
    out: list[tuple[int | str, nn.Module]] = []
    for s in chain:
        if isinstance(s, _Skip):
            out += _flat(s.body) + _flat(s.shortcut)
        elif isinstance(s, _Merge):
            out += [m for branch in s.branches for m in _flat(branch)]
        else:
            out.append((s.name, s.module))
    return out


def _join(s: _Merge, w: Walk) -> None:
    """``s``'s branches as a ``Parallel`` layer: ``torch.cat`` on the channel axis (the last
    of sparknet's layout), or a product of tensors of one shape."""
    walks = [Walk(w.shape, w.channels_first) for _ in s.branches]
    for branch, v in zip(s.branches, walks):
        _convert(branch, v)
    shapes = [v.shape for v in walks]
    first = walks[0].channels_first
    channel = 0 if first else len(shapes[0]) - 1
    same = {
        tuple(d for a, d in enumerate(sh) if a != channel or s.merge != "concat") for sh in shapes
    }
    ok = len(same) == 1 and all(v.channels_first == first and v.perm is None for v in walks)
    if s.merge == "concat":
        ok = ok and (s.dim % (1 + len(shapes[0]))) - 1 == channel
    if not ok:
        what = f"torch.cat on dim {s.dim}" if s.merge == "concat" else "a product"
        raise ValueError(
            f"at {s.name!r}: {what} of {shapes}; sparknet joins "
            f"branches on the channel (feature) axis, or multiplies tensors of one shape"
        )
    w.add(Parallel([v.layers for v in walks], merge=s.merge))
    for v in walks:
        w.setters += v.setters
    shape = list(shapes[0])
    if s.merge == "concat":
        shape[channel] = sum(sh[channel] for sh in shapes)
    w.shape, w.channels_first = tuple(shape), first


def _convert(chain: tuple[Chain, ...], w: Walk) -> None:
    for s in chain:
        if isinstance(s, _Step):
            GRAPH_CONVERTERS[type(s.module)](s.name, s.module, w)
            continue
        if isinstance(s, _Merge):
            _join(s, w)
            continue
        body, short = Walk(w.shape, w.channels_first), Walk(w.shape, w.channels_first)
        _convert(s.body, body)
        _convert(s.shortcut, short)
        ends = [(v.shape, v.channels_first, v.perm is None) for v in (body, short)]
        if ends[0] != ends[1] or body.perm is not None:
            raise ValueError(
                f"at {s.name!r}: adds {short.shape} to "
                f"{body.shape}; sparknet's Residual adds tensors of one shape"
            )
        w.add(Residual(body.layers, shortcut=short.layers or None))
        w.setters += body.setters + short.setters
        w.shape, w.channels_first = body.shape, body.channels_first


def is_own_forward(module: Any) -> bool:
    """Whether ``module`` is read by tracing: a module with its own ``forward()``, or an
    ``nn.Sequential`` holding one (or another ``nn.Sequential``)."""
    if not isinstance(module, nn.Module) or type(module) in GRAPH_CONVERTERS:
        return False
    if isinstance(module, nn.Sequential):
        return any(isinstance(m, nn.Sequential) or is_own_forward(m) for m in module)
    return not type(module).__module__.startswith("torch.nn.")


def from_graph(module: nn.Module, input_shape: Any = None, dtype: Any = None) -> Sequential:
    """A sparknet model computing what ``module`` computes (in eval mode), read from the
    ``torch.fx`` trace of its ``forward()``; the arguments are
    :func:`~sparknet.interop._from_torch.from_torch`'s.

    Raises:
        ValueError: ``forward()`` could not be traced, or does something sparknet cannot
            express (naming the node of the graph and the module or function).
    """
    try:
        gm = fx.symbolic_trace(module)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is the user's forward()
        raise ValueError(
            f"from_torch could not trace {type(module).__name__}.forward() with torch.fx "
            f"({type(exc).__name__}: {exc}); a forward() that branches or loops on tensor "
            f"values cannot be traced: write it without, or as an nn.Sequential"
        ) from exc
    gm.graph.eliminate_dead_code()
    try:
        chain = _Reader(gm).read()
    except Refused as exc:
        raise ValueError(f"from_torch: {type(module).__name__}.forward(), {exc}") from None
    named = _flat(chain)
    first = next((m for _, m in named if not isinstance(m, (nn.Dropout, nn.Identity))), None)
    if input_shape is None:
        input_shape = input_shape_of(named, first, SPATIAL)
    shape = tuple(int(d) for d in input_shape)
    channels_first = isinstance(first, SPATIAL)
    walk = Walk(shape, channels_first)
    try:
        _convert(chain, walk)
        return build_model(walk, shape, channels_first, module, dtype)
    except ValueError as exc:  # a module's settings or shapes: said with where in forward()
        raise ValueError(f"from_torch: {type(module).__name__}.forward(), {exc}") from None

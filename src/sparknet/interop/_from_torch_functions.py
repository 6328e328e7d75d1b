"""The tensor functions of a traced ``forward()`` as the modules they stand for, and the
converters of those modules and of ``nn.MultiheadAttention`` (for
:mod:`sparknet.interop._from_torch_graph`).

``F.relu(x)`` is ``nn.ReLU()``, ``F.max_pool2d(x, 2)`` is ``nn.MaxPool2d(2)``; what has no
``torch.nn`` module is a module of this file: ``x.view(x.size(0), -1)`` (:class:`View`),
``x.transpose(1, 2)`` (:class:`Transpose`), ``x.mean(dim)`` (:class:`Mean`),
``x.squeeze(-1)`` (:class:`Squeeze`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from sparknet.interop._from_torch_messages import where
from sparknet.interop._from_torch_modules import CONVERTERS, Walk, numpy_of
from sparknet.layers import GlobalAveragePooling1D, GlobalAveragePooling2D, MultiHeadAttention

__all__ = [
    "GRAPH_CONVERTERS",
    "Refused",
    "View",
    "Transpose",
    "function_module",
    "function_name",
    "node_error",
]


# -- the modules of tensor functions that torch.nn has none for --------------------------------
class View(nn.Module):
    """``x.view(N, -1)``, ``x.reshape(-1, size)``: a flatten, when ``size`` (if given) is the
    size of a sample."""

    def __init__(self, size: int | None) -> None:
        super().__init__()
        self.size = size


class Transpose(nn.Module):
    """``x.transpose(1, 2)`` of ``(N, A, B)``: torch's ``(N, T, C)`` <-> ``(N, C, T)``."""


class Mean(nn.Module):
    """``x.mean(dim)`` over the steps or the pixels: a global average pool."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.dims = dims


class Squeeze(nn.Module):
    """``x.squeeze(-1)`` of a global pool's ``(N, C, 1)``: its ``(N, C)``."""


def _view(i: int | str, m: View, w: Walk) -> None:
    size = int(np.prod(w.shape))
    if m.size is not None and m.size != size:
        raise ValueError(
            f"at {i!r}: reshapes samples of {size} values {w.shape} to rows of {m.size}, "
            f"which changes the batch; sparknet reshapes a sample to one row: x.view(x.size(0), -1)"
        )
    CONVERTERS[nn.Flatten](i, nn.Flatten(), w)


def _transpose(i: int | str, m: Transpose, w: Walk) -> None:
    if len(w.shape) != 2:
        raise ValueError(
            f"at {i!r}: swaps two axes of {w.shape}; sparknet swaps only a sequence's "
            f"steps and channels, (N, T, C) <-> (N, C, T)"
        )
    w.shape, w.channels_first = (w.shape[1], w.shape[0]), not w.channels_first


def _mean(i: int | str, m: Mean, w: Walk) -> None:
    n = len(w.shape)
    dims = sorted(d % (n + 1) for d in m.dims)
    if w.channels_first and n in (2, 3) and dims == list(range(2, n + 1)):
        w.add(GlobalAveragePooling1D() if n == 2 else GlobalAveragePooling2D())
    elif not w.channels_first and n == 2 and dims == [1]:
        w.add(GlobalAveragePooling1D())
    else:
        raise ValueError(
            f"at {i!r}: the mean over dims {m.dims} of {w.shape}; sparknet averages the "
            f"steps of a sequence (N, T, C) or the positions of a channels-first tensor"
        )
    w.shape, w.channels_first, w.pooled = (
        (w.shape[0],) if w.channels_first else w.shape[1:],
        False,
        False,
    )


def _squeeze(i: int | str, m: Squeeze, w: Walk) -> None:
    if not w.pooled:
        raise ValueError(
            f"at {i!r}: squeezes {w.shape}; sparknet squeezes only a global pool's "
            f"(N, C, 1, ...) to (N, C)"
        )
    w.shape, w.channels_first, w.pooled = (w.shape[0],), False, False


def _attention(i: int | str, m: nn.MultiheadAttention, w: Walk) -> None:
    if not m.batch_first or not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
        raise ValueError(
            f"{where(i, m)}: needs batch_first=True, one embed_dim for queries, keys and values, "
            f"and no add_bias_kv or add_zero_attn (sparknet's MultiHeadAttention)"
        )
    if len(w.shape) != 2 or w.channels_first:
        raise ValueError(f"{where(i, m)} needs sequences (N, T, D), got {w.shape}")
    bias = m.in_proj_bias is not None
    layer = MultiHeadAttention(m.num_heads, dropout=m.dropout, use_bias=bias)

    def setter() -> None:
        layer.params["in_proj_weight"][...] = numpy_of(m.in_proj_weight)
        layer.params["out_proj_weight"][...] = numpy_of(m.out_proj.weight)
        if bias:
            layer.params["in_proj_bias"][...] = numpy_of(m.in_proj_bias)
            layer.params["out_proj_bias"][...] = numpy_of(m.out_proj.bias)

    w.add(layer, setter)


GRAPH_CONVERTERS: dict[type[nn.Module], Callable[[int | str, Any, Walk], None]] = {
    **CONVERTERS,
    View: _view,
    Transpose: _transpose,
    Mean: _mean,
    Squeeze: _squeeze,
    nn.MultiheadAttention: _attention,
}


class Refused(ValueError):
    pass


def node_error(node: fx.Node, what: str) -> Refused:
    return Refused(f"at {node.name!r}: {what}")


def function_name(target: Any) -> str:
    """How a message names a traced function or tensor method."""
    if isinstance(target, str):
        return f"Tensor.{target}()"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    return f"torch.{name}" if module.startswith("torch") else f"{module}.{name}"


def function_module(target: Any, node: fx.Node) -> nn.Module | None:
    """The module a tensor function of one tensor stands for, or None."""
    a, kw = node.args, node.kwargs

    def arg(k: int, name: str, default: Any) -> Any:
        return a[k] if len(a) > k else kw.get(name, default)

    if target in (F.relu, torch.relu, "relu"):
        return nn.ReLU()
    if target in (torch.tanh, F.tanh, "tanh"):
        return nn.Tanh()
    if target in (torch.sigmoid, F.sigmoid, "sigmoid"):
        return nn.Sigmoid()
    if target in (F.silu,):
        return nn.SiLU()
    if target in (F.gelu,):
        return nn.GELU(approximate=arg(1, "approximate", "none"))
    if target in (F.leaky_relu,):
        return nn.LeakyReLU(arg(1, "negative_slope", 0.01))
    if target in (F.softmax, torch.softmax, "softmax"):
        return nn.Softmax(dim=arg(1, "dim", None))
    if target in (F.dropout,):
        return nn.Dropout(arg(1, "p", 0.5))
    if target in (torch.flatten, "flatten"):
        return nn.Flatten(arg(1, "start_dim", 0), arg(2, "end_dim", -1))
    if target in (F.max_pool1d, F.max_pool2d, F.avg_pool1d, F.avg_pool2d):
        kind = {
            F.max_pool1d: nn.MaxPool1d,
            F.max_pool2d: nn.MaxPool2d,
            F.avg_pool1d: nn.AvgPool1d,
            F.avg_pool2d: nn.AvgPool2d,
        }[target]
        names = ["kernel_size", "stride", "padding"]
        given = {n: arg(k + 1, n, None) for k, n in enumerate(names)}
        extra = {k: v for k, v in kw.items() if k not in names}
        return kind(**{k: v for k, v in given.items() if v is not None}, **extra)
    if target in (
        F.adaptive_avg_pool1d,
        F.adaptive_avg_pool2d,
        F.adaptive_max_pool1d,
        F.adaptive_max_pool2d,
    ):
        kind = {
            F.adaptive_avg_pool1d: nn.AdaptiveAvgPool1d,
            F.adaptive_avg_pool2d: nn.AdaptiveAvgPool2d,
            F.adaptive_max_pool1d: nn.AdaptiveMaxPool1d,
            F.adaptive_max_pool2d: nn.AdaptiveMaxPool2d,
        }[target]
        return kind(arg(1, "output_size", None))
    if target is F.pad and arg(2, "mode", "constant") == "constant":
        pads = tuple(arg(1, "pad", ()))
        kind = {2: nn.ConstantPad1d, 4: nn.ConstantPad2d}.get(len(pads))
        if kind is None:
            raise node_error(node, f"F.pad of {len(pads) // 2} axes; sparknet pads 1 or 2")
        return kind(pads, arg(3, "value", 0.0) or 0.0)
    if target in (torch.mean, "mean"):
        dims = arg(1, "dim", None)
        if dims is None or arg(2, "keepdim", False):
            raise node_error(
                node,
                "a mean over every axis, or keepdim=True: sparknet "
                "averages the steps or positions of each sample",
            )
        return Mean(tuple(dims) if isinstance(dims, (tuple, list)) else (int(dims),))
    if target == "squeeze":
        return Squeeze()
    return None

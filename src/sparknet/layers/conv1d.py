"""1-D convolution and pooling over sequences: :class:`Conv1D`, :class:`MaxPool1D`,
:class:`AvgPool1D`.

Sequences are **channels-last**: a batch is ``(N, T, C)`` (samples, steps, channels),
the layout of the recurrent layers; PyTorch's ``nn.Conv1d`` takes ``(N, C, T)``, which
converts with ``x.transpose(0, 2, 1)``.  Each layer runs the 2-D kernels of
:mod:`sparknet._conv` and :mod:`sparknet._pool` on the view ``(N, 1, T, C)`` of its
input, a one-row image with a one-row window: the 2-D kernels then perform exactly the
arithmetic of a 1-D convolution or pooling, with no copy of the input.

Padding follows :mod:`sparknet.layers.conv`: ``"valid"`` uses none (``(T - dilation *
(k - 1) - 1) // stride + 1`` output steps); ``"same"`` gives ``ceil(T / stride)`` steps
and pads with zeros, half before and the rest (one more, for an odd total) after.  With
stride 1 this is PyTorch's ``padding="same"``.

Masks: these layers mix neighbouring steps or change the number of steps, so an ``(N, T)``
sequence mask does not carry over to their output; a mask reaching them raises
``ValueError``.  :class:`~sparknet.layers.GlobalMaxPooling1D` and
:class:`~sparknet.layers.GlobalAveragePooling1D` take masks.
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np

import sparknet._conv as _conv
import sparknet._pool as _pool
from sparknet import initializers
from sparknet._validation import check_bool, positive_int
from sparknet.activations import FusedActivation
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, ParamSpec, register
from sparknet.layers.conv import (
    Padding,
    axis_paddings,
    check_padding,
    check_pool_padding,
    check_window,
    out_and_pad,
    padding_config,
    writable,
)

#: a window size, stride or dilation: an int, or a sequence of one int
IntOne = Union[int, "tuple[int]", "list[int]"]


def _single(value: IntOne, what: str) -> int:
    """An int >= 1, or a sequence of one such int, as an int."""
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{what} must be a positive integer (or a sequence of one), "
                             f"got {value!r}")
        value = value[0]
    return positive_int(value, what)


def _sequence_shape(layer: Layer, input_shape: tuple[int, ...]) -> tuple[int, int]:
    if len(input_shape) != 2:
        raise InputRankError(
            f"{type(layer).__name__} {layer.name!r} needs sequences of per-sample shape (T, C) "
            f"(steps, channels last), got per-sample shape {tuple(input_shape)} (rank "
            f"{len(input_shape)}); give a one-channel series a channel axis, e.g. "
            f"X.reshape(-1, T, 1)", layout="sequences (T, C)", rank=2, got=input_shape)
    T, C = input_shape
    return T, C


def _check_batch(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Validate a forward input against the built shape; return it as the C-contiguous
    ``(N, 1, T, C)`` view the 2-D kernels take."""
    T, C = layer._shapes()[0]
    x = np.asarray(x)
    what = f"{type(layer).__name__} {layer.name!r}"
    if x.ndim != 3:
        raise ValueError(f"{what} expects a batch of sequences (N, T, C) = (N, {T}, {C}), "
                         f"got an array of rank {x.ndim} with shape {x.shape}")
    if x.shape[2] != C:
        hint = ""
        if x.shape[1] == C:
            hint = ("; the input looks channels-first (N, C, T): convert it with "
                    "x.transpose(0, 2, 1)")
        raise ValueError(f"{what} expects {C} channels on the last axis (channels-last "
                         f"(N, T, C)), got {x.shape[2]} (input shape {x.shape}){hint}")
    if x.shape[1] != T:
        raise ValueError(f"{what} was built for sequences of {T} steps, got {x.shape[1]} "
                         f"(input shape {x.shape})")
    x = np.ascontiguousarray(x, dtype=layer.dtype)
    return x.reshape(x.shape[0], 1, T, C)


def _no_mask(layer: Layer, mask: np.ndarray | None) -> None:
    if mask is not None:
        raise ValueError(
            f"{type(layer).__name__} {layer.name!r} does not support masking, but an (N, T) "
            f"sequence mask reached it (from Embedding(mask_zero=True), SequenceMask or "
            f"mask=...): its output steps mix or drop input steps, so the mask would no longer "
            f"describe them.  Pass no mask (pad with zeros), or put the layer before anything "
            f"that makes a mask")


@register
class Conv1D(FusedActivation, Layer):
    """1-D convolution (cross-correlation, as ``torch.nn.Conv1d``) over steps, channels-last.

    ``y[n, t, f] = act(b[f] + sum over (p, c) of kernel[p, c, f] *
    x[n, t * stride + p * dilation - pad, c])``, with ``x`` zero outside the sequence
    (``pad``: the leading padding).

    Args:
        filters: number of output channels.
        kernel_size: window length, an int (or a sequence of one int).
        strides: step between windows.
        padding: ``"valid"`` (no padding), ``"same"`` (output ``ceil(T / stride)``
            steps; PyTorch's ``padding="same"`` for stride 1), or an int ``p``: ``p`` zeros
            on both sides (PyTorch's ``padding=p``).
        dilation: spacing between kernel taps.
        activation: ``"identity"`` (default), ``"relu"``, ``"tanh"``, ``"sigmoid"`` or
            ``"softmax"`` (over channels, per step); fused into the kernel.
        use_bias: add one bias per filter.
        kernel_initializer: ``"auto"`` (He for relu, Glorot otherwise, with fans
            ``k * in_channels`` and ``k * filters``) or a name from
            :mod:`sparknet.initializers`.
        name: layer name.

    Input shape: ``(N, T, C)``.  Output shape: ``(N, T', filters)``.

    Parameters: ``kernel`` of shape ``(k, C, filters)`` (PyTorch's ``weight`` is
    ``kernel.transpose(2, 1, 0)``), ``bias`` of shape ``(filters,)``.

    Raises:
        ValueError: on bad constructor arguments; at build time for a per-sample shape
            that is not ``(T, C)`` or a kernel extent longer than the padded input; in
            :meth:`forward` for a batch of the wrong rank, channel count or length; when
            a sequence mask reaches the layer.
    """

    def __init__(self, filters: int, kernel_size: IntOne, strides: IntOne = 1,
                 padding: Padding | int = "valid", dilation: IntOne = 1,
                 activation: str | None = None,
                 use_bias: bool = True, kernel_initializer: str = "auto",
                 name: str | None = None) -> None:
        super().__init__(name)
        self.filters = positive_int(filters, "Conv1D filters")
        self.kernel_size = _single(kernel_size, "Conv1D kernel_size")
        self.strides = _single(strides, "Conv1D strides")
        self.padding = check_padding(padding, "Conv1D", axes=1)
        self.dilation = _single(dilation, "Conv1D dilation")
        self._set_activation(activation)
        self.use_bias = check_bool(use_bias, "Conv1D use_bias")
        if kernel_initializer != "auto":
            initializers.check_name(kernel_initializer)
        self.kernel_initializer = kernel_initializer

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        T, C = _sequence_shape(self, input_shape)
        k, d = self.kernel_size, self.dilation
        extent = d * (k - 1) + 1
        check_window(self, f"kernel extent {extent} (kernel_size {k}, dilation {d})", (T,),
                     (extent,), self.padding)
        self.in_channels = int(C)
        out, self._pad = out_and_pad(T, extent, self.strides, axis_paddings(self.padding, 1)[0])
        return (out, self.filters)

    def param_specs(self) -> list[ParamSpec]:
        specs: list[ParamSpec] = [("kernel", (self.kernel_size, self.in_channels, self.filters))]
        if self.use_bias:
            specs.append(("bias", (self.filters,)))
        return specs

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        init = self.kernel_initializer
        if init == "auto":
            init = "he_uniform" if self.activation == "relu" else "glorot_uniform"
        k = self.kernel_size
        initializers.fill(params["kernel"], init, k * self.in_channels, k * self.filters, rng)
        if self.use_bias:
            params["bias"][...] = 0

    def _geometry(self) -> dict[str, int]:
        """The 2-D kernels' geometry for the one-row view: no vertical stride or padding."""
        return dict(sh=1, sw=self.strides, ph=0, pw=self._pad, dh=1, dw=self.dilation)

    def _kernel4(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """``kernel`` (k, C, F) as the (1, k, C, F) view the 2-D kernels take."""
        return arrays["kernel"].reshape((1,) + arrays["kernel"].shape)

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x4 = _check_batch(self, x)
        T_out, F = self._shapes()[1]
        y4 = np.empty((x4.shape[0], 1, T_out, F), dtype=self.dtype)
        _conv.forward(x4, self._kernel4(self.params), self.params.get("bias"), y4,
                      act=self._kernel_act, **self._geometry())
        self._x4, self._y4 = x4, y4
        return y4.reshape(x4.shape[0], T_out, F)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = writable(dy, self.dtype)
        N, _, T_out, F = self._y4.shape
        if d.shape != (N, T_out, F):
            raise ValueError(f"Conv1D {self.name!r}: gradient has shape {d.shape}, "
                             f"the output was {(N, T_out, F)}")
        # the model's first layer is told to skip its input gradient during training
        dx4 = np.empty_like(self._x4) if self.need_input_grad else None
        _conv.backward(self._x4, self._kernel4(self.params), self._y4, d.reshape(self._y4.shape),
                       dx4, self._kernel4(self.grads), self.grads.get("bias"),
                       act=self._kernel_act, **self._geometry())
        return None if dx4 is None else dx4.reshape(N, dx4.shape[2], dx4.shape[3])

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        _no_mask(self, mask)
        return None

    def get_config(self) -> dict[str, Any]:
        return {"filters": self.filters, "kernel_size": self.kernel_size,
                "strides": self.strides, "padding": padding_config(self.padding),
                "dilation": self.dilation,
                "activation": self.activation, "use_bias": self.use_bias,
                "kernel_initializer": self.kernel_initializer, "name": self.name}


class _Pool1D(Layer):
    """Shared construction and shape logic of the 1-D pooling layers."""

    def __init__(self, pool_size: IntOne = 2, strides: IntOne | None = None,
                 padding: Padding | int = "valid", name: str | None = None) -> None:
        super().__init__(name)
        kind = type(self).__name__
        self.pool_size = _single(pool_size, f"{kind} pool_size")
        self.strides = self.pool_size if strides is None else _single(strides, f"{kind} strides")
        self.padding = check_padding(padding, kind, axes=1)
        check_pool_padding(self.padding, (self.pool_size,), kind)
        self._n = 0

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        T, C = _sequence_shape(self, input_shape)
        kind = type(self).__name__
        check_window(self, f"pool_size {self.pool_size}", (T,), (self.pool_size,), self.padding)
        if T * C >= 2 ** 31:
            raise ValueError(f"{kind} {self.name!r}: sequences of {T}x{C} values are too "
                             f"large (the pooling kernels index a sample with int32)")
        out, self._pad = out_and_pad(T, self.pool_size, self.strides,
                                     axis_paddings(self.padding, 1)[0])
        return (out, C)

    def _geometry(self) -> dict[str, int]:
        """The 2-D kernels' geometry for the one-row view: a 1 x pool_size window."""
        return dict(PH=1, PW=self.pool_size, sh=1, sw=self.strides, pt=0, pl=self._pad)

    def _batch_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ``(N, 1, T, C)`` input and output views of the last forward batch."""
        (T, C), (T_out, _) = self._shapes()
        return (self._n, 1, T, C), (self._n, 1, T_out, C)

    def _grad_view(self, dy: np.ndarray) -> np.ndarray:
        d = np.ascontiguousarray(dy, dtype=self.dtype)
        out4 = self._batch_shapes()[1]
        if d.shape != (out4[0],) + out4[2:]:
            raise ValueError(f"{type(self).__name__} {self.name!r}: gradient has shape "
                             f"{d.shape}, the output was {(out4[0],) + out4[2:]}")
        return d.reshape(out4)

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        _no_mask(self, mask)
        return None

    def get_config(self) -> dict[str, Any]:
        return {"pool_size": self.pool_size, "strides": self.strides,
                "padding": padding_config(self.padding), "name": self.name}


@register
class MaxPool1D(_Pool1D):
    """Max pooling over ``pool_size`` steps, channels-last (as ``torch.nn.MaxPool1d``).

    Args:
        pool_size: window length.
        strides: step between windows (default: the pool size, non-overlapping).
        padding: ``"valid"``, ``"same"`` (``ceil(T / strides)`` output steps) or an int,
            at most half the window (zeros on both sides); padded
            taps never win.
        name: layer name.

    Tie rule: among equal maxima in a window the first (earliest step) wins and alone
    receives the gradient, as in PyTorch.

    Input shape: ``(N, T, C)``.  Output shape: ``(N, T', C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x4 = _check_batch(self, x)
        self._n = x4.shape[0]
        out4 = self._batch_shapes()[1]
        y4 = np.empty(out4, dtype=self.dtype)
        arg = np.empty(out4, dtype=np.int32)
        _pool.max_forward(x4, y4, arg, **self._geometry())
        self._arg = arg
        return y4.reshape(self._n, out4[2], out4[3])

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d4 = self._grad_view(dy)
        if not self.need_input_grad:
            return None
        in4 = self._batch_shapes()[0]
        dx4 = np.empty(in4, dtype=self.dtype)
        _pool.max_backward(d4, self._arg, dx4, **self._geometry())
        return dx4.reshape(self._n, in4[2], in4[3])


@register
class AvgPool1D(_Pool1D):
    """Mean pooling over ``pool_size`` steps, channels-last (as ``torch.nn.AvgPool1d``).

    Args:
        pool_size: window length.
        strides: step between windows (default: the pool size, non-overlapping).
        padding: ``"valid"``, ``"same"`` (``ceil(T / strides)`` output steps) or an int,
            at most half the window (zeros on both sides); a
            window's mean is taken over its taps inside the sequence (padding does not
            count: PyTorch's ``count_include_pad=False``).
        name: layer name.

    Input shape: ``(N, T, C)``.  Output shape: ``(N, T', C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x4 = _check_batch(self, x)
        self._n = x4.shape[0]
        out4 = self._batch_shapes()[1]
        y4 = np.empty(out4, dtype=self.dtype)
        _pool.avg_forward(x4, y4, **self._geometry())
        return y4.reshape(self._n, out4[2], out4[3])

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d4 = self._grad_view(dy)
        if not self.need_input_grad:
            return None
        in4 = self._batch_shapes()[0]
        dx4 = np.empty(in4, dtype=self.dtype)
        _pool.avg_backward(d4, dx4, **self._geometry())
        return dx4.reshape(self._n, in4[2], in4[3])

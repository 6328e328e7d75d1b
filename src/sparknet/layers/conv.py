"""Convolutional layers: :class:`Conv2D`, :class:`MaxPool2D`, :class:`AvgPool2D`.

Images are **channels-last**: a batch is ``(N, H, W, C)`` (height, width, channels),
one sample is ``(H, W, C)``.  Gray-scale images need their channel axis, e.g.
``X.reshape(-1, 28, 28, 1)``; channels-first ``(N, C, H, W)`` data converts with
``X.transpose(0, 2, 3, 1)``.  This layout makes a convolution one GEMM of the image
columns (im2col) with the kernel, and its output is again channels-last.

Padding follows the usual conventions: ``"valid"`` uses no padding (the output is
``(H - dilation * (k - 1) - 1) // stride + 1`` pixels high); ``"same"`` gives
``ceil(H / stride)`` pixels and pads with zeros, half before and the rest (one more,
for an odd total) after; an int ``p`` (or one per axis) puts ``p`` zeros on both sides, as
PyTorch's ``padding`` (``(H + 2 p - dilation * (k - 1) - 1) // stride + 1`` pixels).

The paper's CNN (conv 5x5x6, 2x2 mean pool, conv 5x5x12, 2x2 mean pool, conv 4x4x12,
dense softmax) on 28x28 gray-scale images, in a few lines::

    from sparknet import AvgPool2D, Conv2D, Dense, Flatten, Sequential

    paper_cnn = Sequential([
        Conv2D(6, 5, activation="relu"), AvgPool2D(2),
        Conv2D(12, 5, activation="relu"), AvgPool2D(2),
        Conv2D(12, 4, activation="relu"), Flatten(),
        Dense(10, activation="softmax"),
    ], input_shape=(28, 28, 1))

Its feature maps are 24x24x6, 12x12x6, 8x8x12, 4x4x12 and 1x1x12; it trains with
``paper_cnn.fit(X, y, ...)`` on ``X`` of shape ``(N, 28, 28, 1)``.
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np
from numpy.typing import DTypeLike

import sparknet._conv as _conv
import sparknet._pool as _pool
from sparknet import initializers, precision
from sparknet._validation import check_bool, positive_int
from sparknet.activations import FusedActivation
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, ParamSpec, register

PADDINGS = ("valid", "same")

#: a window size, stride or dilation: one int for both axes, or ``(height, width)``
IntPair = Union[int, "tuple[int, int]", "list[int]"]


def _pair(value: IntPair, what: str) -> tuple[int, int]:
    """An int or a pair of ints, each >= 1, as a tuple of two ints."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    msg = f"{what} must be a positive integer or a pair of positive integers, got {value!r}"
    if len(items) != 2:
        raise ValueError(msg)
    try:
        return positive_int(items[0], what), positive_int(items[1], what)
    except ValueError:
        raise ValueError(msg) from None


#: a layer's padding: ``"valid"``, ``"same"``, or zeros on both sides of each axis
Padding = Union[str, "tuple[int, ...]"]


def check_padding(value: Any, what: str, axes: int = 2) -> Padding:
    """``value`` as a layer of ``axes`` spatial axes keeps it: ``"valid"``/``"same"`` (any
    case) in lower case, or an int (or one per axis) >= 0 as a tuple; ``ValueError`` naming
    the layer kind ``what`` otherwise."""
    if isinstance(value, str) and value.lower() in PADDINGS:
        return value.lower()
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * axes
    if len(items) == axes and all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) and p >= 0
            for p in items):
        return tuple(int(p) for p in items)
    each = "an integer >= 0" if axes == 1 else f"an integer >= 0 or {axes} of them"
    raise ValueError(f"{what} padding must be 'valid', 'same' or {each} (zeros on both sides, "
                     f"as PyTorch's padding), got {value!r}")


def axis_paddings(padding: Padding, axes: int) -> list[str | int]:
    """The padding of each of ``axes`` axes: ``"valid"``, ``"same"`` or a number of zeros."""
    return [padding] * axes if isinstance(padding, str) else list(padding)


def padding_config(padding: Padding) -> str | list[int]:
    """``padding`` as a layer's config holds it (JSON)."""
    return padding if isinstance(padding, str) else list(padding)


def out_and_pad(size: int, extent: int, stride: int, padding: str | int) -> tuple[int, int]:
    """Output size and leading zero padding of one spatial axis (``padding``: ``"valid"``,
    ``"same"`` or the zeros on each side)."""
    if padding == "same":
        out = -(-size // stride)
        total = max((out - 1) * stride + extent - size, 0)
        return out, total // 2
    if isinstance(padding, int):
        return (size + 2 * padding - extent) // stride + 1, padding
    return (size - extent) // stride + 1, 0


def trailing_pad(size: int, extent: int, stride: int, padding: str | int) -> int:
    """The zeros after one spatial axis that its last window reads (ONNX's end ``pads``)."""
    out, lead = out_and_pad(size, extent, stride, padding)
    return max((out - 1) * stride + extent - size - lead, 0)


def check_window(layer: Layer, what: str, sizes: tuple[int, ...], extents: tuple[int, ...],
                 padding: Padding) -> None:
    """Refuse a window longer than the padded input, naming ``layer`` and ``what`` (e.g.
    ``"kernel extent 5x5 (kernel 5x5, dilation 1x1)"``)."""
    pads = axis_paddings(padding, len(sizes))
    padded = [s + (2 * p if isinstance(p, int) else (e - 1 if p == "same" else 0))
              for s, e, p in zip(sizes, extents, pads)]
    if any(e > s for e, s in zip(extents, padded)):
        shown = "x".join(str(s) for s in padded)
        raise ValueError(f"{type(layer).__name__} {layer.name!r}: {what} is larger than the "
                         f"padded input {shown} (padding {padding!r})")


def check_pool_padding(padding: Padding, pool_size: tuple[int, ...], kind: str) -> None:
    """A pool's explicit padding: at most half its window (every window keeps an input
    tap), as PyTorch requires."""
    if isinstance(padding, tuple) and any(2 * p > k for p, k in zip(padding, pool_size)):
        raise ValueError(f"{kind} padding {padding} must be at most half the pool window "
                         f"{pool_size}, so that every window holds an input value")


def _image_shape(layer: Layer, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise InputRankError(
            f"{type(layer).__name__} {layer.name!r} needs images of per-sample shape (H, W, C) "
            f"(channels last), got per-sample shape {tuple(input_shape)} (rank "
            f"{len(input_shape)}); give gray-scale images a channel axis, e.g. X.reshape(-1, H, W, "
            "1)", layout="images (H, W, C)", rank=3, got=input_shape)
    H, W, C = input_shape
    return H, W, C


def _check_batch(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Validate a forward input against the built shape; return it C-contiguous."""
    H, W, C = layer._shapes()[0]
    x = np.asarray(x)
    what = f"{type(layer).__name__} {layer.name!r}"
    if x.ndim != 4:
        raise ValueError(f"{what} expects a batch of images (N, H, W, C) = (N, {H}, {W}, {C}), "
                         f"got an array of rank {x.ndim} with shape {x.shape}")
    if x.shape[3] != C:
        hint = ""
        if x.shape[1] == C:
            hint = "; the input looks channels-first: convert it with x.transpose(0, 2, 3, 1)"
        raise ValueError(f"{what} expects {C} channels on the last axis (channels-last "
                         f"(N, H, W, C)), got {x.shape[3]} (input shape {x.shape}){hint}")
    if x.shape[1:3] != (H, W):
        raise ValueError(f"{what} was built for {H}x{W} images, got {x.shape[1]}x{x.shape[2]} "
                         f"(input shape {x.shape})")
    return np.ascontiguousarray(x, dtype=layer.dtype)


def writable(a: np.ndarray, dtype: DTypeLike) -> np.ndarray:
    """``a`` as a C-contiguous, writable array of ``dtype`` (a copy only when needed)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a if a.flags.writeable else a.copy()


@register
class Conv2D(FusedActivation, Layer):
    """2-D convolution (cross-correlation, as in every deep learning library), channels-last.

    ``y[n, i, j, f] = act(b[f] + sum over (p, q, c) of kernel[p, q, c, f] *
    x[n, i * sh + p * dh - pt, j * sw + q * dw - pl, c])``, with ``x`` zero outside the
    image (``pt``, ``pl``: the leading padding).

    Args:
        filters: number of output channels.
        kernel_size: window size, an int or ``(kh, kw)``.
        strides: step between windows, an int or ``(sh, sw)``.
        padding: ``"valid"`` (no padding), ``"same"`` (output ``ceil(H / stride)``), or the
            zeros on both sides of each axis, an int or ``(ph, pw)`` (PyTorch's ``padding``).
        dilation: spacing between kernel taps, an int or ``(dh, dw)``.
        activation: ``"identity"`` (default), ``"relu"``, ``"tanh"``, ``"sigmoid"`` or
            ``"softmax"`` (over channels, per pixel); fused into the kernel.
        use_bias: add one bias per filter.
        kernel_initializer: ``"auto"`` (He for relu, Glorot otherwise, with fans
            ``kh * kw * in_channels`` and ``kh * kw * filters``) or a name from
            :mod:`sparknet.initializers`.
        name: layer name.

    Input shape: ``(N, H, W, C)``.  Output shape: ``(N, OH, OW, filters)``.

    Parameters: ``kernel`` of shape ``(kh, kw, C, filters)``, ``bias`` of shape
    ``(filters,)``.

    Raises:
        ValueError: on bad constructor arguments; at build time for a per-sample shape
            that is not ``(H, W, C)`` or a kernel extent larger than the padded input;
            in :meth:`forward` for a batch of the wrong rank, channel count or size.
    """

    def __init__(self, filters: int, kernel_size: IntPair, strides: IntPair = 1,
                 padding: Padding | int = "valid", dilation: IntPair = 1,
                 activation: str | None = None,
                 use_bias: bool = True, kernel_initializer: str = "auto",
                 name: str | None = None) -> None:
        super().__init__(name)
        self.filters = positive_int(filters, "Conv2D filters")
        self.kernel_size = _pair(kernel_size, "Conv2D kernel_size")
        self.strides = _pair(strides, "Conv2D strides")
        self.padding = check_padding(padding, "Conv2D")
        self.dilation = _pair(dilation, "Conv2D dilation")
        self._set_activation(activation)
        self.use_bias = check_bool(use_bias, "Conv2D use_bias")
        if kernel_initializer != "auto":
            initializers.check_name(kernel_initializer)
        self.kernel_initializer = kernel_initializer

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        H, W, C = _image_shape(self, input_shape)
        (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.strides, self.dilation
        eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
        check_window(self, f"kernel extent {eh}x{ew} (kernel {kh}x{kw}, dilation {dh}x{dw})",
                     (H, W), (eh, ew), self.padding)
        self.in_channels = int(C)
        pad_h, pad_w = axis_paddings(self.padding, 2)
        oh, self._pt = out_and_pad(H, eh, sh, pad_h)
        ow, self._pl = out_and_pad(W, ew, sw, pad_w)
        return (oh, ow, self.filters)

    def param_specs(self) -> list[ParamSpec]:
        kh, kw = self.kernel_size
        specs: list[ParamSpec] = [("kernel", (kh, kw, self.in_channels, self.filters))]
        if self.use_bias:
            specs.append(("bias", (self.filters,)))
        return specs

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        init = self.kernel_initializer
        if init == "auto":
            init = "he_uniform" if self.activation == "relu" else "glorot_uniform"
        kh, kw = self.kernel_size
        initializers.fill(params["kernel"], init, kh * kw * self.in_channels,
                          kh * kw * self.filters, rng)
        if self.use_bias:
            params["bias"][...] = 0

    def _geometry(self) -> dict[str, int]:
        return dict(sh=self.strides[0], sw=self.strides[1], ph=self._pt, pw=self._pl,
                    dh=self.dilation[0], dw=self.dilation[1])

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x = _check_batch(self, x)
        y = np.empty((x.shape[0],) + self._shapes()[1], dtype=self.dtype)
        # bfloat16 products (inside fit(precision="bf16")): the kernel packed once per step
        self._bf16 = precision.active() and self.dtype == np.float32
        w16 = precision.packed(self, "kernel", self._kernel_matrix(), False) if self._bf16 else None
        _conv.forward(x, self.params["kernel"], self.params.get("bias"), y,
                      act=self._kernel_act, w16=w16, **self._geometry())
        self._x, self._y = x, y
        return y

    def _kernel_matrix(self) -> np.ndarray:
        """The kernel as the (kh * kw * C, filters) matrix of the im2col products."""
        return self.params["kernel"].reshape(-1, self.filters)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = writable(dy, self.dtype)
        if d.shape != self._y.shape:
            raise ValueError(f"Conv2D {self.name!r}: gradient has shape {d.shape}, "
                             f"the output was {self._y.shape}")
        # the model's first layer is told to skip its input gradient during training
        dx = np.empty_like(self._x) if self.need_input_grad else None
        wt16 = (precision.packed(self, "kernel.T", self._kernel_matrix(), True)
                if self._bf16 and dx is not None else None)
        _conv.backward(self._x, self.params["kernel"], self._y, d, dx, self.grads["kernel"],
                       self.grads.get("bias"), act=self._kernel_act, bf16=self._bf16, wt16=wt16,
                       **self._geometry())
        return dx

    def get_config(self) -> dict[str, Any]:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": padding_config(self.padding),
                "dilation": list(self.dilation), "activation": self.activation,
                "use_bias": self.use_bias, "kernel_initializer": self.kernel_initializer,
                "name": self.name}


class _Pool2D(Layer):
    """Shared construction and shape logic of the pooling layers."""

    def __init__(self, pool_size: IntPair = 2, strides: IntPair | None = None,
                 padding: Padding | int = "valid", name: str | None = None) -> None:
        super().__init__(name)
        kind = type(self).__name__
        self.pool_size = _pair(pool_size, f"{kind} pool_size")
        self.strides = self.pool_size if strides is None else _pair(strides, f"{kind} strides")
        self.padding = check_padding(padding, kind)
        check_pool_padding(self.padding, self.pool_size, kind)
        self._n = 0

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        H, W, C = _image_shape(self, input_shape)
        (ph, pw), (sh, sw) = self.pool_size, self.strides
        check_window(self, f"pool window {ph}x{pw}", (H, W), (ph, pw), self.padding)
        if H * W * C >= 2 ** 31:
            raise ValueError(f"{type(self).__name__} {self.name!r}: images of {H}x{W}x{C} values "
                             f"are too large (the pooling kernels index a sample with int32)")
        pad_h, pad_w = axis_paddings(self.padding, 2)
        oh, self._pt = out_and_pad(H, ph, sh, pad_h)
        ow, self._pl = out_and_pad(W, pw, sw, pad_w)
        return (oh, ow, C)

    def _geometry(self) -> dict[str, int]:
        return dict(sh=self.strides[0], sw=self.strides[1], pt=self._pt, pl=self._pl)

    def _batch_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The input and output shape of the last forward batch (``self._n`` samples)."""
        in_shape, out_shape = self._shapes()
        return (self._n,) + in_shape, (self._n,) + out_shape

    def get_config(self) -> dict[str, Any]:
        return {"pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": padding_config(self.padding), "name": self.name}


@register
class MaxPool2D(_Pool2D):
    """Max pooling over ``pool_size`` windows, channels-last.

    Args:
        pool_size: window size, an int or ``(ph, pw)``.
        strides: step between windows (default: the pool size, non-overlapping).
            Smaller strides give overlapping windows.
        padding: ``"valid"``, ``"same"``, or the taps outside the image on both sides of
            each axis, an int or a pair, at most half the window; padded taps never win.
        name: layer name.

    Tie rule: the window is scanned in row-major order and only a strictly greater
    value replaces the running maximum, so among equal maxima the **first in row-major
    window order** is the winner, and it alone receives the gradient.

    Input shape: ``(N, H, W, C)``.  Output shape: ``(N, OH, OW, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x = _check_batch(self, x)
        self._n = x.shape[0]
        out_shape = self._batch_shapes()[1]
        y = np.empty(out_shape, dtype=self.dtype)
        arg = np.empty(out_shape, dtype=np.int32)
        _pool.max_forward(x, y, arg, self.pool_size[0], self.pool_size[1], **self._geometry())
        self._arg = arg
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = np.ascontiguousarray(dy, dtype=self.dtype)
        if d.shape != self._arg.shape:
            raise ValueError(f"MaxPool2D {self.name!r}: gradient has shape {d.shape}, "
                             f"the output was {self._arg.shape}")
        if not self.need_input_grad:
            return None
        dx = np.empty(self._batch_shapes()[0], dtype=self.dtype)
        _pool.max_backward(d, self._arg, dx, self.pool_size[0], self.pool_size[1],
                           **self._geometry())
        return dx


@register
class AvgPool2D(_Pool2D):
    """Mean pooling over ``pool_size`` windows, channels-last (the paper's pooling).

    Args:
        pool_size: window size, an int or ``(ph, pw)``.
        strides: step between windows (default: the pool size, non-overlapping).
        padding: ``"valid"``, ``"same"``, or an int or a pair, at most half the window
            (PyTorch's ``padding`` with ``count_include_pad=False``); a window's mean is
            taken over its taps inside the image (padding does not count).
        name: layer name.

    Input shape: ``(N, H, W, C)``.  Output shape: ``(N, OH, OW, C)``.
    """

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        x = _check_batch(self, x)
        self._n = x.shape[0]
        y = np.empty(self._batch_shapes()[1], dtype=self.dtype)
        _pool.avg_forward(x, y, self.pool_size[0], self.pool_size[1], **self._geometry())
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        d = np.ascontiguousarray(dy, dtype=self.dtype)
        in_shape, out_shape = self._batch_shapes()
        if d.shape != out_shape:
            raise ValueError(f"AvgPool2D {self.name!r}: gradient has shape {d.shape}, "
                             f"the output was {out_shape}")
        if not self.need_input_grad:
            return None
        dx = np.empty(in_shape, dtype=self.dtype)
        _pool.avg_backward(d, dx, self.pool_size[0], self.pool_size[1], **self._geometry())
        return dx

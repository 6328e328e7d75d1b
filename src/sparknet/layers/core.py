"""Core layers: Dense, Activation, LeakyReLU, Dropout, Flatten."""
from __future__ import annotations

from typing import Any

import numpy as np

import sparknet._activations as _activations
import sparknet._dense as _dense
from sparknet import initializers, precision
from sparknet._validation import check_bool, check_float, positive_int
from sparknet.activations import FusedActivation
from sparknet.layers.base import Layer, ParamSpec, register


@register
class Dense(FusedActivation, Layer):
    """Fully connected layer: ``y = activation(x @ W.T + b)``.

    Applies to the last axis, so a ``(N, T, F)`` sequence gets the same dense map at
    every time step (a time-distributed dense layer).

    Args:
        units: number of output neurons.
        activation: ``"identity"`` (default), ``"relu"``, ``"tanh"``, ``"sigmoid"``,
            ``"softmax"``, ``"gelu"`` or ``"gelu_tanh"`` (``torch.nn.functional.gelu`` with
            ``approximate="none"`` / ``"tanh"``), ``"silu"`` (``z * sigmoid(z)``, also
            ``"swish"``). A softmax on the model's last layer is
            fused with the cross-entropy loss (the loss then reads logits).
        use_bias: add a bias vector.
        kernel_initializer: ``"auto"`` (He for relu, Glorot otherwise) or an
            initializer name from :mod:`sparknet.initializers`.
        name: layer name.

    Input shape: ``(N, ..., in_features)``.  Output shape: ``(N, ..., units)``.

    Parameters: ``kernel`` of shape ``(units, in_features)`` (as ``torch.nn.Linear``),
    ``bias`` of shape ``(units,)``.
    """

    fuses_input_activations = True

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True,
                 kernel_initializer: str = "auto", name: str | None = None) -> None:
        super().__init__(name)
        self.units = positive_int(units, "Dense units")
        self._set_activation(activation)
        self.use_bias = check_bool(use_bias, "Dense use_bias")
        if kernel_initializer != "auto":
            initializers.check_name(kernel_initializer)
        self.kernel_initializer = kernel_initializer

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) < 1 or input_shape[-1] <= 0:
            raise ValueError(f"Dense {self.name!r} needs inputs with a last axis of positive size, "
                             f"got per-sample shape {input_shape}")
        self.in_features = int(input_shape[-1])
        return tuple(input_shape[:-1]) + (self.units,)

    def param_specs(self) -> list[ParamSpec]:
        specs: list[ParamSpec] = [("kernel", (self.units, self.in_features))]
        if self.use_bias:
            specs.append(("bias", (self.units,)))
        return specs

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        init = self.kernel_initializer
        if init == "auto":
            init = "he_uniform" if self.activation == "relu" else "glorot_uniform"
        initializers.fill(params["kernel"], init, self.in_features, self.units, rng)
        if self.use_bias:
            params["bias"][...] = 0

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        self._check_built()
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, self.in_features), dtype=self.dtype)
        y = np.empty((x2.shape[0], self.units), dtype=self.dtype)
        self._z = np.empty_like(y) if self._keeps_input else None
        # bfloat16 products (inside fit(precision="bf16")): W.T packed once per step
        self._bf16 = precision.active() and self.dtype == np.float32
        wt16 = (precision.packed(self, "kernel.T", self.params["kernel"], True) if self._bf16
                else None)
        _dense.forward(x2, self.params["kernel"], self.params.get("bias"), y, self._kernel_act,
                       self._z, wt16)
        self._x, self._y = x2, y
        return y.reshape(lead + (self.units,))

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        lead = dy.shape[:-1]
        d = np.ascontiguousarray(dy.reshape(-1, self.units), dtype=self.dtype)
        if not d.flags.writeable:
            d = d.copy()
        dx = np.empty_like(self._x) if self.need_input_grad else None
        w16 = (precision.packed(self, "kernel", self.params["kernel"], False)
               if self._bf16 and dx is not None else None)
        _dense.backward(self._x, self.params["kernel"], self._y, d, dx, self.grads["kernel"],
                        self.grads.get("bias"), self._kernel_act, self._z, self._bf16, w16)
        return None if dx is None else dx.reshape(lead + (self.in_features,))

    def get_config(self) -> dict[str, Any]:
        return {"units": self.units, "activation": self.activation, "use_bias": self.use_bias,
                "kernel_initializer": self.kernel_initializer, "name": self.name}


@register
class Activation(FusedActivation, Layer):
    """Elementwise activation layer (softmax acts on the last axis).

    Args:
        activation: ``"identity"``, ``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"softmax"``,
            ``"gelu"``, ``"gelu_tanh"`` or ``"silu"`` (``"swish"``).  For leaky ReLU, the
            layer :class:`LeakyReLU`.
    """

    fuses_input_activations = True

    def __init__(self, activation: str, name: str | None = None) -> None:
        super().__init__(name)
        self._set_activation(activation)

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        y = np.array(x, dtype=self.dtype, order="C", copy=True)
        self._z = y.copy() if self._keeps_input else None
        if y.size and self._kernel_act:
            _activations.forward(self._kernel_act, y.reshape(-1, y.shape[-1]))
        self._y = y
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        d = np.array(dy, dtype=self.dtype, order="C", copy=True)
        if d.size and self._z is not None:
            _activations.backward_input(self._kernel_act, self._z.reshape(-1, d.shape[-1]),
                                        d.reshape(-1, d.shape[-1]))
        elif d.size and self._kernel_act:
            _activations.backward(self._kernel_act, self._y.reshape(-1, d.shape[-1]),
                                  d.reshape(-1, d.shape[-1]))
        return d

    def get_config(self) -> dict[str, Any]:
        return {"activation": self.activation, "name": self.name}


@register
class LeakyReLU(Layer):
    """Leaky ReLU: ``y = x`` where ``x > 0``, else ``negative_slope * x`` (PyTorch's
    ``nn.LeakyReLU``, Keras's ``layers.LeakyReLU``); elementwise, any input shape.

    Args:
        negative_slope: the slope for negative inputs, in ``[0, 1]``; default 0.01 as
            PyTorch (Keras's layer defaults to 0.3: pass it).
        name: layer name.
    """

    def __init__(self, negative_slope: float = 0.01, name: str | None = None) -> None:
        super().__init__(name)
        self.negative_slope = check_float(negative_slope, "LeakyReLU negative_slope", 0.0, 1.0)

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        y = np.array(x, dtype=self.dtype, order="C", copy=True)
        if y.size:
            _activations.leaky_relu_forward(y.reshape(y.shape[0], -1), self.negative_slope)
        self._y = y
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        d = np.array(dy, dtype=self.dtype, order="C", copy=True)
        if d.size:
            _activations.leaky_relu_backward(self._y.reshape(d.shape[0], -1),
                                             d.reshape(d.shape[0], -1), self.negative_slope)
        return d

    def get_config(self) -> dict[str, Any]:
        return {"negative_slope": self.negative_slope, "name": self.name}


@register
class Dropout(Layer):
    """Inverted dropout: in training, zero each input with probability ``rate`` and
    scale the rest by ``1 / (1 - rate)``; the identity at inference.

    Args:
        rate: drop probability in ``[0, 1)``.
    """

    def __init__(self, rate: float, name: str | None = None) -> None:
        super().__init__(name)
        self.rate = check_float(rate, "Dropout rate", 0.0, 1.0, high_open=True)
        self._mask: np.ndarray | None = None

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        if not training or self.rate == 0.0:
            self._mask = None
            return x
        keep = 1.0 - self.rate
        self._mask = (self.rng.random(x.shape, dtype=np.float64) < keep).astype(self.dtype)
        self._mask *= self.dtype.type(1.0 / keep)
        return x * self._mask

    def backward(self, dy: np.ndarray) -> np.ndarray:
        if self._mask is None:
            return dy
        return dy * self._mask

    def get_config(self) -> dict[str, Any]:
        return {"rate": self.rate, "name": self.name}


@register
class Flatten(Layer):
    """Flatten each sample to one axis: ``(N, d1, d2, ...)`` -> ``(N, d1 * d2 * ...)``."""

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (int(np.prod(input_shape)),)

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return dy.reshape(self._shape)

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return None

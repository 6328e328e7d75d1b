"""Activation names, their kernel ids, and the Python entry points over the Cython kernels."""
from __future__ import annotations

import numpy as np

import sparknet._activations as _activations

#: kernel ids, shared with ``_activations.pxd``
IDS = {"identity": 0, "linear": 0, None: 0, "relu": 1, "tanh": 2, "sigmoid": 3, "softmax": 4}
CANONICAL = {0: "identity", 1: "relu", 2: "tanh", 3: "sigmoid", 4: "softmax"}


def activation_id(name: str | None) -> int:
    """Kernel id of an activation name (``None`` and ``"linear"`` mean identity)."""
    key = name.lower() if isinstance(name, str) else name
    if not (key is None or isinstance(key, str)) or key not in IDS:
        raise ValueError(
            f"unknown activation {name!r}; choose one of: identity, relu, tanh, sigmoid, softmax")
    return IDS[key]


def canonical_name(name: str | None) -> str:
    """The one name of an activation (``None`` and ``"linear"`` become ``"identity"``)."""
    return CANONICAL[activation_id(name)]


class FusedActivation:
    """Mixin of a layer whose kernel applies its activation (``Dense``, ``Conv2D``,
    ``Activation``).  When such a layer ends the model in a softmax that the loss takes
    over, :class:`~sparknet.model.Sequential` sets :attr:`emit_logits` and the kernel then
    applies the identity instead."""

    activation: str
    #: set by Sequential when a trailing softmax is fused into the loss
    emit_logits: bool

    def _set_activation(self, activation: str | None) -> None:
        self.activation = canonical_name(activation)
        self._act = activation_id(activation)
        self.emit_logits = False

    @property
    def _kernel_act(self) -> int:
        """The activation id the kernel applies: identity when the loss owns the softmax."""
        return 0 if (self.emit_logits and self.activation == "softmax") else self._act


def _as_2d(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def apply(name: str | None, z: np.ndarray) -> np.ndarray:
    """Return ``f(z)`` (a new C-contiguous array); softmax acts on the last axis."""
    out = np.array(z, copy=True, order="C")
    if out.size:
        _activations.forward(activation_id(name), _as_2d(out))
    return out


def grad(name: str | None, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Return ``dy * f'(z)`` given the forward output ``y = f(z)`` (new array)."""
    out = np.array(dy, copy=True, order="C")
    if out.size:
        _activations.backward(activation_id(name), _as_2d(np.ascontiguousarray(y)), _as_2d(out))
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis."""
    return apply("softmax", z)

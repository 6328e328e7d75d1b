"""Activation names, their kernel ids, and the Python entry points over the Cython kernels.

Most activations' derivatives are written through their output ``y``, so a layer keeps only
its output.  The gelus and silu (:data:`INPUT_ACTIVATIONS`) are not invertible: their
derivative needs the pre-activation ``z``, which only the layers that keep it
(:class:`FusedActivation` subclasses with ``fuses_input_activations``: ``Dense`` and
``Activation``) can offer.
"""
from __future__ import annotations

from typing import ClassVar, TypeGuard

import numpy as np

import sparknet._activations as _activations

#: kernel ids, shared with ``_activations.pxd``
IDS = {"identity": 0, "linear": 0, None: 0, "relu": 1, "tanh": 2, "sigmoid": 3, "softmax": 4,
       "gelu": 5, "gelu_tanh": 6, "silu": 7, "swish": 7}
CANONICAL = {0: "identity", 1: "relu", 2: "tanh", 3: "sigmoid", 4: "softmax", 5: "gelu",
             6: "gelu_tanh", 7: "silu"}
#: activations whose derivative is written through their input ``z`` (GELU, exact and the
#: tanh form of ``torch.nn.functional.gelu(approximate="tanh")``; SiLU, ``z * sigmoid(z)``,
#: also called swish)
INPUT_ACTIVATIONS = frozenset({"gelu", "gelu_tanh", "silu"})


def _lookup(name: str | None) -> int:
    key = name.lower() if isinstance(name, str) else name
    if not (key is None or isinstance(key, str)) or key not in IDS:
        hint = (" (leaky ReLU is a layer of its own: LeakyReLU(negative_slope))"
                if isinstance(key, str) and key.replace("_", "") == "leakyrelu" else "")
        raise ValueError(f"unknown activation {name!r}; choose one of: identity, relu, tanh, "
                         f"sigmoid, softmax, gelu, gelu_tanh, silu{hint}")
    return IDS[key]


def activation_id(name: str | None, from_input: bool = False) -> int:
    """Kernel id of an activation name (``None`` and ``"linear"`` mean identity).

    The gelus and silu need their input ``z`` for the derivative; a caller that keeps it passes
    ``from_input=True``, any other caller gets a ``ValueError`` for them."""
    act = _lookup(name)
    if not from_input and CANONICAL[act] in INPUT_ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not available here: its derivative needs the "
                         f"pre-activation values, which only Dense and Activation keep; use an "
                         f"Activation({CANONICAL[act]!r}) layer")
    return act


def canonical_name(name: str | None) -> str:
    """The one name of an activation (``None`` and ``"linear"`` become ``"identity"``)."""
    return CANONICAL[_lookup(name)]


class FusedActivation:
    """Mixin of a layer whose kernel applies its activation (``Dense``, ``Conv2D``,
    ``Activation``).  When such a layer ends the model in a softmax that the loss takes
    over, :class:`~sparknet.model.Sequential` sets :attr:`emit_logits` and the kernel then
    applies the identity instead."""

    activation: str
    #: set by Sequential when a trailing softmax is fused into the loss
    emit_logits: bool
    #: True for the layers that keep the pre-activation for
    #: :data:`~sparknet.activations.INPUT_ACTIVATIONS`
    fuses_input_activations: ClassVar[bool] = False

    def _set_activation(self, activation: str | None) -> None:
        name = canonical_name(activation)
        if name in INPUT_ACTIVATIONS and not self.fuses_input_activations:
            raise ValueError(f"{type(self).__name__} activation {activation!r} is not available: "
                             f"its derivative needs the pre-activation values; use activation=None "
                             f"and an Activation({name!r}) layer after it")
        self.activation = name
        self._act = activation_id(activation, from_input=True)
        self.emit_logits = False

    @property
    def _keeps_input(self) -> bool:
        """True when the layer must keep the pre-activation for its backward (the gelus, silu)."""
        return self.activation in INPUT_ACTIVATIONS

    @property
    def _kernel_act(self) -> int:
        """The activation id the kernel applies: identity when the loss owns the softmax."""
        return 0 if (self.emit_logits and self.activation == "softmax") else self._act


def is_softmax_head(layer: object) -> TypeGuard[FusedActivation]:
    """Whether ``layer``, ending a model, is a softmax whose kernel the loss can take over (the
    layer then emits logits: :attr:`FusedActivation.emit_logits`)."""
    return isinstance(layer, FusedActivation) and layer.activation == "softmax"


def _as_2d(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def apply(name: str | None, z: np.ndarray) -> np.ndarray:
    """Return ``f(z)`` (a new C-contiguous array); softmax acts on the last axis."""
    out = np.array(z, copy=True, order="C")
    if out.size:
        _activations.forward(activation_id(name, from_input=True), _as_2d(out))
    return out


def grad(name: str | None, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Return ``dy * f'(z)`` given the forward output ``y = f(z)`` (new array); the gelus and
    silu take :func:`grad_from_input`."""
    if canonical_name(name) in INPUT_ACTIVATIONS:
        raise ValueError(f"the derivative of {name!r} needs its input z, not its output: call "
                         f"grad_from_input({name!r}, z, dy)")
    out = np.array(dy, copy=True, order="C")
    if out.size:
        _activations.backward(activation_id(name), _as_2d(np.ascontiguousarray(y)), _as_2d(out))
    return out


def grad_from_input(name: str, z: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Return ``dy * f'(z)`` given the forward input ``z`` (new array), for the
    :data:`INPUT_ACTIVATIONS`."""
    act = activation_id(name, from_input=True)
    if CANONICAL[act] not in INPUT_ACTIVATIONS:
        raise ValueError(f"grad_from_input takes one of {sorted(INPUT_ACTIVATIONS)}, got {name!r}; "
                         f"use grad(name, y, dy) for the others")
    out = np.array(dy, copy=True, order="C")
    if out.size:
        _activations.backward_input(act, _as_2d(np.ascontiguousarray(z, dtype=out.dtype)),
                                    _as_2d(out))
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis."""
    return apply("softmax", z)

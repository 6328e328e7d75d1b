"""Normalisation layers: :class:`LayerNormalization`, :class:`RMSNormalization` (LLaMA's:
no mean subtracted, no shift) and :class:`BatchNormalization`.

Both normalise the **last axis** (features, or channels of channels-last images) and
learn a per-feature scale ``gamma`` and shift ``beta``::

    y = (x - mean) / sqrt(var + eps) * gamma + beta

They differ in what ``mean`` and ``var`` (the biased variance) are taken over:

- :class:`LayerNormalization`: each sample's (each position's) own features, so a sample's
  output does not depend on the rest of the batch and training and inference are the same
  computation (``torch.nn.LayerNorm(F)``);
- :class:`BatchNormalization`: each feature over the batch (and over time steps or pixels),
  in training; it keeps running averages of these statistics, which inference uses instead
  (``torch.nn.BatchNorm1d`` / ``BatchNorm2d`` on channels-last data).

The maths lives in :mod:`sparknet._norm` as functions taking every buffer explicitly
(``layer_norm_forward``, ``layer_norm_backward``, ``batch_norm_forward``,
``batch_norm_backward``), so that composite layers reuse it without a layer object.

Parameter names follow Keras (``gamma``, ``beta``); PyTorch calls them ``weight`` and
``bias`` and keeps the same shapes, ``(F,)``.  BatchNormalization's running statistics are
model *state* (``model.state``), saved with the model, not trained.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import sparknet._norm as _norm
from sparknet._validation import check_bool, check_float
from sparknet.layers.base import Layer, ParamSpec, register


def _rows(x: np.ndarray, features: int, dtype: np.dtype, what: str) -> np.ndarray:
    """``x`` as a C-contiguous ``(M, features)`` array of ``dtype`` (a copy when needed)."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] != features:
        raise ValueError(f"{what} expects a batch (N, ..., {features}) with {features} features on "
                         f"the last axis, got an array of shape {x.shape}")
    return np.ascontiguousarray(x.reshape(-1, features), dtype=dtype)


def _writable_rows(dy: np.ndarray, features: int, dtype: np.dtype) -> np.ndarray:
    d = np.ascontiguousarray(dy.reshape(-1, features), dtype=dtype)
    return d if d.flags.writeable else d.copy()


class _FeatureNorm(Layer):
    """What both layers share: ``eps``, ``center``, ``scale``, the features axis, the
    ``gamma`` / ``beta`` parameters."""

    def __init__(self, eps: float, center: bool, scale: bool, name: str | None) -> None:
        super().__init__(name)
        kind = type(self).__name__
        self.eps = check_float(eps, f"{kind} eps", 0.0, low_open=True)
        self.center = check_bool(center, f"{kind} center")
        self.scale = check_bool(scale, f"{kind} scale")

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) < 1 or input_shape[-1] <= 0:
            raise ValueError(f"{type(self).__name__} {self.name!r} needs inputs with a last axis "
                             f"of positive size (the features), got per-sample shape {input_shape}")
        self.features = int(input_shape[-1])
        return input_shape

    def param_specs(self) -> list[ParamSpec]:
        specs: list[ParamSpec] = []
        if self.scale:
            specs.append(("gamma", (self.features,)))
        if self.center:
            specs.append(("beta", (self.features,)))
        return specs

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        if self.scale:
            params["gamma"][...] = 1
        if self.center:
            params["beta"][...] = 0

    def _what(self) -> str:
        return f"{type(self).__name__} {self.name!r}"


@register
class LayerNormalization(_FeatureNorm):
    """Layer normalisation over the last axis, as ``torch.nn.LayerNorm(F, eps)``.

    Each position's ``F`` features are normalised by their own mean and (biased) variance,
    then scaled by ``gamma`` and shifted by ``beta``; the same in training and inference.

    Args:
        eps: added to the variance before the square root; positive.
        center: learn the shift ``beta`` (else ``beta = 0``).
        scale: learn the scale ``gamma`` (else ``gamma = 1``); ``center=scale=False`` is
            ``torch.nn.LayerNorm(F, elementwise_affine=False)``.
        name: layer name.

    Input shape: ``(N, ..., F)``.  Output shape: the same.

    Parameters: ``gamma`` (PyTorch's ``weight``) of shape ``(F,)``, initialised to 1;
    ``beta`` (PyTorch's ``bias``) of shape ``(F,)``, initialised to 0.

    Masks pass through: padded steps are normalised like the others and ignored downstream.
    """

    supports_masking = True
    #: root-mean-square normalisation (:class:`RMSNormalization`): no mean subtracted
    _rms = False

    def __init__(self, eps: float = 1e-5, center: bool = True, scale: bool = True,
                 name: str | None = None) -> None:
        super().__init__(eps, center, scale, name)

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        shape = np.shape(x)
        x2 = _rows(x, self.features, self.dtype, self._what())
        y = np.empty_like(x2)
        mean = np.empty(x2.shape[0], dtype=self.dtype)
        rstd = np.empty(x2.shape[0], dtype=self.dtype)
        _norm.layer_norm_forward(x2, self.params.get("gamma"), self.params.get("beta"), self.eps,
                                 y, mean, rstd, rms=self._rms)
        self._x, self._mean, self._rstd = x2, mean, rstd
        return y.reshape(shape)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        shape = dy.shape
        d = _writable_rows(dy, self.features, self.dtype)
        dx = d if self.need_input_grad else None  # the kernel may write dx over dy
        _norm.layer_norm_backward(d, self._x, self._mean, self._rstd, self.params.get("gamma"),
                                  dx, self.grads.get("gamma"), self.grads.get("beta"),
                                  rms=self._rms)
        return None if dx is None else dx.reshape(shape)

    def get_config(self) -> dict[str, Any]:
        return {"eps": self.eps, "center": self.center, "scale": self.scale, "name": self.name}


@register
class RMSNormalization(LayerNormalization):
    """Root-mean-square normalisation over the last axis, as ``torch.nn.RMSNorm(F, eps)`` and
    Keras' ``RMSNormalization``: each position's ``F`` features divided by their root mean
    square, then scaled by ``gamma``, ``y = x / sqrt(mean(x ** 2) + eps) * gamma``.  The
    normalisation of LLaMA-style Transformers: no mean subtracted, no shift.

    Args:
        eps: added to the mean square before the square root; positive (Keras' default).
        scale: learn the scale ``gamma`` (else ``gamma = 1``; PyTorch's
            ``elementwise_affine=False``).
        name: layer name.

    Input shape: ``(N, ..., F)``.  Output shape: the same.

    Parameters: ``gamma`` (PyTorch's ``weight``, Keras' ``scale``) of shape ``(F,)``,
    initialised to 1.  Masks pass through, as in :class:`LayerNormalization`.
    """

    _rms = True

    def __init__(self, eps: float = 1e-6, scale: bool = True, name: str | None = None) -> None:
        super().__init__(eps, center=False, scale=scale, name=name)

    def get_config(self) -> dict[str, Any]:
        return {"eps": self.eps, "scale": self.scale, "name": self.name}


@register
class BatchNormalization(_FeatureNorm):
    """Batch normalisation over the last axis (features or channels), as
    ``torch.nn.BatchNorm1d`` / ``BatchNorm2d`` on channels-last data.

    In training (``forward(x, training=True)``, as ``fit`` runs it), each feature is
    normalised by its mean and biased variance over every axis but the last (the batch,
    time steps, pixels), and the running statistics move towards the batch's, with the
    unbiased batch variance, as in PyTorch::

        running_mean = (1 - momentum) * running_mean + momentum * batch_mean
        running_var  = (1 - momentum) * running_var  + momentum * batch_var * n / (n - 1)

    In inference (``predict``, ``evaluate``), the running statistics normalise instead, so
    a sample's output does not depend on its batch.  Training needs at least two values per
    feature: with ``(N, F)`` input, choose a ``batch_size`` that leaves no batch of a single
    sample.

    Args:
        momentum: weight of the batch statistics in the running averages, in ``[0, 1]``
            (PyTorch's convention: Keras' ``momentum=0.99`` is ``momentum=0.01`` here).
        eps: added to the variance before the square root; positive.
        center: learn the shift ``beta`` (else ``beta = 0``).
        scale: learn the scale ``gamma`` (else ``gamma = 1``); ``center=scale=False`` is
            PyTorch's ``affine=False``.
        name: layer name.

    Input shape: ``(N, F)``, ``(N, T, F)``, ``(N, H, W, C)`` or any ``(N, ..., F)``.
    Output shape: the same.

    Parameters: ``gamma`` (PyTorch's ``weight``) of shape ``(F,)``, initialised to 1;
    ``beta`` (PyTorch's ``bias``) of shape ``(F,)``, initialised to 0.
    State (not trained, saved with the model): ``running_mean`` of shape ``(F,)``,
    initialised to 0, and ``running_var`` of shape ``(F,)``, initialised to 1.  PyTorch's
    ``num_batches_tracked`` is not kept (it only matters for ``momentum=None``).

    With an ``(N, T)`` mask (sequences), the statistics are taken over the real time steps
    only; padded steps are normalised with them and do not affect them.
    """

    supports_masking = True

    def __init__(self, momentum: float = 0.1, eps: float = 1e-5, center: bool = True,
                 scale: bool = True, name: str | None = None) -> None:
        super().__init__(eps, center, scale, name)
        self.momentum = check_float(momentum, "BatchNormalization momentum", 0.0, 1.0)

    def state_specs(self) -> list[ParamSpec]:
        return [("running_mean", (self.features,)), ("running_var", (self.features,))]

    def init_state(self, state: dict[str, np.ndarray]) -> None:
        state["running_mean"][...] = 0
        state["running_var"][...] = 1

    def _row_mask(self, mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
        """The ``(M,)`` uint8 mask of the rows of the 2-D view, from an ``(N, T)`` mask."""
        if mask is None:
            return None
        m = np.asarray(mask)
        lead = shape[:-1]
        if m.ndim > len(lead) or m.shape != lead[:m.ndim]:
            raise ValueError(f"{self._what()}: mask of shape {m.shape} does not match the "
                             f"leading axes of the input {shape}")
        m = m.reshape(m.shape + (1,) * (len(lead) - m.ndim))
        return np.ascontiguousarray(np.broadcast_to(m != 0, lead).reshape(-1)).view(np.uint8)

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        shape = np.shape(x)
        x2 = _rows(x, self.features, self.dtype, self._what())
        rows = self._row_mask(mask, shape)
        if training:
            n = x2.shape[0] if rows is None else int(np.count_nonzero(rows))
            if n < 2:
                raise ValueError(
                    f"{self._what()}: Expected more than 1 value per channel when training, got "
                    f"input shape {shape} ({n} value(s) per channel); train with batches of 2 or "
                    f"more samples (choose a batch_size that leaves no batch of one sample)")
        y = np.empty_like(x2)
        mean = np.empty(self.features, dtype=self.dtype)
        rstd = np.empty(self.features, dtype=self.dtype)
        _norm.batch_norm_forward(x2, self.params.get("gamma"), self.params.get("beta"),
                                 self.state["running_mean"], self.state["running_var"],
                                 self.momentum, self.eps, bool(training), y, mean, rstd, rows)
        self._x, self._mean, self._rstd = x2, mean, rstd
        self._training, self._rows = bool(training), rows
        return y.reshape(shape)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        shape = dy.shape
        d = _writable_rows(dy, self.features, self.dtype)
        dx = d if self.need_input_grad else None  # the kernel may write dx over dy
        _norm.batch_norm_backward(d, self._x, self._mean, self._rstd, self.params.get("gamma"),
                                  self._training, dx, self.grads.get("gamma"),
                                  self.grads.get("beta"), self._rows)
        return None if dx is None else dx.reshape(shape)

    def get_config(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "eps": self.eps, "center": self.center,
                "scale": self.scale, "name": self.name}

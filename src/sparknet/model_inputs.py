"""What a :class:`~sparknet.model.Sequential` takes, checked against the model before any work:
inputs, labels or targets, validation data and masks (for :meth:`~sparknet.model.Sequential.fit`,
``evaluate`` and ``predict``), and flat parameter and state vectors (``set_params``,
``set_state``).  Each check names what is wrong; the generic ones are in
:mod:`sparknet._validation`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet._validation import check_array, check_labels, check_mask, check_targets, refuse_spark

if TYPE_CHECKING:
    from sparknet.losses import Loss
    from sparknet.model import Sequential, ValidationData


def prepare_x(model: Sequential, X: Any, name: str = "X") -> np.ndarray:
    """``X`` as an array of the model's dtype (integer ids when its first layer takes them),
    checked against the model's input shape and by its first layer once built."""
    refuse_spark(X, name)
    first = model.layers[0] if model.layers else None
    allow_int = bool(first is not None and first.accepts_int_input)
    arr = check_array(X, name=name, sample_shape=model.input_shape if model.built else None,
                      dtype=model.dtype, allow_int=allow_int)
    if first is not None and model.built:
        first.check_input(arr)
    return arr


def prepare_y(model: Sequential, y: Any, n: int, loss: Loss, name: str = "y") -> np.ndarray:
    """``y`` for ``n`` samples of the built ``model``: class ids in range when ``loss`` takes
    them, else targets shaped like the output (with a hint when the output has one value per
    position and ``y`` one per sample)."""
    in_shape, out_shape = model._built_shapes()
    try:
        if loss.is_classification:
            return check_labels(y, n, out_shape[-1], name=name, lead_shape=out_shape[:-1])
        return check_targets(y, n, out_shape, model.dtype, name=name)
    except ValueError as exc:
        if len(out_shape) > 1 and np.ndim(y) == 1:
            raise ValueError(
                f"{exc}: the model gives an output of per-sample shape {out_shape} for inputs "
                f"of per-sample shape {in_shape} (Dense acts on the last axis, once per "
                f"position), while {name} has one value per sample; add Flatten() (or a global "
                f"pooling layer) before the first Dense to get one output per sample") from None
        raise


def prepare_validation(model: Sequential, validation_data: ValidationData | None, lo: Loss
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """``fit``'s ``validation_data`` as checked ``(X_val, y_val, mask_val or None)``."""
    if validation_data is None:
        return None
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise ValueError("validation_data must be (X_val, y_val) or (X_val, y_val, mask_val)")
    Xv = prepare_x(model, validation_data[0], name="X_val")
    yv = prepare_y(model, validation_data[1], Xv.shape[0], lo, name="y_val")
    mv = (check_mask(validation_data[2], Xv.shape, "mask_val") if len(validation_data) == 3
          else None)
    return Xv, yv, mv


def checked_input(model: Sequential, X: Any, mask: Any = None
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """``X`` and its ``mask`` for inference on the built ``model``."""
    if not model.built:
        raise RuntimeError("the model is not built yet: call fit() or build(input_shape) first")
    X = prepare_x(model, X)
    return X, check_mask(mask, X.shape)


def checked_params(model: Sequential, flat: Any) -> np.ndarray:
    """``flat`` as a parameter vector of ``model``: its shape, floats, every value finite."""
    flat = np.asarray(flat)
    if flat.shape != model.params.shape:
        raise ValueError(f"parameter vector has shape {flat.shape}, the model has "
                         f"{model.params.shape}")
    if flat.dtype.kind not in "fiu":
        raise ValueError(f"parameter vector has dtype {flat.dtype}, expected floats")
    bad = ~np.isfinite(flat)
    if bad.any():
        raise ValueError(f"parameter vector holds {int(bad.sum())} NaN or infinite value(s), "
                         f"first at index {int(np.argmax(bad))}; the model keeps its "
                         f"parameters")
    return flat


def checked_state(model: Sequential, flat: Any) -> np.ndarray:
    """``flat`` as a state vector of ``model`` (see :attr:`~sparknet.model.Sequential.state`):
    its shape, every value finite."""
    flat = np.asarray(flat)
    if flat.shape != model.state.shape:
        raise ValueError(f"state vector has shape {flat.shape}, the model keeps "
                         f"{model.state.shape}")
    if flat.size and not np.isfinite(flat).all():
        raise ValueError("state vector holds NaN or infinite values")
    return flat

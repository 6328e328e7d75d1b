"""``Bidirectional``: a recurrent layer run over each sequence in both directions.

How it works.  The wrapped layer is the forward direction; the backward direction is a
second layer of the same kind built from its config, with parameters of its own.  Both are
children of a ``Container`` (``sparknet.layers.container``; parameter names
``forward.weight_ih``, ``backward.weight_ih``, ...), so they sit in the model's one flat
parameter buffer.  The backward direction is the same recurrent kernel run on a batch whose
rows hold their valid steps in reverse order: with a mask, row ``n``'s valid steps
``p_0 < ... < p_{k-1}`` go to ``p_{k-1} ... p_0`` and each padded step stays where it is
(:mod:`sparknet._bidirectional`), so the mask of the reversed batch is the mask itself and
the backward direction starts at each sequence's last valid step, wherever the padding is.
One gather per call takes the inputs there; the outputs, output gradients and input
gradients come back through the same index array (the reversal is its own inverse), fused
with the merge and the split of the two directions.
"""
from __future__ import annotations

from typing import Any, Union, cast

import numpy as np

import sparknet._bidirectional as _bidirectional
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, layer_from_config, layer_to_config, register
from sparknet.layers.container import Container
from sparknet.layers.recurrent import GRU, LSTM, SimpleRNN

__all__ = ["Bidirectional"]

_MERGE_MODES = ("concat", "sum")
_RECURRENT = (SimpleRNN, LSTM, GRU)
#: the layers a Bidirectional wraps
Wrapped = Union[SimpleRNN, LSTM, GRU]


@register
class Bidirectional(Container):
    """A recurrent layer over each sequence forwards and backwards, equal to
    ``torch.nn.LSTM(..., bidirectional=True, batch_first=True)`` (likewise ``nn.RNN``,
    ``nn.GRU``) on a packed batch.

    The forward direction reads each sequence from its first valid step to its last, the
    backward direction from its last valid step to its first (padding, marked by the
    ``(N, T)`` mask, may be on the right, on the left, or anywhere: the valid steps of a row,
    in order, are its sequence).  With ``return_sequences=True`` step ``t`` of the output
    holds both directions' states after reading step ``t``; padded steps output zeros and
    the mask passes on.  With ``return_sequences=False`` the output holds the forward
    direction's state at the last valid step and the backward direction's after it read the
    first valid step (torch's ``h_n``).

    Args:
        layer: the forward direction, a :class:`~sparknet.layers.SimpleRNN`,
            :class:`~sparknet.layers.LSTM` or :class:`~sparknet.layers.GRU` (not stateful,
            no ``return_state``); the backward direction is a new layer built from its
            config.
        merge_mode: ``"concat"`` (forward features first, then backward, as torch) or
            ``"sum"``.
        name: layer name.

    Input shape: ``(N, T, F)`` (with an optional ``(N, T)`` mask).
    Output shape: ``(N, T, 2H)`` or ``(N, 2H)`` with ``"concat"``; ``(N, T, H)`` or
    ``(N, H)`` with ``"sum"`` (``H`` the wrapped layer's units).

    Parameters: the wrapped layer's under ``forward.`` and the backward direction's under
    ``backward.`` (torch's ``weight_ih_l0`` and ``weight_ih_l0_reverse``, ...).

    Raises:
        ValueError: for a layer that is not SimpleRNN, LSTM or GRU, a stateful one, an LSTM
            with ``return_state=True``, or an unknown ``merge_mode``.
    """

    supports_masking = True

    def __init__(self, layer: Layer, merge_mode: str = "concat", name: str | None = None) -> None:
        super().__init__(name)
        if not isinstance(layer, _RECURRENT):
            raise ValueError(f"Bidirectional layer must be a SimpleRNN, LSTM or GRU, got "
                             f"{type(layer).__name__} {getattr(layer, 'name', layer)!r}")
        kind = type(layer).__name__
        if layer.stateful:
            raise ValueError(f"Bidirectional layer: {kind} {layer.name!r} has stateful=True; a "
                             f"bidirectional layer reads each whole sequence both ways, so it "
                             f"cannot carry a state into the next batch (use stateful=False)")
        if getattr(layer, "return_state", False):
            raise ValueError(f"Bidirectional layer: {kind} {layer.name!r} has return_state=True, "
                             f"which Bidirectional does not support (use return_sequences=False "
                             f"for the last states of both directions)")
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"Bidirectional merge_mode must be 'concat' or 'sum', "
                             f"got {merge_mode!r}")
        self.merge_mode = merge_mode
        self.forward_layer: Wrapped = layer
        cfg = layer.get_config()
        cfg["name"] = f"backward_{layer.name}"
        self.backward_layer = cast(Wrapped, type(layer).from_config(cfg))
        self.children = {"forward": self.forward_layer, "backward": self.backward_layer}
        self.return_sequences = bool(layer.return_sequences)
        self._idx: np.ndarray | None = None
        self._mask: np.ndarray | None = None
        self._nt: tuple[int, int] | None = None

    # -- construction -------------------------------------------------------
    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 2:
            raise InputRankError(
                f"Bidirectional {self.name!r} takes sequences (N, T, features); got per-sample "
                f"shape {tuple(input_shape)} (add an Embedding for token ids, or reshape to "
                "(N, T, F))", layout="sequences (T, F)", rank=2, got=input_shape)
        out = self._build_child("forward", input_shape)
        self._build_child("backward", input_shape)
        if self.merge_mode == "concat":
            return out[:-1] + (2 * out[-1],)
        return out

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return self.forward_layer.compute_mask(mask)

    # -- computation --------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        fwd, bwd = self.forward_layer, self.backward_layer
        # the forward direction first: it checks the input and the mask
        y_f = fwd.forward(x, training=training, mask=mask)
        x = np.ascontiguousarray(x, dtype=self.dtype)
        idx = self._reversal(mask, x.shape[:2])
        x_rev = np.empty_like(x)
        _bidirectional.reverse_steps(x, idx, x_rev)
        y_b = bwd.forward(x_rev, training=training, mask=self._mask)
        self._idx, self._nt = idx, (int(x.shape[0]), int(x.shape[1]))
        concat = self.merge_mode == "concat"
        if self.return_sequences:
            N, T, H = y_f.shape
            out = np.empty((N, T, 2 * H if concat else H), dtype=self.dtype)
            _bidirectional.merge_sequences(y_f, y_b, idx, concat, out)
            return out
        # (y_f may be the state the forward direction keeps as its ``states``: not in place)
        return np.concatenate([y_f, y_b], axis=1) if concat else y_f + y_b

    def _reversal(self, mask: np.ndarray | None, NT: tuple[int, ...]) -> np.ndarray | None:
        """The ``(N, T)`` index array of the reversal (None without a mask, or when every step
        is valid: then it is ``T - 1 - t``); keeps the mask for the backward direction."""
        self._mask = None
        if mask is None:
            return None
        m = np.asarray(mask) != 0
        if m.all():
            return None
        self._mask = m
        idx = np.empty(NT, dtype=np.intp)
        _bidirectional.reversal_index(np.ascontiguousarray(m).view(np.uint8), idx)
        return idx

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if self._nt is None:
            raise RuntimeError(f"Bidirectional {self.name!r}: backward called before forward")
        fwd, bwd = self.forward_layer, self.backward_layer
        fwd.need_input_grad = bwd.need_input_grad = self.need_input_grad
        dy = np.ascontiguousarray(dy, dtype=self.dtype)
        H = fwd.units
        concat = self.merge_mode == "concat"
        N, T = self._nt
        want: tuple[int, ...] = (N, T) if self.return_sequences else (N,)
        want += (2 * H if concat else H,)
        if dy.shape != want:
            raise ValueError(f"Bidirectional {self.name!r}: output gradient has shape {dy.shape}, "
                             f"expected {want}")
        idx = self._idx
        if self.return_sequences:
            dy_b = np.empty(dy.shape[:2] + (H,), dtype=self.dtype)
            dy_f = np.empty_like(dy_b) if concat else None
            _bidirectional.split_sequence_grad(dy, idx, dy_f, dy_b)
            if dy_f is None:
                dy_f = dy
        elif concat:
            dy_f, dy_b = np.ascontiguousarray(dy[:, :H]), np.ascontiguousarray(dy[:, H:])
        else:
            dy_f, dy_b = dy, dy.copy()
        dx = fwd.backward(dy_f)
        dx_b = bwd.backward(dy_b)
        if dx is None or dx_b is None:
            return None
        _bidirectional.add_reversed(dx, dx_b, idx)
        return dx

    # -- (de)serialisation ----------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"layer": layer_to_config(self.forward_layer), "merge_mode": self.merge_mode,
                "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Bidirectional":
        cfg = dict(config)
        spec = cfg.pop("layer", None)
        layer = spec if isinstance(spec, Layer) else layer_from_config(spec, "Bidirectional layer")
        return cls(layer, **cfg)

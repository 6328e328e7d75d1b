"""Recurrent layers: SimpleRNN, LSTM and GRU (token ids reach them through
:class:`~sparknet.layers.embedding.Embedding`).

Sequences are batch-major, ``(N, T, features)``.  Variable-length sequences are padded
(see :func:`sparknet.data.pad_sequences`) and described by an ``(N, T)`` mask, where
``0`` marks a padded step.  At a masked step the recurrent layers carry their state
unchanged, output zeros (when ``return_sequences=True``), and add nothing to the loss
(:class:`~sparknet.model.Sequential` weights the loss by the final mask) or to any
gradient.  Padding may be on either side: with ``return_sequences=False`` the output is
the state at each sequence's last valid step.

The math runs in the nogil kernels of :mod:`sparknet._rnn`, :mod:`sparknet._lstm` and
:mod:`sparknet._gru` (their shared machinery in :mod:`sparknet._recurrent`): one gemm for the input
projection of every time step, one gemm on the batch per step for the recurrence, fused
gate nonlinearities, and backpropagation through time with one gemm for each weight
gradient over all steps.  Inside ``fit(precision="bf16")`` the LSTM's and GRU's products take
bfloat16 operands and accumulate in float32 (:mod:`sparknet.precision`).

Truncated backpropagation through time: with ``stateful=True`` the final state of one
call is the initial state of the next (no gradient flows into it), until
:meth:`reset_states`.  Row ``i`` of a batch continues row ``i`` of the previous batch, so
train with a fixed batch size and in order (``Sequential.fit(..., shuffle=False)``, and a
number of samples divisible by the batch size); :func:`sparknet.data.bptt_batches` lays
a token stream out that way.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

import sparknet._gru as _gru
import sparknet._lstm as _lstm
import sparknet._rnn as _rnn
from sparknet import initializers, precision, threads
from sparknet._validation import check_bool, positive_int
from sparknet.activations import activation_id, canonical_name
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, ParamSpec, register
from sparknet.layers.embedding import Embedding  # noqa: F401 - re-exported

__all__ = ["SimpleRNN", "LSTM", "GRU", "reset_states"]


# The per-step products of a recurrent layer are small (batch x 4H x H): a multi-threaded
# BLAS spends more on synchronisation than it gains there (with 2 threads on 2 busy cores a
# training step was measured 3x slower than with 1).  So every forward and backward runs
# with BLAS capped at sparknet.threads.get_num_threads() (one unless changed), also when
# called from a hand-written loop rather than fit/predict (sparknet.threads.capped).


def reset_states(model: Any) -> None:
    """Call ``reset_states()`` on every stateful layer of ``model`` (start of a new text)."""
    for layer in getattr(model, "layers", ()):
        if hasattr(layer, "reset_states"):
            layer.reset_states()


class _Recurrent(Layer):
    """Shared machinery of :class:`SimpleRNN`, :class:`LSTM` and :class:`GRU`."""

    supports_masking = True
    _gate_count = 1
    _n_states = 1

    def __init__(self, units: int, return_sequences: bool = False, stateful: bool = False,
                 kernel_initializer: str = "glorot_uniform",
                 recurrent_initializer: str = "orthogonal", name: str | None = None) -> None:
        super().__init__(name)
        self.units = positive_int(units, f"{type(self).__name__} units")
        kind = type(self).__name__
        self.return_sequences = check_bool(return_sequences, f"{kind} return_sequences")
        self.stateful = check_bool(stateful, f"{kind} stateful")
        self.kernel_initializer = initializers.check_name(kernel_initializer)
        self.recurrent_initializer = initializers.check_name(recurrent_initializer)
        self._state: tuple[np.ndarray, ...] | None = None
        self._last_state: tuple[np.ndarray, ...] | None = None
        self._bufs: dict[str, np.ndarray] = {}
        self._buf_key: tuple[Any, ...] | None = None
        self._fwd: dict[str, Any] | None = None

    # -- construction -------------------------------------------------------
    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(input_shape) != 2:
            raise InputRankError(
                f"{type(self).__name__} {self.name!r} takes sequences (N, T, features); got "
                f"per-sample shape {tuple(input_shape)} (add an Embedding for token ids, or "
                "reshape to (N, T, F))", layout="sequences (T, F)", rank=2, got=input_shape)
        self.in_features = int(input_shape[1])
        self.timesteps = int(input_shape[0])
        return self._out_shape(self.timesteps)

    def _out_shape(self, T: int) -> tuple[int, ...]:
        return (T, self.units) if self.return_sequences else (self.units,)

    def param_specs(self) -> list[ParamSpec]:
        G = self._gate_count * self.units
        return [("weight_ih", (G, self.in_features)), ("weight_hh", (G, self.units)),
                ("bias_ih", (G,)), ("bias_hh", (G,))]

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        H, k = self.units, self._gate_count
        # each gate's block is initialised as a layer of its own
        for g in range(k):
            initializers.fill(params["weight_ih"][g * H:(g + 1) * H], self.kernel_initializer,
                              self.in_features, H, rng)
            initializers.fill(params["weight_hh"][g * H:(g + 1) * H], self.recurrent_initializer,
                              H, H, rng)
        params["bias_ih"][...] = 0
        params["bias_hh"][...] = 0

    # -- state ----------------------------------------------------------------
    def reset_states(self, states: np.ndarray | Iterable[np.ndarray] | None = None) -> None:
        """Forget the carried state (the next call starts from zeros, any batch size), or
        set it: ``states`` is ``h`` of shape ``(N, units)`` (SimpleRNN) or ``(h, c)`` (LSTM).

        Raises:
            ValueError: if ``states`` is given to a layer that is not stateful, or has the
                wrong number of arrays or a wrong shape.
        """
        if states is None:
            self._state = None
            return
        if not self.stateful:
            raise ValueError(f"{type(self).__name__} {self.name!r} is not stateful "
                             f"(stateful=False): it always starts from a zero state")
        given = (states,) if isinstance(states, np.ndarray) else tuple(states)
        if len(given) != self._n_states:
            raise ValueError(f"{type(self).__name__} has {self._n_states} state array(s), got "
                             f"{len(given)}")
        out: list[np.ndarray] = []
        for s in given:
            a = np.array(s, dtype=self.dtype, order="C", copy=True)
            if a.ndim != 2 or a.shape[1] != self.units or (out and a.shape != out[0].shape):
                raise ValueError(f"{type(self).__name__} state must have shape (N, {self.units}), "
                                 f"got {a.shape}")
            out.append(a)
        self._state = tuple(out)

    @property
    def states(self) -> tuple[np.ndarray, ...] | None:
        """The final state of the last forward call (copies): ``(h,)`` or ``(h, c)``."""
        return None if self._last_state is None else tuple(s.copy() for s in self._last_state)

    # -- helpers ----------------------------------------------------------------
    def _check_input(self, x: Any, mask: Any) -> tuple[np.ndarray, np.ndarray | None]:
        self._check_built()
        x = np.asarray(x)
        if x.ndim != 3 or x.shape[2] != self.in_features:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects input of shape "
                             f"(N, T, {self.in_features}), got {x.shape}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"{type(self).__name__} {self.name!r} got an empty batch {x.shape}")
        x = np.ascontiguousarray(x, dtype=self.dtype)
        N, T = x.shape[:2]
        m = None
        if mask is not None:
            mk = np.asarray(mask)
            if mk.shape != (N, T):
                raise ValueError(f"mask has shape {mk.shape}; it must be (N, T) = {(N, T)} for "
                                 f"{type(self).__name__} {self.name!r} input {x.shape}")
            if mk.dtype.kind not in "biuf":
                raise ValueError(f"mask has non-numeric dtype {mk.dtype}")
            mk = mk != 0
            if not mk.all():
                m = np.ascontiguousarray(mk).view(np.uint8)
        return x, m

    def _initial_state(self, N: int) -> tuple[np.ndarray | None, ...]:
        if not self.stateful or self._state is None:
            return (None,) * self._n_states
        if self._state[0].shape[0] != N:
            raise ValueError(
                f"stateful {type(self).__name__} {self.name!r} carries a state for batches of "
                f"{self._state[0].shape[0]} rows but got {N}: use a fixed batch size (a number of "
                f"samples divisible by it, shuffle=False) or call reset_states() first")
        return self._state

    def _end_forward(self, last: tuple[np.ndarray, ...], N: int, T: int, mask: Any) -> None:
        """What every forward ends with: the final state(s) kept (a copy carried to a stateful
        layer's next batch) and the record backward reads."""
        self._last_state = last
        if self.stateful:
            self._state = tuple(s.copy() for s in last)
        self._fwd = {"N": N, "T": T, "mask": mask, "bf16": self._bf16_now()}

    def _bf16_now(self) -> bool:
        """True when this call's products run in bfloat16 (inside fit(precision="bf16"))."""
        return precision.active() and self.dtype == np.float32

    def _begin_backward(self, dy: np.ndarray) -> tuple[dict[str, Any], np.ndarray,
                                                       np.ndarray | None]:
        """What every backward starts with: the last forward's record, ``dy`` checked against
        the output shape (C-contiguous, the layer's dtype), and room for ``dx`` (None when the
        input gradient is not needed)."""
        f = self._fwd
        if f is None:
            raise RuntimeError(f"{type(self).__name__} {self.name!r}: backward called before "
                               "forward")
        N, T = f["N"], f["T"]
        dy = np.ascontiguousarray(dy, dtype=self.dtype)
        want = (N,) + self._out_shape(T)
        if dy.shape != want:
            raise ValueError(f"{type(self).__name__} {self.name!r}: output gradient has shape "
                             f"{dy.shape}, expected {want}")
        dx = np.empty((N, T, self.in_features), dtype=self.dtype) if self.need_input_grad else None
        return f, dy, dx

    def _buffers(self, N: int, T: int, spec: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        key = (N, T, self.dtype)
        if self._buf_key != key:
            self._bufs = {k: np.empty(s, dtype=self.dtype) for k, s in spec.items()}
            self._buf_key = key
        return self._bufs

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return mask if self.return_sequences else None

    def get_config(self) -> dict[str, Any]:
        return {"units": self.units, "return_sequences": self.return_sequences,
                "stateful": self.stateful, "kernel_initializer": self.kernel_initializer,
                "recurrent_initializer": self.recurrent_initializer, "name": self.name}


@register
class SimpleRNN(_Recurrent):
    """Fully connected recurrent layer (Elman), as ``torch.nn.RNN``:

    ``h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``, ``h_0 = 0`` (or the carried state).

    Args:
        units: size ``H`` of the state.
        activation: ``"tanh"`` (default), ``"relu"``, ``"sigmoid"`` or ``"identity"``.
        return_sequences: output every step ``(N, T, H)`` (zeros at masked steps) instead
            of the final state ``(N, H)`` (the state at each sequence's last valid step).
        stateful: carry the final state into the next call (truncated BPTT: no gradient
            flows into the carried state); see :meth:`reset_states`.  Row ``i`` of a batch
            continues row ``i`` of the previous one: use a fixed batch size and
            ``fit(..., shuffle=False)`` (or a hand-written loop).
        kernel_initializer: initializer of ``weight_ih`` (default Glorot uniform).
        recurrent_initializer: initializer of ``weight_hh`` (default orthogonal).
        name: layer name.

    Input shape: ``(N, T, F)`` (with an optional ``(N, T)`` mask).
    Output shape: ``(N, T, H)`` or ``(N, H)``.

    Parameters: ``weight_ih (H, F)``, ``weight_hh (H, H)``, ``bias_ih (H,)``,
    ``bias_hh (H,)``, named and laid out as in ``torch.nn.RNN``.
    """

    def __init__(self, units: int, activation: str = "tanh", return_sequences: bool = False,
                 stateful: bool = False, kernel_initializer: str = "glorot_uniform",
                 recurrent_initializer: str = "orthogonal", name: str | None = None) -> None:
        super().__init__(units, return_sequences, stateful, kernel_initializer,
                         recurrent_initializer, name)
        act = canonical_name(activation)
        if act == "softmax":
            raise ValueError("SimpleRNN activation must be tanh, relu, sigmoid or identity, not "
                             "softmax")
        self.activation = act
        self._act = activation_id(act)

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x, m = self._check_input(x, mask)
        N, T, F = x.shape
        H = self.units
        b = self._buffers(N, T, {"xt": (T, N, F), "zs": (T, N, H), "hs": (T + 1, N, H),
                                 "dz": (T, N, H), "dh_a": (N, H), "dh_b": (N, H), "dxt": (T, N, F)})
        (h0,) = self._initial_state(N)
        y = np.empty((N, T, H), dtype=self.dtype) if self.return_sequences else None
        p = self.params
        with threads.capped():
            _rnn.rnn_forward(x, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"], h0, m,
                             self._act, b["xt"], b["zs"], b["hs"], y)
        hT = b["hs"][T].copy()
        self._end_forward((hT,), N, T, m)
        return hT if y is None else y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        f, dy, dx = self._begin_backward(dy)
        b = self._bufs
        dy_seq, dh_last = (dy, None) if self.return_sequences else (None, dy)
        need_dx = dx is not None
        g, p = self.grads, self.params
        with threads.capped():
            _rnn.rnn_backward(b["xt"], p["weight_ih"], p["weight_hh"], f["mask"], self._act,
                              b["hs"], dy_seq, dh_last, b["dz"], b["dh_a"], b["dh_b"],
                              b["dxt"] if need_dx else None, dx,
                              g["weight_ih"], g["weight_hh"], g["bias_ih"], g["bias_hh"])
        return dx

    def get_config(self) -> dict[str, Any]:
        cfg = super().get_config()
        cfg["activation"] = self.activation
        return cfg


@register
class LSTM(_Recurrent):
    """Long short-term memory layer (Graves' four-gate cell, no peepholes), equal to
    ``torch.nn.LSTM`` (gate order i, f, g, o; two biases ``b_ih`` and ``b_hh``)::

        a   = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh     (blocks a_i, a_f, a_g, a_o of H rows)
        i   = sigmoid(a_i)    f = sigmoid(a_f)    g = tanh(a_g)    o = sigmoid(a_o)
        c_t = f * c_{t-1} + i * g
        h_t = o * tanh(c_t)

    with ``h_0 = c_0 = 0`` (or the carried state when ``stateful``).  The two biases are
    kept so that weights move to and from PyTorch unchanged; only their sum matters and
    both receive the same gradient.

    Args:
        units: size ``H`` of the hidden and cell states.
        return_sequences: output ``h_t`` at every step ``(N, T, H)`` (zeros at masked
            steps) instead of the final ``h`` ``(N, H)`` (at each sequence's last valid step).
        return_state: output the final states ``[h, c]`` concatenated, ``(N, 2H)`` (a
            ``Sequential`` layer has one output; needs ``return_sequences=False``).  The
            final states are also readable after any call as :attr:`states`.
        stateful: carry ``(h, c)`` into the next call (truncated BPTT: no gradient flows into
            the carried state); see :meth:`reset_states`.  Row ``i`` of a batch continues row
            ``i`` of the previous one: use a fixed batch size and ``fit(..., shuffle=False)``
            (or a hand-written loop); :func:`sparknet.data.bptt_batches` lays out a text.
        kernel_initializer: initializer of each gate's block of ``weight_ih`` (Glorot uniform).
        recurrent_initializer: initializer of each gate's block of ``weight_hh`` (orthogonal).
        unit_forget_bias: start the forget-gate part of ``bias_ih`` at 1 (Jozefowicz et al.
            2015); the other biases start at 0.
        name: layer name.

    Input shape: ``(N, T, F)`` (with an optional ``(N, T)`` mask).
    Output shape: ``(N, T, H)``, ``(N, H)``, or ``(N, 2H)`` with ``return_state``.

    Parameters: ``weight_ih (4H, F)``, ``weight_hh (4H, H)``, ``bias_ih (4H,)``,
    ``bias_hh (4H,)``, as ``weight_ih_l0`` etc. of ``torch.nn.LSTM``.
    """

    _gate_count = 4
    _n_states = 2

    def __init__(self, units: int, return_sequences: bool = False, return_state: bool = False,
                 stateful: bool = False, kernel_initializer: str = "glorot_uniform",
                 recurrent_initializer: str = "orthogonal", unit_forget_bias: bool = True,
                 name: str | None = None) -> None:
        super().__init__(units, return_sequences, stateful, kernel_initializer,
                         recurrent_initializer, name)
        self.return_state = check_bool(return_state, "LSTM return_state")
        if self.return_state and self.return_sequences:
            raise ValueError("LSTM return_state=True needs return_sequences=False (a layer of a "
                             "Sequential model has one output); read layer.states after a call "
                             "instead")
        self.unit_forget_bias = check_bool(unit_forget_bias, "LSTM unit_forget_bias")

    def _out_shape(self, T: int) -> tuple[int, ...]:
        if self.return_state:
            return (2 * self.units,)
        return super()._out_shape(T)

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        super().init_params(params, rng)
        if self.unit_forget_bias:
            params["bias_ih"][self.units:2 * self.units] = 1

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x, m = self._check_input(x, mask)
        N, T, F = x.shape
        H = self.units
        b = self._buffers(N, T, {"xt": (T, N, F), "gates": (T, N, 4 * H), "hs": (T + 1, N, H),
                                 "cs": (T + 1, N, H), "tcs": (T, N, H),
                                 "dh_a": (N, H), "dh_b": (N, H), "dc": (N, H), "dxt": (T, N, F)})
        h0, c0 = self._initial_state(N)
        y = np.empty((N, T, H), dtype=self.dtype) if self.return_sequences else None
        p = self.params
        with threads.capped():
            _lstm.lstm_forward(x, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"], h0,
                               c0, m, b["xt"], b["gates"], b["hs"], b["cs"], b["tcs"], y,
                               bf16=self._bf16_now())
        self._end_forward((b["hs"][T], b["cs"][T]), N, T, m)
        if y is not None:
            return y
        if self.return_state:
            return np.concatenate([b["hs"][T], b["cs"][T]], axis=1)
        return b["hs"][T].copy()

    @property
    def states(self) -> tuple[np.ndarray, ...] | None:
        """The final ``(h, c)`` of the last forward call (copies), or None."""
        return super().states

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        f, dy, dx = self._begin_backward(dy)
        H, b = self.units, self._bufs
        dy_seq = dh_last = dc_last = None
        if self.return_sequences:
            dy_seq = dy
        elif self.return_state:
            dh_last, dc_last = np.ascontiguousarray(dy[:, :H]), np.ascontiguousarray(dy[:, H:])
        else:
            dh_last = dy
        need_dx = dx is not None
        g, p = self.grads, self.params
        with threads.capped():
            _lstm.lstm_backward(b["xt"], p["weight_ih"], p["weight_hh"], f["mask"], b["gates"],
                                b["hs"], b["cs"], b["tcs"], dy_seq, dh_last, dc_last, b["dh_a"],
                                b["dh_b"], b["dc"], b["dxt"] if need_dx else None, dx,
                                g["weight_ih"], g["weight_hh"], g["bias_ih"], g["bias_hh"],
                                bf16=f["bf16"])
        return dx

    def get_config(self) -> dict[str, Any]:
        cfg = super().get_config()
        cfg.update(return_state=self.return_state, unit_forget_bias=self.unit_forget_bias)
        return cfg


@register
class GRU(_Recurrent):
    """Gated recurrent unit (Cho et al. 2014), equal to ``torch.nn.GRU`` (gate order r, z, n;
    two biases ``b_ih`` and ``b_hh``; the reset gate applied after the recurrent product)::

        r   = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
        z   = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
        n   = tanh(W_in x_t + b_in + r * (W_hn h_{t-1} + b_hn))
        h_t = (1 - z) * n + z * h_{t-1}

    with ``h_0 = 0`` (or the carried state when ``stateful``).  Both biases matter here
    (``b_hn`` is scaled by ``r``); all start at 0.

    Args:
        units: size ``H`` of the state.
        return_sequences: output ``h_t`` at every step ``(N, T, H)`` (zeros at masked steps)
            instead of the final ``h`` ``(N, H)`` (at each sequence's last valid step).
        stateful: carry ``h`` into the next call (truncated BPTT: no gradient flows into the
            carried state); see :meth:`reset_states`.  Row ``i`` of a batch continues row ``i``
            of the previous one: use a fixed batch size and ``fit(..., shuffle=False)``.
        kernel_initializer: initializer of each gate's block of ``weight_ih`` (Glorot uniform).
        recurrent_initializer: initializer of each gate's block of ``weight_hh`` (orthogonal).
        name: layer name.

    Input shape: ``(N, T, F)`` (with an optional ``(N, T)`` mask).
    Output shape: ``(N, T, H)`` or ``(N, H)``.

    Parameters: ``weight_ih (3H, F)``, ``weight_hh (3H, H)``, ``bias_ih (3H,)``,
    ``bias_hh (3H,)``, as ``weight_ih_l0`` etc. of ``torch.nn.GRU``.
    """

    _gate_count = 3

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        x, m = self._check_input(x, mask)
        N, T, F = x.shape
        H = self.units
        b = self._buffers(N, T, {"xt": (T, N, F), "gates": (T, N, 4 * H), "hs": (T + 1, N, H),
                                 "dh_a": (N, H), "dh_b": (N, H), "dxt": (T, N, F)})
        (h0,) = self._initial_state(N)
        y = np.empty((N, T, H), dtype=self.dtype) if self.return_sequences else None
        p = self.params
        with threads.capped():
            _gru.gru_forward(x, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"], h0, m,
                             b["xt"], b["gates"], b["hs"], y, bf16=self._bf16_now())
        hT = b["hs"][T].copy()
        self._end_forward((hT,), N, T, m)
        return hT if y is None else y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        f, dy, dx = self._begin_backward(dy)
        b = self._bufs
        dy_seq, dh_last = (dy, None) if self.return_sequences else (None, dy)
        g, p = self.grads, self.params
        with threads.capped():
            _gru.gru_backward(b["xt"], p["weight_ih"], p["weight_hh"], f["mask"], b["gates"],
                              b["hs"], dy_seq, dh_last, b["dh_a"], b["dh_b"],
                              b["dxt"] if dx is not None else None, dx,
                              g["weight_ih"], g["weight_hh"], g["bias_ih"], g["bias_hh"],
                              bf16=f["bf16"])
        return dx

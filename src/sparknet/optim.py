"""Optimizers over one flat parameter buffer.

They share one base: :meth:`Optimizer.step` validates, counts steps and calls the
subclass's ``_step``, which is a single fused, GIL-free Cython pass over the whole
buffer.  State lives in flat arrays of the parameters' length, so it can be
checkpointed, broadcast or averaged as a whole.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sparknet import _optim


class Optimizer:
    """Base class.  ``lr`` is the learning rate; ``state`` holds flat arrays."""

    name = "optimizer"
    _state_names: tuple[str, ...] = ()

    def __init__(self, lr: float) -> None:
        if not (float(lr) > 0 and np.isfinite(lr)):
            raise ValueError(f"learning rate must be a positive finite number, got {lr!r}")
        self.lr = float(lr)
        self.t = 0
        self.state: dict[str, np.ndarray] = {}

    def _needs(self) -> tuple[str, ...]:
        return self._state_names

    def init_state(self, n: int, dtype: Any) -> None:
        dtype = np.dtype(dtype)
        for key in self._needs():
            cur = self.state.get(key)
            if cur is None or cur.shape != (n,) or cur.dtype != dtype:
                self.state[key] = np.zeros(n, dtype=dtype)

    def step(self, params: np.ndarray, grads: np.ndarray) -> None:
        """Update ``params`` in place from ``grads`` (both flat, same length and dtype)."""
        if params.ndim != 1 or grads.shape != params.shape or grads.dtype != params.dtype:
            raise ValueError(f"optimizer step needs flat params and grads of one shape and dtype, "
                             f"got {params.shape}/{params.dtype} and {grads.shape}/{grads.dtype}")
        self.init_state(params.shape[0], params.dtype)
        self.t += 1
        self._step(params, grads)

    def _step(self, params: np.ndarray, grads: np.ndarray) -> None:
        raise NotImplementedError

    # -- state, for checkpoints and the parameter server ----------------
    def get_config(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, **{k: v.copy() for k, v in self.state.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state.get("t", 0))
        self.state = {k: np.array(v, copy=True) for k, v in state.items() if k != "t"}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_config().items())})"


class RMSprop(Optimizer):
    """RMSprop, step for step equal to ``torch.optim.RMSprop``.

    Args:
        lr: learning rate (default 1e-3).
        alpha: smoothing constant of the squared-gradient average (default 0.99).
        eps: added to the denominator *after* the square root (default 1e-8).
        weight_decay: L2 penalty added to the gradient.
        momentum: momentum factor (0 disables).
        centered: normalise by the estimated gradient variance instead of the second moment.
    """

    name = "rmsprop"

    def __init__(self, lr: float = 1e-3, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False) -> None:
        super().__init__(lr)
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"RMSprop alpha must be in [0, 1), got {alpha!r}")
        if eps < 0 or weight_decay < 0 or momentum < 0:
            raise ValueError("RMSprop eps, weight_decay and momentum must be >= 0")
        self.alpha, self.eps = float(alpha), float(eps)
        self.weight_decay, self.momentum, self.centered = float(weight_decay), float(momentum), bool(centered)

    def _needs(self):
        need = ["square_avg"]
        if self.centered:
            need.append("grad_avg")
        if self.momentum > 0:
            need.append("momentum_buffer")
        return tuple(need)

    def _step(self, params, grads):
        _optim.rmsprop(params, grads, self.state["square_avg"], self.state.get("grad_avg"),
                       self.state.get("momentum_buffer"), self.lr, self.alpha, self.eps,
                       self.weight_decay, self.momentum)

    def get_config(self):
        return {"lr": self.lr, "alpha": self.alpha, "eps": self.eps,
                "weight_decay": self.weight_decay, "momentum": self.momentum,
                "centered": self.centered}


class SGD(Optimizer):
    """Stochastic gradient descent, equal to ``torch.optim.SGD``.

    Args:
        lr: learning rate (default 0.01).
        momentum: momentum factor (0 disables).
        dampening: dampening for momentum.
        weight_decay: L2 penalty added to the gradient.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
    """

    name = "sgd"

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(lr)
        if momentum < 0 or weight_decay < 0:
            raise ValueError("SGD momentum and weight_decay must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening == 0")
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)

    def _needs(self):
        return ("momentum_buffer",) if self.momentum != 0 else ()

    def _step(self, params, grads):
        _optim.sgd(params, grads, self.state.get("momentum_buffer"), self.lr, self.momentum,
                   self.dampening, self.weight_decay, self.nesterov, self.t == 1)

    def get_config(self):
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}


_BY_NAME = {"rmsprop": RMSprop, "sgd": SGD}


def get(optimizer: "str | Optimizer | None") -> Optimizer:
    """An optimizer from a name (``"rmsprop"``, ``"sgd"``) or an instance (returned as is)."""
    if optimizer is None:
        return RMSprop()
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer.lower() in _BY_NAME:
        return _BY_NAME[optimizer.lower()]()
    raise ValueError(f"unknown optimizer {optimizer!r}; use 'rmsprop', 'sgd' or an Optimizer instance")


def from_config(name: str, config: dict) -> Optimizer:
    if name not in _BY_NAME:
        raise ValueError(f"unknown optimizer {name!r} in saved state")
    return _BY_NAME[name](**config)

"""Optimizers over one flat parameter buffer.

The maths lives in *functional* steps (:mod:`sparknet.update_steps`), :func:`rmsprop`,
:func:`sgd` and :func:`adam`: the state is passed in explicitly (as in PyTorch's
``torch.optim._functional``), so the same step serves a :class:`~sparknet.model.Sequential`
(state held by the optimizer), a data-parallel partition (state resident on its executor)
and a model-parallel block (state beside the block, applied row chunk by row chunk).  Each
is a single fused, GIL-free Cython pass (:mod:`sparknet._optim`).

The classes share one base: :meth:`Optimizer.step` validates, counts steps and calls
:meth:`Optimizer.apply`, the functional step with this optimizer's hyper-parameters.
Nothing outside this module knows an optimizer's state keys: callers ask
:meth:`Optimizer.state_keys`, and state is serialised one way,
:meth:`Optimizer.state_arrays` / :meth:`Optimizer.load_state_arrays` (named arrays:
``<prefix>t`` and ``<prefix><key>``).

Every optimizer clips its gradient before the step when asked (Keras' names, PyTorch's
maths): ``clipvalue=v`` clamps each element to ``[-v, v]``
(``torch.nn.utils.clip_grad_value_``), then ``clipnorm=c`` scales the whole flat gradient
by ``c / (norm + 1e-6)`` when that is below 1 (``torch.nn.utils.clip_grad_norm_``, the norm
being the 2-norm of the *whole* gradient).  :meth:`Optimizer.step` clips ``grads`` **in
place**, as PyTorch clips ``.grad``; weight decay comes after (it is part of the step).
Where a gradient is spread over several buffers (model-parallel blocks and driver layers)
the parts are clipped by value and summed as squares with :meth:`Optimizer.clip_part`,
the global factor comes from :meth:`Optimizer.clip_scale`, and each part is scaled
(:func:`scale`) and stepped with ``step(..., clipped=True)`` or :meth:`Optimizer.apply`.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Mapping, MutableMapping, Sequence

import numpy as np

import sparknet._optim as _optim
from sparknet._validation import check_bool, check_float, non_negative_int
from sparknet.update_steps import (
    adam,
    clip_by_value,
    norm_scale,
    rmsprop,
    scale,
    sgd,
    sum_of_squares,
)

State = Mapping[str, np.ndarray]
#: a weight in the flat parameters and its bfloat16 packings: (offset, rows, cols, packs)
PackTarget = tuple[int, int, int, tuple[Any, ...]]


# --------------------------------------------------------------------------- classes
class Optimizer:
    """Base class.  ``lr`` is the learning rate; ``state`` holds flat arrays; ``t`` counts steps;
    ``clipnorm`` and ``clipvalue`` (``None``: off) clip the gradient before each step."""

    name = "optimizer"
    _loaded = False

    def __init__(self, lr: float, clipnorm: float | None = None,
                 clipvalue: float | None = None) -> None:
        self.lr = check_float(lr, "learning rate", 0.0, low_open=True)
        what = type(self).__name__
        self.clipnorm = None if clipnorm is None else check_float(clipnorm, f"{what} clipnorm", 0.0,
                                                                  low_open=True)
        self.clipvalue = None if clipvalue is None else check_float(clipvalue, f"{what} clipvalue",
                                                                    0.0, low_open=True)
        self.t = 0
        self.state: dict[str, np.ndarray] = {}
        #: True while ``state`` came from a load and no step has checked it against the parameters
        self._loaded = False
        #: the model whose parameters ``state`` follows (set by :meth:`bind_owner`)
        self._owner: weakref.ReferenceType[Any] | None = None
        #: the owner's flat parameter buffer, kept to know the owner's weights once it is gone
        self._owner_params: np.ndarray | None = None

    def state_keys(self) -> tuple[str, ...]:
        """Names of the per-parameter state arrays this configuration needs."""
        return ()

    def bind_owner(self, owner: Any) -> None:
        """Tie the state to ``owner``, the model this optimizer trains.

        Raises ``ValueError`` when the optimizer has already stepped for another model: its
        moving averages and step count belong to that model's parameters, and carrying them
        over to a second model would train it differently without a word.  Once that model is
        gone, a model holding exactly its last parameters (the same model saved and loaded
        again) goes on with the state.  :meth:`reset` starts over."""
        current = self._owner() if self._owner is not None else None
        last = getattr(self, "_owner_params", None)   # None: never bound here (new, loaded)
        same = current is owner or (current is None and (last is None
                                                         or np.array_equal(last, owner.params)))
        if self.t > 0 and not same:
            raise ValueError(
                f"this {type(self).__name__} has already taken {self.t} steps for another model, "
                f"and its state follows that model's parameters: give each model its own "
                f"optimizer (optimizer={type(self).__name__}(lr={self.lr:g}, ...)) or call "
                f"optimizer.reset() to start over")
        self._owner = weakref.ref(owner)
        self._owner_params = owner.params

    def __getstate__(self) -> dict[str, Any]:
        # the owner is a weak reference to a model in this process: it does not travel
        state = self.__dict__.copy()
        state["_owner"] = state["_owner_params"] = None
        return state

    def reset(self) -> None:
        """Forget the state and the step count (and the model they belonged to)."""
        self.state = {}
        self.t = 0
        self._loaded = False
        self._owner = self._owner_params = None

    def init_state(self, n: int, dtype: Any) -> None:
        """Make ``state`` hold zeroed arrays of length ``n`` (kept when already right).

        State that was *loaded* (:meth:`load_state_arrays`, :meth:`load_state_dict`) must
        have length ``n``: loaded state of another length belongs to another model, and
        raises ``ValueError`` rather than being silently replaced by zeros."""
        dtype = np.dtype(dtype)
        if self._loaded:
            for key, loaded in list(self.state.items()):
                if loaded.shape != (n,):
                    raise ValueError(f"optimizer state {key} has {loaded.shape[0]} entries but "
                                     f"there are {n} parameters: the state was saved for another "
                                     "model")
                if loaded.dtype != dtype:
                    self.state[key] = loaded.astype(dtype)
            self._loaded = False
        for key in self.state_keys():
            cur = self.state.get(key)
            if cur is None or cur.shape != (n,) or cur.dtype != dtype:
                self.state[key] = np.zeros(n, dtype=dtype)

    def step(self, params: np.ndarray, grads: np.ndarray, clipped: bool = False,
             pack: Sequence[PackTarget] = ()) -> bool:
        """Update ``params`` in place from ``grads`` (both flat, same length and dtype).

        ``grads`` is clipped first, in place (:meth:`clip`), unless ``clipped``: the caller
        clipped it already, against a norm over more than this buffer.  ``pack``: bfloat16
        packings of weights in ``params`` (``(offset, rows, cols, packs)``, see
        :func:`sparknet._optim.rmsprop_pack`) that an optimizer able to refill them in its own
        pass refills; returns True when it did (:mod:`sparknet.precision` packs them otherwise)."""
        if params.ndim != 1 or grads.shape != params.shape or grads.dtype != params.dtype:
            raise ValueError(f"optimizer step needs flat params and grads of one shape and dtype, "
                             f"got {params.shape}/{params.dtype} and {grads.shape}/{grads.dtype}")
        if not clipped:
            self.clip(grads)
        self.init_state(params.shape[0], params.dtype)
        self.t += 1
        if pack and self._apply_and_pack(params, grads, self.state, list(pack)):
            return True
        self.apply(params, grads, self.state, self.t)
        return False

    def _apply_and_pack(self, params: np.ndarray, grads: np.ndarray, state: State,
                        pack: list[PackTarget]) -> bool:
        """:meth:`apply` and the ``pack`` refill in one pass, where this optimizer can (True);
        False, having done nothing, where it cannot."""
        return False

    # -- clipping --------------------------------------------------------
    @property
    def clips(self) -> bool:
        """Whether this optimizer clips its gradient (``clipnorm`` or ``clipvalue`` set)."""
        return self.clipnorm is not None or self.clipvalue is not None

    def clip(self, grads: np.ndarray) -> None:
        """Clip the whole flat gradient ``grads`` in place: clamp to ``[-clipvalue, clipvalue]``,
        then scale to ``clipnorm`` (``torch.nn.utils.clip_grad_value_`` then
        ``clip_grad_norm_``)."""
        scale(grads, self.clip_scale(self.clip_part(grads)))

    def clip_part(self, grads: np.ndarray) -> float:
        """Clamp a flat *part* of the gradient by value (in place) and return its share of the
        squared global norm (0 without ``clipnorm``): the parts' sum goes to :meth:`clip_scale`."""
        if self.clipvalue is not None:
            clip_by_value(grads, self.clipvalue)
        return 0.0 if self.clipnorm is None else sum_of_squares(grads)

    def clip_scale(self, sumsq: float) -> float:
        """The factor that clips a gradient of squared norm ``sumsq`` to ``clipnorm`` (1
        without)."""
        return 1.0 if self.clipnorm is None else norm_scale(sumsq, self.clipnorm)

    def _clipped_norm(self, grad_norm: float, n: int) -> float:
        """A bound on the clipped gradient's 2-norm, from one on the gradient's."""
        if self.clipvalue is not None:
            grad_norm = min(grad_norm, self.clipvalue * float(np.sqrt(n)))
        if self.clipnorm is not None:
            grad_norm = min(grad_norm, self.clipnorm)
        return grad_norm

    def apply(self, params: np.ndarray, grads: np.ndarray, state: State, t: int) -> None:
        """The functional step: update flat ``params`` in place from ``grads`` with the given
        ``state`` arrays (same length, keys :meth:`state_keys`) as step number ``t`` (1-based).
        ``self.state`` and ``self.t`` are not touched."""
        raise NotImplementedError

    def step_bound(self, grad_norm: float, param_norm: float, n: int,
                   carry: float) -> tuple[float, float]:
        """An upper bound on every 2-norm the next step computes -- the decayed gradient, the
        momentum buffer and the change it makes to the parameters -- given bounds on the
        gradient's and the parameters' 2-norms, for ``n`` parameters.  ``carry`` is the bound
        this returned for the momentum buffer at the last step (its true norm at the start).
        Returns ``(bound, carry)``; the bound is ``inf`` when this optimizer cannot give one.
        :class:`sparknet.divergence.StepGuard` backs a step up only when the bound is large.
        Clipping shrinks the gradient's bound first (to ``clipnorm``, ``clipvalue * sqrt(n)``)."""
        return self._step_bound(self._clipped_norm(grad_norm, n), param_norm, n, carry)

    def _step_bound(self, grad_norm: float, param_norm: float, n: int,
                    carry: float) -> tuple[float, float]:
        """:meth:`step_bound` for the gradient once clipped (bound ``grad_norm``)."""
        return float("inf"), carry

    # -- state, for checkpoints and the parameter server ----------------
    def get_config(self) -> dict:
        """The constructor's arguments (JSON-able), clipping included: ``from_config`` rebuilds
        it."""
        return {**self._config(), "clipnorm": self.clipnorm, "clipvalue": self.clipvalue}

    def _config(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, **{k: v.copy() for k, v in self.state.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Read what :meth:`state_dict` returned (checked as :meth:`load_state_arrays` checks)."""
        t = state.get("t", 0)
        self.t = non_negative_int(t.item() if isinstance(t, np.ndarray) and t.size == 1 else t,
                                  "optimizer state t")
        self.state = {k: np.array(v, copy=True) for k, v in state.items() if k != "t"}
        self._check_state(self.state, "", finite=True)
        self._loaded = True

    def state_layout(self, n: int, dtype: Any,
                     prefix: str = "opt_") -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``{name: (shape, dtype)}`` of :meth:`state_arrays` for ``n`` parameters: where a
        caller allocates resident state before :meth:`load_state_arrays` binds to it."""
        out: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            f"{prefix}t": ((1,), np.dtype(np.int64))}
        for key in self.state_keys():
            out[f"{prefix}{key}"] = ((n,), np.dtype(dtype))
        return out

    def state_arrays(self, prefix: str = "opt_") -> dict[str, np.ndarray]:
        """The state as named arrays (copies): ``<prefix>t`` (int64, shape (1,)) and
        ``<prefix><key>`` for each state key.  The one serialised form of optimizer state."""
        out = {f"{prefix}t": np.array([self.t], dtype=np.int64)}
        for key, arr in self.state.items():
            out[f"{prefix}{key}"] = np.array(arr, copy=True)
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray], prefix: str = "opt_",
                          copy: bool = True) -> None:
        """Read state written by :meth:`state_arrays`.  ``copy=False`` binds ``state`` to the
        given arrays (resident state updated in place); a missing ``<prefix>t`` means 0."""
        t = arrays.get(f"{prefix}t")
        self.t = 0 if t is None else self._step_count(t, f"{prefix}t")
        self.state = {}
        for key in self.state_keys():
            arr = arrays.get(f"{prefix}{key}")
            if arr is not None:
                self.state[key] = np.array(arr, copy=True) if copy else arr
        # shapes and dtypes always (cheap); values only when copying (resident state binds
        # in place every round and was checked when it was written)
        self._check_state(self.state, prefix, finite=copy)
        self._loaded = True

    @staticmethod
    def _step_count(t: Any, what: str) -> int:
        a = np.asarray(t)
        if a.size != 1:
            raise ValueError(f"{what} must hold one integer (the step count), got {a.size} values")
        v = a.reshape(-1)[0].item()
        if a.dtype.kind == "f" and np.isfinite(v) and v == np.round(v):
            v = int(v)
        if a.dtype.kind not in "iuf" or isinstance(v, (float, np.floating)):
            raise ValueError(f"{what} must be a non-negative integer, got {v!r}")
        return non_negative_int(v, what)

    def _check_state(self, state: Mapping[str, np.ndarray], prefix: str, finite: bool) -> None:
        """Loaded state arrays: flat float arrays of one length, finite when ``finite``,
        a squared-gradient average never negative.  ``ValueError`` names the array."""
        n = None
        for key, arr in state.items():
            what = f"optimizer state {prefix}{key}"
            if arr.dtype.kind != "f":
                raise ValueError(f"{what} has dtype {arr.dtype}; optimizer state holds floats")
            if arr.ndim != 1:
                raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
            if n is not None and arr.shape[0] != n:
                raise ValueError(f"{what} has {arr.shape[0]} entries, the other state arrays {n}")
            n = arr.shape[0]
            if finite:
                if not np.isfinite(arr).all():
                    raise ValueError(f"{what} contains NaN or infinity")
                if key == "square_avg" and arr.size and arr.min() < 0:
                    raise ValueError(f"{what} holds negative values; a squared-gradient average is "
                                     ">= 0")

    def write_step(self, arrays: MutableMapping[str, np.ndarray], prefix: str = "opt_") -> None:
        """Store the step count into arrays bound by ``load_state_arrays(..., copy=False)``."""
        arrays[f"{prefix}t"][0] = self.t

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class RMSprop(Optimizer):
    """RMSprop, step for step equal to ``torch.optim.RMSprop``.

    Args:
        lr: learning rate (default 1e-3).
        alpha: smoothing constant of the squared-gradient average (default 0.99).
        eps: added to the denominator *after* the square root (default 1e-8).
        weight_decay: L2 penalty added to the gradient.
        momentum: momentum factor (0 disables).
        centered: normalise by the estimated gradient variance instead of the second moment.
        clipnorm: clip the gradient to this 2-norm before the step (``None``: off).
        clipvalue: clamp each gradient element to ``[-clipvalue, clipvalue]`` first (``None``: off).
    """

    name = "rmsprop"

    def __init__(self, lr: float = 1e-3, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 clipnorm: float | None = None, clipvalue: float | None = None) -> None:
        super().__init__(lr, clipnorm, clipvalue)
        self.alpha = check_float(alpha, "RMSprop alpha", 0.0, 1.0, high_open=True)
        self.eps = check_float(eps, "RMSprop eps", 0.0, low_open=True)
        self.weight_decay = check_float(weight_decay, "RMSprop weight_decay", 0.0)
        self.momentum = check_float(momentum, "RMSprop momentum", 0.0, 1.0, high_open=True)
        self.centered = check_bool(centered, "RMSprop centered")

    def state_keys(self) -> tuple[str, ...]:
        need = ["square_avg"]
        if self.centered:
            need.append("grad_avg")
        if self.momentum > 0:
            need.append("momentum_buffer")
        return tuple(need)

    def apply(self, params: np.ndarray, grads: np.ndarray, state: State, t: int) -> None:
        rmsprop(params, grads, state["square_avg"], state.get("grad_avg"),
                state.get("momentum_buffer"), lr=self.lr, alpha=self.alpha, eps=self.eps,
                weight_decay=self.weight_decay, momentum=self.momentum)

    def _apply_and_pack(self, params: np.ndarray, grads: np.ndarray, state: State,
                        pack: list[PackTarget]) -> bool:
        # the plain float32 step only: each weight updated and packed 32 rows at a time
        if (self.centered or self.momentum > 0 or self.weight_decay != 0
                or params.dtype != np.float32):
            return False
        _optim.rmsprop_pack(params, grads, state["square_avg"], self.lr, self.alpha, self.eps, pack)
        return True

    def _step_bound(self, grad_norm: float, param_norm: float, n: int,
                    carry: float) -> tuple[float, float]:
        # g' = g + wd p; v' = alpha v + (1 - alpha) g'^2 >= (1 - alpha) g'^2, so each ratio
        # |g'_i| / (sqrt(v'_i) + eps) <= 1 / sqrt(1 - alpha):
        # the ratios' norm <= sqrt(n / (1 - alpha)).
        # Centered, the denominator sqrt(v' - a'^2) has no such floor: no bound.
        if self.centered:
            return float("inf"), carry
        decayed = grad_norm + self.weight_decay * param_norm
        ratios = float(np.sqrt(n / (1.0 - self.alpha)))
        if self.momentum > 0:  # b' = m b + ratios; the change is lr b'
            carry = self.momentum * carry + ratios
            return max(decayed, carry, self.lr * carry), carry
        return max(decayed, self.lr * ratios), 0.0

    def _config(self) -> dict:
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
        clipnorm: clip the gradient to this 2-norm before the step (``None``: off).
        clipvalue: clamp each gradient element to ``[-clipvalue, clipvalue]`` first (``None``: off).
    """

    name = "sgd"

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, clipnorm: float | None = None,
                 clipvalue: float | None = None) -> None:
        super().__init__(lr, clipnorm, clipvalue)
        self.momentum = check_float(momentum, "SGD momentum", 0.0, 1.0, high_open=True)
        self.dampening = check_float(dampening, "SGD dampening", 0.0, 1.0)
        self.weight_decay = check_float(weight_decay, "SGD weight_decay", 0.0)
        self.nesterov = check_bool(nesterov, "SGD nesterov")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening == 0")

    def state_keys(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum != 0 else ()

    def apply(self, params: np.ndarray, grads: np.ndarray, state: State, t: int) -> None:
        sgd(params, grads, state.get("momentum_buffer"), lr=self.lr, momentum=self.momentum,
            dampening=self.dampening, weight_decay=self.weight_decay, nesterov=self.nesterov,
            first_step=t == 1)

    def _step_bound(self, grad_norm: float, param_norm: float, n: int,
                    carry: float) -> tuple[float, float]:
        decayed = grad_norm + self.weight_decay * param_norm  # g' = g + wd p
        if self.momentum == 0:
            return max(decayed, self.lr * decayed), 0.0
        carry = self.momentum * carry + decayed  # b' = m b + (1 - d) g' (b' = g' at the first step)
        change = self.lr * (decayed + self.momentum * carry if self.nesterov else carry)
        return max(decayed, carry, change), carry

    def _config(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam, step for step equal to ``torch.optim.Adam`` (``amsgrad`` included).

    Args:
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)``, the decay rates of the gradient's first and second
            moment averages (default ``(0.9, 0.999)``), each in ``[0, 1)``.
        eps: added to the denominator after the square root (default 1e-8).
        weight_decay: L2 penalty added to the gradient (:class:`AdamW` decouples it).
        amsgrad: divide by the largest second moment seen so far (Reddi et al., 2018).
        clipnorm: clip the gradient to this 2-norm before the step (``None``: off).
        clipvalue: clamp each gradient element to ``[-clipvalue, clipvalue]`` first (``None``: off).
    """

    name = "adam"
    _decoupled = False

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 clipnorm: float | None = None, clipvalue: float | None = None) -> None:
        super().__init__(lr, clipnorm, clipvalue)
        what = type(self).__name__
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"{what} betas must be a pair (beta1, beta2), got {betas!r}")
        self.beta1 = check_float(betas[0], f"{what} beta1", 0.0, 1.0, high_open=True)
        self.beta2 = check_float(betas[1], f"{what} beta2", 0.0, 1.0, high_open=True)
        self.eps = check_float(eps, f"{what} eps", 0.0, low_open=True)
        self.weight_decay = check_float(weight_decay, f"{what} weight_decay", 0.0)
        self.amsgrad = check_bool(amsgrad, f"{what} amsgrad")

    @property
    def betas(self) -> tuple[float, float]:
        return (self.beta1, self.beta2)

    def state_keys(self) -> tuple[str, ...]:
        moments = ("exp_avg", "exp_avg_sq")
        return moments + ("max_exp_avg_sq",) if self.amsgrad else moments

    def apply(self, params: np.ndarray, grads: np.ndarray, state: State, t: int) -> None:
        adam(params, grads, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
             lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
             weight_decay=self.weight_decay, decoupled=self._decoupled, step=t)

    def _step_bound(self, grad_norm: float, param_norm: float, n: int,
                    carry: float) -> tuple[float, float]:
        # m_t = (1 - b1) sum_k b1^(t-k) g'_k and v_t = (1 - b2) sum_k b2^(t-k) g'_k^2, so by
        # Cauchy-Schwarz |m_t| <= (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2)) sqrt(v_t) when
        # b1^2 < b2; the bias corrections multiply the ratio by sqrt(1 - b2^t) / (1 - b1^t)
        # (amsgrad's larger denominator only shrinks it): per element |change| <= lr r.
        b1, b2, t = self.beta1, self.beta2, self.t + 1
        if b1 * b1 >= b2 or b2 == 0:
            return float("inf"), carry
        decayed = grad_norm + (0.0 if self._decoupled else self.weight_decay) * param_norm
        carry = b1 * carry + (1.0 - b1) * decayed  # the first moment's norm
        ratio = ((1.0 - b1) / np.sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2))
                 * np.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t))
        change = self.lr * float(ratio) * float(np.sqrt(n))
        if self._decoupled:
            change += self.lr * self.weight_decay * param_norm
        return max(decayed, carry, change), carry

    def _config(self) -> dict:
        return {"lr": self.lr, "betas": [self.beta1, self.beta2], "eps": self.eps,
                "weight_decay": self.weight_decay, "amsgrad": self.amsgrad}


class AdamW(Adam):
    """AdamW (decoupled weight decay), step for step equal to ``torch.optim.AdamW``.

    Args:
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default ``(0.9, 0.999)``).
        eps: added to the denominator after the square root (default 1e-8).
        weight_decay: the parameters shrink by ``lr * weight_decay`` each step before the
            Adam step (default 1e-2, PyTorch's).
        amsgrad: divide by the largest second moment seen so far.
        clipnorm: clip the gradient to this 2-norm before the step (``None``: off).
        clipvalue: clamp each gradient element to ``[-clipvalue, clipvalue]`` first (``None``: off).
    """

    name = "adamw"
    _decoupled = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 clipnorm: float | None = None, clipvalue: float | None = None) -> None:
        super().__init__(lr, betas, eps, weight_decay, amsgrad, clipnorm, clipvalue)


_BY_NAME: dict[str, Any] = {"rmsprop": RMSprop, "sgd": SGD, "adam": Adam, "adamw": AdamW}


def get(optimizer: "str | Optimizer | None") -> Optimizer:
    """An optimizer from a name (``"rmsprop"``, ``"sgd"``, ``"adam"``, ``"adamw"``) or an
    instance (returned as is)."""
    if optimizer is None:
        return RMSprop()
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer.lower() in _BY_NAME:
        return _BY_NAME[optimizer.lower()]()
    if isinstance(optimizer, type) and issubclass(optimizer, Optimizer):
        name = optimizer.__name__
        raise TypeError(f"optimizer={name} is the class; pass an instance: optimizer={name}() "
                        f"(its settings as arguments, e.g. {name}(lr=1e-3))")
    raise ValueError(f"unknown optimizer {optimizer!r}; use one of "
                     f"{', '.join(map(repr, _BY_NAME))} or an Optimizer instance")


def from_config(name: str, config: dict) -> Optimizer:
    """The optimizer ``name`` (``Optimizer.name``) built from ``get_config()``'s dict."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown optimizer {name!r} in saved state")
    if not isinstance(config, dict):
        raise ValueError(f"{name} optimizer config must be a dict of its arguments, got {config!r}")
    klass = _BY_NAME[name]
    known = set(inspect.signature(klass).parameters)
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"{name} optimizer has no argument {', '.join(map(repr, unknown))} "
                         f"(it takes {', '.join(sorted(known))})")
    return klass(**config)

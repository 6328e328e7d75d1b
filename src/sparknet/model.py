"""``Sequential``: a stack of layers over one flat parameter buffer and one flat gradient buffer."""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence, cast

import numpy as np

from sparknet import losses as losses_mod
from sparknet import optim as optim_mod
from sparknet import precision as precision_mod
from sparknet._model_file import read_model_file, write_model
from sparknet._validation import check_name, check_shape, non_negative_int, positive_int
from sparknet.activations import grad as act_grad
from sparknet.activations import is_softmax_head, softmax
from sparknet.epochs import fit_one_process
from sparknet.errors import InputRankError
from sparknet.history import History
from sparknet.layers.base import Layer, MaskedLayer, architecture, layers_from_config
from sparknet.losses import Loss
from sparknet.model_inputs import checked_input, checked_params, checked_state, prepare_y
from sparknet.optim import Optimizer
from sparknet.threads import blas_threads

#: what :meth:`Sequential.fit` takes as validation data: ``(X_val, y_val)`` or
#: ``(X_val, y_val, mask_val)``
ValidationData = Sequence[Any]
#: a callback of :meth:`Sequential.fit`: a :class:`sparknet.callbacks.Callback`, or
#: ``f(epoch, logs)`` run after each epoch (returning True stops training)
Callback = Any


#: what a name of Keras's or PyTorch's model API is in sparknet (``Sequential.__getattr__``)
_OTHER_APIS = {
    "compile": "give the optimizer and the loss to fit(), e.g. model.fit(X, y, epochs=10, "
               "optimizer=RMSprop(lr=1e-3), loss='cross_entropy'); the metrics are the loss "
               "and, for a classifier, accuracy",
    "train": "fit() trains (Dropout and BatchNormalization in training mode) and predict() / "
             "evaluate() run in inference mode; there is no mode to switch",
    "eval": "fit() trains (Dropout and BatchNormalization in training mode) and predict() / "
            "evaluate() run in inference mode; there is no mode to switch",
    "parameters": "the weights are one flat array, model.params (model.param_slices() says "
                  "where each layer's lie; model.set_params(flat) sets them)",
    "get_weights": "the weights are one flat array, model.params (model.param_slices() says "
                   "where each layer's lie; model.set_params(flat) sets them)",
}


class Sequential:
    """A linear stack of layers.

    All trainable parameters live in one contiguous flat array :attr:`params` and all
    gradients in another, :attr:`grads`; each layer holds views into them.  This makes
    a broadcast, an accumulator, a checkpoint or an optimizer step one array operation.

    Args:
        layers: the layers, first to last.
        input_shape: per-sample input shape (without the batch axis); if omitted the
            model is built on the first call to :meth:`fit` (or :meth:`build`).
        dtype: ``"float32"`` (default) or ``"float64"``.
        seed: seeds parameter initialisation and dropout; the same seed gives the
            same initial parameters.
        loss: default loss for :meth:`fit`/:meth:`evaluate` (``"cross_entropy"`` or
            ``"mse"``); if ``None``, cross-entropy when the last layer ends in softmax,
            MSE otherwise.

    Example::

        model = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")])
        history = model.fit(X, y, epochs=20, batch_size=64, validation_data=(Xv, yv))
        model.evaluate(Xv, yv)   # {'loss': ..., 'accuracy': ...}
    """

    def __init__(self, layers: Iterable[Layer] = (), input_shape: Sequence[int] | None = None,
                 dtype: Any = "float32", seed: int = 0, loss: "str | Loss | None" = None,
                 name: str = "sequential") -> None:
        self.layers: list[Layer] = []
        self.built = False
        if isinstance(layers, Layer):
            kind = type(layers).__name__
            raise TypeError(f"Sequential takes a list of layers, got a single {kind}: "
                            f"write Sequential([{kind}(...), ...])")
        for layer in layers:
            self.add(layer)
        try:  # np.dtype(None) would be float64
            self.dtype = np.dtype(object if dtype is None else dtype)
        except TypeError:
            self.dtype = np.dtype(object)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        self.seed = non_negative_int(seed, "seed")
        self.name = check_name(name, "Sequential name")
        self._loss = None if loss is None else losses_mod.get(loss)
        self.optimizer: Optimizer | None = None
        self.params: np.ndarray = np.zeros(0, dtype=self.dtype)
        self.grads: np.ndarray = np.zeros(0, dtype=self.dtype)
        #: arrays the layers keep but do not train (BatchNormalization's running statistics)
        self.state: np.ndarray = np.zeros(0, dtype=self.dtype)
        self._state_slices: list[dict[str, tuple[int, int, tuple[int, ...]]]] = []
        self.input_shape: tuple[int, ...] | None = None
        self.output_shape: tuple[int, ...] | None = None
        self._softmax_head = False
        self._slices: list[dict[str, tuple[int, int, tuple[int, ...]]]] = []
        self._out_mask: np.ndarray | None = None
        self._rng = np.random.default_rng(self.seed)
        if input_shape is not None:
            self.build(input_shape)

    # ------------------------------------------------------------------ build
    def __getattr__(self, name: str) -> Any:
        # called only for a name the model lacks: one a Keras or PyTorch user reaches for
        # gets its sparknet spelling
        hint = _OTHER_APIS.get(name)
        if hint is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise AttributeError(f"Sequential has no {name}(): {hint}")

    def add(self, layer: Layer) -> "Sequential":
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential takes Layer instances, got {type(layer).__name__}")
        if self.built:
            raise RuntimeError("cannot add a layer to a built model")
        self.layers.append(layer)
        return self

    def build(self, input_shape: Sequence[int]) -> "Sequential":
        """Build every layer for a per-sample ``input_shape``, allocate the flat buffers
        and initialise the parameters (seeded)."""
        if not self.layers:
            raise ValueError("a Sequential model needs at least one layer")
        shape = check_shape(input_shape, "input_shape")
        self.input_shape = shape
        specs: list[list[tuple[str, tuple[int, ...]]]] = []
        for i, layer in enumerate(self.layers):
            layer.rng = np.random.default_rng([self.seed, i, 1])
            try:
                shape = layer.build(shape, self.dtype)
            except InputRankError as exc:
                raise exc.at(i, f"layer {i} ({type(layer).__name__} {layer.name!r}): ") from exc
            except ValueError as exc:
                raise ValueError(f"layer {i} ({type(layer).__name__} {layer.name!r}): "
                                 f"{exc}") from exc
            specs.append(layer.param_specs())
        self.output_shape = shape
        n = sum(int(np.prod(s)) for sp in specs for _, s in sp)
        self.params = np.zeros(n, dtype=self.dtype)
        self.grads = np.zeros(n, dtype=self.dtype)
        self._slices = []
        off = 0
        for i, (layer, sp) in enumerate(zip(self.layers, specs)):
            pv: dict[str, np.ndarray] = {}
            gv: dict[str, np.ndarray] = {}
            sl: dict[str, tuple[int, int, tuple[int, ...]]] = {}
            for pname, pshape in sp:
                size = int(np.prod(pshape))
                pv[pname] = self.params[off:off + size].reshape(pshape)
                gv[pname] = self.grads[off:off + size].reshape(pshape)
                sl[pname] = (off, off + size, tuple(pshape))
                off += size
            self._slices.append(sl)
            layer.init_params(pv, np.random.default_rng([self.seed, i]))
            layer.bind(pv, gv)
        self._build_state()
        # a trailing softmax is fused into the loss: the last layer then emits logits
        last = self.layers[-1]
        self._softmax_head = False
        if is_softmax_head(last):
            last.emit_logits = True
            self._softmax_head = True
        self.built = True
        return self

    def _build_state(self) -> None:
        """Allocate the flat state buffer and bind each layer's state views."""
        specs = [layer.state_specs() for layer in self.layers]
        self.state = np.zeros(sum(int(np.prod(s)) for sp in specs for _, s in sp), dtype=self.dtype)
        self._state_slices = []
        off = 0
        for layer, sp in zip(self.layers, specs):
            views: dict[str, np.ndarray] = {}
            sl: dict[str, tuple[int, int, tuple[int, ...]]] = {}
            for sname, sshape in sp:
                size = int(np.prod(sshape))
                views[sname] = self.state[off:off + size].reshape(sshape)
                sl[sname] = (off, off + size, tuple(sshape))
                off += size
            self._state_slices.append(sl)
            layer.init_state(views)
            layer.bind_state(views)

    def _ensure_built(self, X: np.ndarray) -> None:
        if not self.built:
            if X.ndim < 2 and not (self.layers and self.layers[0].accepts_int_input):
                raise ValueError(f"X has shape {X.shape}: one value per sample; the model takes "
                                 f"(N, features...): for one feature use X.reshape(-1, 1)")
            self.build(X.shape[1:])

    @property
    def n_params(self) -> int:
        return int(self.params.shape[0])

    def param_slices(self) -> list[dict[str, tuple[int, int, tuple[int, ...]]]]:
        """For each layer, ``{name: (start, stop, shape)}`` of its parameters in :attr:`params`."""
        return self._slices

    @property
    def n_state(self) -> int:
        """Length of :attr:`state`: the values the layers keep but do not train."""
        return int(self.state.shape[0])

    def state_slices(self) -> list[dict[str, tuple[int, int, tuple[int, ...]]]]:
        """For each layer, ``{name: (start, stop, shape)}`` of its state in :attr:`state`."""
        return self._state_slices

    # ---------------------------------------------------------------- loss
    @property
    def loss(self) -> Loss:
        return losses_mod.or_default(self._loss, self._softmax_head)

    @property
    def is_classifier(self) -> bool:
        """Whether the loss takes class ids: the given loss's kind, else whether the last layer
        is a softmax the loss takes over (known before the model is built)."""
        if self._loss is not None:
            return self._loss.is_classification
        return bool(self.layers) and is_softmax_head(self.layers[-1])

    # ----------------------------------------------------- forward/backward
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        """Run the layers.  Returns logits when the last layer ends in softmax."""
        for layer in self.layers:
            if layer.supports_masking:
                x = cast(MaskedLayer, layer).forward(x, training=training, mask=mask)
            else:
                x = layer.forward(x, training=training)
            mask = layer.compute_mask(mask)
        self._out_mask = mask
        return x

    def backward(self, dout: np.ndarray, input_grad: bool = True) -> np.ndarray | None:
        """Backpropagate ``dout`` (gradient w.r.t. the output of :meth:`forward`);
        fills :attr:`grads` and returns the gradient w.r.t. the input (``None`` when
        ``input_grad`` is false: the first layer then skips computing it)."""
        first = self.layers[0]
        first.need_input_grad = bool(input_grad)
        d: np.ndarray | None = dout
        try:
            for layer in reversed(self.layers):
                assert d is not None, f"layer {layer.name!r} got no output gradient"
                d = layer.backward(d)
        finally:
            first.need_input_grad = True
        return d if input_grad else None

    def _built_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.input_shape is None or self.output_shape is None:
            raise RuntimeError("the model is not built yet: call fit() or build(input_shape) first")
        return self.input_shape, self.output_shape

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray, loss: "Loss | None" = None,
                      mask: np.ndarray | None = None, sample_weight: np.ndarray | None = None,
                      scale: float | None = None, need_grad: bool = True,
                      training: bool = True) -> tuple[float, float, float]:
        """Forward, loss and (optionally) backward on one batch of *validated* arrays.

        Returns ``(loss_sum, weight_sum, n_correct)``; :attr:`grads` then holds
        ``scale * d(loss_sum)/d(params)`` (``scale`` defaults to ``1 / weight_sum``,
        the gradient of the mean loss).  ``n_correct`` is NaN for regression.
        """
        loss = loss or self.loss
        out = self.forward(x, training=training, mask=mask)
        weight = self._out_mask
        if sample_weight is not None:
            sw = np.asarray(sample_weight, dtype=self.dtype)
            sw = sw.reshape(sw.shape + (1,) * (out.ndim - 1 - sw.ndim))
            weight = np.broadcast_to(sw, out.shape[:-1]) * (1 if weight is None else weight)
        if weight is not None:
            weight = np.ascontiguousarray(weight, dtype=self.dtype)
        pred = out
        if self._softmax_head and not loss.is_classification:
            pred = softmax(out)
        s, w, g = loss.value_and_grad(pred, y, weight=weight, scale=scale, need_grad=need_grad)
        if g is not None:
            if pred is not out:
                g = act_grad("softmax", pred, g)
            self.backward(g, input_grad=False)
        correct = float("nan")
        if loss.is_classification:
            hit = (out.argmax(axis=-1) == y)
            correct = float(hit.sum() if weight is None else (hit * weight).sum())
        return float(s), float(w), correct

    def train_on_batch(self, x: np.ndarray, y: np.ndarray,
                       optimizer: "Optimizer | str | None" = None,
                       loss: "Loss | str | None" = None, mask: np.ndarray | None = None,
                       sample_weight: np.ndarray | None = None) -> tuple[float, float]:
        """One optimizer step on a validated batch; returns (mean loss, accuracy)."""
        opt = optimizer if isinstance(optimizer, Optimizer) else self._get_optimizer(optimizer)
        lo = losses_mod.get(loss) if loss is not None else self.loss
        s, w, c = self.loss_and_grad(x, y, lo, mask=mask, sample_weight=sample_weight)
        opt.step(self.params, self.grads)
        return (s / w if w else 0.0), (c / w if w else float("nan"))

    def _get_optimizer(self, optimizer: "Optimizer | str | None") -> Optimizer:
        if optimizer is None:
            if self.optimizer is None:
                self.optimizer = optim_mod.RMSprop()
            return self.optimizer
        opt = optim_mod.get(optimizer)
        self.optimizer = opt
        return opt

    # --------------------------------------------------------------- train
    def fit(self, X: Any, y: Any, epochs: int = 10, batch_size: int = 32,
            validation_data: ValidationData | None = None,
            optimizer: "Optimizer | str | None" = None,
            loss: "Loss | str | None" = None, shuffle: bool = True, mask: Any = None,
            sample_weight: Any = None, verbose: int = 1,
            callbacks: Sequence[Callback] = (), num_threads: int | None = 0,
            precision: str = "fp32", validation_split: float = 0.0) -> History:
        """Train with minibatch gradient descent.

        Args:
            X: inputs, ``(N, *input_shape)``.
            y: class ids ``(N,)`` (or ``(N, T)`` for per-step outputs) for cross-entropy;
                targets shaped like the output for MSE.
            epochs: passes over the data.
            batch_size: samples per optimizer step.
            validation_data: ``(X_val, y_val)`` or ``(X_val, y_val, mask_val)``, evaluated
                after every epoch.
            optimizer: an :class:`~sparknet.optim.Optimizer` or its name; default RMSprop
                (kept on the model, so a second ``fit`` continues its state).
            loss: ``"cross_entropy"``, ``"mse"`` or a :class:`~sparknet.losses.Loss`;
                becomes the model's loss.
            shuffle: reshuffle every epoch (seeded by the model's seed).
            mask: ``(N, T)`` mask of valid time steps for sequence input.
            sample_weight: ``(N,)`` per-sample weights.
            verbose: 0 silent, 1 a live progress bar and a line per epoch (stderr), 2 the
                line per epoch alone (stdout) (:class:`~sparknet.progress.FitProgress`).
            callbacks: :class:`sparknet.callbacks.Callback` objects (``on_batch_end``
                after every step; a per-step ``LearningRateScheduler`` sets every step's
                rate) or callables ``f(epoch, logs)`` run after each epoch (one returning
                ``True`` stops training).
            num_threads: BLAS threads while training (default:
                :func:`sparknet.threads.get_num_threads`, one unless changed; ``None`` leaves
                BLAS alone).
            precision: ``"fp32"`` (default) or ``"bf16"``: the matrix products of the dense,
                convolution and recurrent layers take bfloat16 operands and accumulate in
                float32; weights, gradients, optimizer state, losses stay float32 (see
                :mod:`sparknet.precision`).  Needs a float32 model; on a CPU without
                AVX512-BF16 it trains in float32 and warns once.
            validation_split: as Keras: the fraction (in ``[0, 1)``) of the samples held out
                as validation data, the *last* ones of ``X`` and ``y`` (before shuffling),
                evaluated after every epoch like ``validation_data`` (which it replaces).

        Returns:
            :class:`History` with ``loss``, ``accuracy`` (classification), ``val_loss``,
            ``val_accuracy``, ``time`` and ``lr`` (the rate of the epoch's first step) per epoch.

        Raises:
            ValueError: for any bad argument or data (naming it), before the first step.
            sparknet.errors.TrainingDiverged: a loss, gradient or parameter became NaN or
                infinite (the error names the epoch and step); the model keeps the last
                weights whose loss was finite, and the optimizer its state of then: a
                non-finite loss at step ``k`` (computed at the weights step ``k - 1`` made)
                puts back those of before step ``k - 1`` (:mod:`sparknet.divergence`).
        """
        if num_threads is not None:
            num_threads = non_negative_int(num_threads, "num_threads")
        if precision_mod.check_precision(precision) == "bf16" and self.dtype != np.float32:
            raise ValueError(f"precision='bf16' trains float32 models; this model is "
                             f"{self.dtype.name} (build it with dtype='float32')")
        precision = precision_mod.resolve(precision)  # "fp32", warning once, without bf16
        with blas_threads(num_threads), precision_mod.autocast(precision):
            return fit_one_process(self, X, y, epochs, batch_size, validation_data, optimizer,
                                   loss, shuffle, mask, sample_weight, verbose, callbacks,
                                   validation_split)

    # ----------------------------------------------------------- inference
    def _batched_forward(self, X: np.ndarray, batch_size: int,
                         mask: np.ndarray | None = None) -> np.ndarray:
        outs = []
        with blas_threads():
            for i in range(0, X.shape[0], batch_size):
                mb = None if mask is None else mask[i:i + batch_size]
                outs.append(np.array(self.forward(X[i:i + batch_size], training=False, mask=mb)))
        return np.concatenate(outs, axis=0)

    def predict_output(self, X: Any, batch_size: int = 512, mask: Any = None) -> np.ndarray:
        """The network's output for ``X`` (probabilities when it ends in softmax)."""
        X, mask = checked_input(self, X, mask)
        out = self._batched_forward(X, positive_int(batch_size, "batch_size"), mask)
        return softmax(out) if self._softmax_head else out

    def predict_proba(self, X: Any, batch_size: int = 512, mask: Any = None) -> np.ndarray:
        """Class probabilities (softmax of the logits), shape ``(N, ..., classes)``."""
        X, mask = checked_input(self, X, mask)
        return softmax(self._batched_forward(X, positive_int(batch_size, "batch_size"), mask))

    def predict(self, X: Any, batch_size: int = 512, mask: Any = None) -> np.ndarray:
        """Class ids for a classifier (argmax of the output), raw outputs for regression."""
        if self.is_classifier:
            X, mask = checked_input(self, X, mask)
            out = self._batched_forward(X, positive_int(batch_size, "batch_size"), mask)
            return out.argmax(axis=-1)
        return self.predict_output(X, batch_size, mask)

    def evaluate(self, X: Any, y: Any, batch_size: int = 512, mask: Any = None,
                 loss: "Loss | str | None" = None, _validated: bool = False) -> dict[str, float]:
        """Mean loss (and accuracy for classifiers) on ``(X, y)`` without training."""
        lo = losses_mod.get(loss) if loss is not None else self.loss
        if not _validated:
            X, mask = checked_input(self, X, mask)
            y = prepare_y(self, y, X.shape[0], lo)
        batch_size = positive_int(batch_size, "batch_size")
        tot_s = tot_w = tot_c = 0.0
        precision_mod.next_step()  # bf16 copies of the weights (fit's validation) are stale
        with blas_threads():
            for i in range(0, X.shape[0], batch_size):
                mb = None if mask is None else mask[i:i + batch_size]
                s, w, c = self.loss_and_grad(X[i:i + batch_size], y[i:i + batch_size], lo, mask=mb,
                                             need_grad=False, training=False)
                tot_s, tot_w, tot_c = tot_s + s, tot_w + w, tot_c + c
        res = {"loss": tot_s / max(tot_w, 1e-12)}
        if lo.is_classification:
            res["accuracy"] = tot_c / max(tot_w, 1e-12)
        return res

    # ------------------------------------------------------- serialisation
    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable architecture (layers, shapes, dtype, seed, loss)."""
        return architecture(self.layers, input_shape=self.input_shape, dtype=self.dtype,
                            seed=self.seed, loss=self._loss, name=self.name)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Sequential":
        return cls(layers_from_config(config["layers"]), input_shape=config.get("input_shape"),
                   dtype=config.get("dtype", "float32"), seed=config.get("seed", 0),
                   loss=config.get("loss"), name=config.get("name", "sequential"))

    def clone(self, dtype: Any = None) -> "Sequential":
        """A new model with the same architecture and a copy of the parameters."""
        cfg = self.get_config()
        if dtype is not None:
            cfg["dtype"] = np.dtype(dtype).name
        other = Sequential.from_config(cfg)
        if self.built:
            other.params[...] = self.params
            other.state[...] = self.state
        return other

    def set_params(self, flat: np.ndarray) -> None:
        """Copy a flat parameter vector into the model."""
        self.params[...] = checked_params(self, flat)

    def set_state(self, flat: np.ndarray) -> None:
        """Copy a flat state vector (see :attr:`state`) into the model."""
        self.state[...] = checked_state(self, flat)

    def state_dict(self) -> dict[str, Any]:
        """The model's state for a checkpoint (:mod:`sparknet.stateful`): ``params``,
        ``state`` (when its layers keep running statistics; copies) and ``rng`` (the state
        of the generator that shuffles one-process :meth:`fit`)."""
        out: dict[str, Any] = {"params": np.array(self.params, copy=True)}
        if self.n_state:
            out["state"] = np.array(self.state, copy=True)
        return {**out, "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave (checked as :meth:`set_params` and
        :meth:`set_state` check; a model keeping running statistics needs its ``state``)."""
        if "params" not in state:
            raise ValueError("the model's state holds no 'params'")
        if self.n_state and "state" not in state:
            raise ValueError(f"the model's state holds no layer state (running statistics); "
                             f"the model keeps {self.n_state:,} values")
        self.set_params(state["params"])
        if "state" in state:
            self.set_state(state["state"])
        if state.get("rng"):
            self._rng.bit_generator.state = dict(state["rng"])

    def save(self, path: str | os.PathLike[str], optimizer: "Optimizer | None" = None) -> None:
        """Write the model (and optionally an optimizer's state) to ``path`` atomically;
        see :func:`sparknet.io.save_model`."""
        write_model(self, path, optimizer=optimizer)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Sequential":
        """Read a model written by :meth:`save` (no code is run: no pickle)."""
        return cast("Sequential", read_model_file(path, cls.from_config))

    def summary(self) -> str:
        """A table of layers, output shapes and parameter counts."""
        lines = [f"Model {self.name!r} ({self.dtype.name})",
                 f"{'layer':<28}{'output shape':<22}{'params':>10}"]
        for layer in self.layers:
            shape = str(layer.output_shape) if layer.built else "?"
            label = f"{type(layer).__name__} {layer.name}"
            n = layer.n_params if layer.built else 0
            lines.append(f"{label:<28}{shape:<22}{n:>10}")
        lines.append(f"total parameters: {self.n_params}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Sequential([{', '.join(repr(l) for l in self.layers)}])"


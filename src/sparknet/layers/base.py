"""The layer protocol every sparknet layer follows.

A layer is built once for a per-sample input shape, declares the parameter
arrays it needs (:meth:`Layer.param_specs`), and is then *bound* to views of
the model's single flat parameter buffer and single flat gradient buffer.
``forward`` keeps what ``backward`` needs; ``backward(dy)`` overwrites the
layer's gradient views for the last batch and returns ``dx``.  ``backward``
may overwrite ``dy``.

A layer may also keep arrays that are not trained (BatchNormalization's running
statistics): it declares them with :meth:`Layer.state_specs` and is bound to views of
the model's flat *state* buffer (``bind_state``), which model files,
checkpoints and the trainers carry beside the parameters.  ``forward(x, training=True)``
may update them in place; nothing else writes them.
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from sparknet._validation import check_name

#: ``(name, shape)`` of one parameter array
ParamSpec = tuple[str, tuple[int, ...]]

#: layer class name -> class, for rebuilding a model from its JSON architecture
REGISTRY: dict[str, type["Layer"]] = {}


def register(cls: type["Layer"]) -> type["Layer"]:
    """Class decorator: make a layer loadable from a saved architecture."""
    REGISTRY[cls.__name__] = cls
    return cls


class Layer:
    """Base class.  Subclasses implement ``_build``, ``forward``, ``backward``, ``get_config``.

    Attributes set by :meth:`build`: ``input_shape`` and ``output_shape`` (per sample,
    without the batch axis) and ``dtype``.  After :meth:`bind`, ``params`` and
    ``grads`` map parameter names to views of the model's flat buffers.
    """

    #: True for layers whose ``forward`` takes a ``mask=`` (N, T) argument
    supports_masking: ClassVar[bool] = False
    #: True for layers that take integer input (token ids)
    accepts_int_input: ClassVar[bool] = False
    #: Sequential sets this to False on its first layer while training: ``backward`` may
    #: then skip computing the input gradient (and return None)
    need_input_grad: bool = True

    def __init__(self, name: str | None = None) -> None:
        self.name = check_name(name, "layer name") if name else type(self).__name__.lower()
        self.built = False
        self.input_shape: tuple[int, ...] | None = None
        self.output_shape: tuple[int, ...] | None = None
        self.dtype: np.dtype = np.dtype(np.float32)
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        self.rng: np.random.Generator = np.random.default_rng(0)

    # -- construction -----------------------------------------------------
    def build(self, input_shape: tuple[int, ...], dtype: Any = np.float32) -> tuple[int, ...]:
        """Fix the per-sample input shape; returns the per-sample output shape."""
        self.input_shape = tuple(int(d) for d in input_shape)
        self.dtype = np.dtype(dtype)
        self.output_shape = tuple(int(d) for d in self._build(self.input_shape))
        self.built = True
        return self.output_shape

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return input_shape

    def param_specs(self) -> list[ParamSpec]:
        """``[(name, shape), ...]`` of the parameter arrays this layer owns (after build)."""
        return []

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        """Fill freshly allocated parameter views in place (seeded by the model)."""

    def bind(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.params = params
        self.grads = grads

    def state_specs(self) -> list[ParamSpec]:
        """``[(name, shape), ...]`` of the arrays this layer keeps but does not train
        (after build); empty for most layers."""
        return []

    def init_state(self, state: dict[str, np.ndarray]) -> None:
        """Fill freshly allocated state views in place (the buffer starts at zero)."""

    def bind_state(self, state: dict[str, np.ndarray]) -> None:
        self.state = state

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        """The (N, T) mask that applies to this layer's output, given its input's."""
        return mask

    def check_input(self, x: np.ndarray) -> None:
        """Check a whole input array before training or inference starts (the first layer
        only); raises ``ValueError`` for values the layer would refuse batch by batch (token
        ids out of range).  The default accepts anything ``forward`` takes."""

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        """The gradient with respect to the input, or None when :attr:`need_input_grad`
        is False (or the input has none, as token ids)."""
        raise NotImplementedError

    # -- (de)serialisation ------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments."""
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Layer":
        return cls(**config)

    @property
    def n_params(self) -> int:
        return int(sum(int(np.prod(s)) for _, s in self.param_specs()))

    @property
    def n_state(self) -> int:
        return int(sum(int(np.prod(s)) for _, s in self.state_specs()))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}({args})"

    def _check_built(self) -> None:
        if not self.built:
            raise RuntimeError(f"layer {self.name!r} is not built; add it to a Sequential model "
                               "first")

    def _shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(input_shape, output_shape)`` of the built layer (RuntimeError before
        :meth:`build`)."""
        self._check_built()
        assert self.input_shape is not None and self.output_shape is not None
        return self.input_shape, self.output_shape


def layer_to_config(layer: Layer) -> dict[str, Any]:
    """``{"class": ..., "config": ...}``: one layer of a saved architecture."""
    return {"class": type(layer).__name__, "config": layer.get_config()}


def custom_layer_classes(config: Any) -> dict[str, type[Layer]]:
    """The registered layer classes that ``config`` (an architecture, or any part of one,
    nested layers included) names and that are not sparknet's own, by name."""
    found: dict[str, type[Layer]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("class")
            klass = REGISTRY.get(name) if isinstance(name, str) else None
            if klass is not None and "config" in node and not (
                    klass.__module__ == "sparknet" or klass.__module__.startswith("sparknet.")):
                found[str(name)] = klass
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(config)
    return found


def layer_from_config(spec: Any, where: str = "layer") -> Layer:
    """The layer a :func:`layer_to_config` entry describes (``where`` names it in errors)."""
    if not isinstance(spec, dict) or "class" not in spec or "config" not in spec:
        raise ValueError(f"{where}: expected {{'class': ..., 'config': {{...}}}}, got {spec!r}")
    klass = REGISTRY.get(spec["class"])
    if klass is None:
        raise ValueError(f"unknown layer class {spec['class']!r} in model architecture")
    if not isinstance(spec["config"], dict):
        raise ValueError(f"{where} ({spec['class']}): config must be a dict of its arguments, "
                         f"got {spec['config']!r}")
    return klass.from_config(dict(spec["config"]))


class MaskedLayer(Protocol):
    """What a layer with ``supports_masking = True`` provides: a ``forward`` taking the
    ``(N, T)`` mask of its input (None when every step is real)."""

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray: ...


def architecture(layers: Sequence[Layer], *, input_shape: Sequence[int] | None, dtype: Any,
                 seed: int | None, loss: Any, name: str = "sequential") -> dict[str, Any]:
    """The JSON architecture of a stack of layers: what :meth:`Sequential.get_config` returns
    and :meth:`Sequential.from_config` reads (model files, workers, model-parallel saves)."""
    return {
        "name": name, "dtype": np.dtype(dtype).name, "seed": seed,
        "input_shape": list(input_shape) if input_shape else None,
        "loss": getattr(loss, "name", loss),
        "layers": [layer_to_config(l) for l in layers],
    }


def layers_from_config(specs: Sequence[dict[str, Any]]) -> list[Layer]:
    """Layers rebuilt from the ``"layers"`` list of an :func:`architecture`."""
    return [layer_from_config(spec, f"layer {i}") for i, spec in enumerate(specs)]

"""A Keras 3 model as a sparknet model (:func:`from_keras`).

Keras and sparknet are both channels-last, so convolution kernels keep their layout; what
differs: Dense kernels are ``(in, units)`` (sparknet: ``(units, in)``), recurrent kernels
are ``(in, gates * units)`` with one bias (sparknet: torch's ``(gates * units, in)`` with
two), GRU's gates are ordered z, r, h (sparknet: r, z, n), and BatchNormalization's
``momentum`` is the weight of the running average (sparknet: of the batch,
``1 - momentum``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from sparknet.activations import INPUT_ACTIVATIONS
from sparknet.interop._keras_graph import attention, chain_of, layers_of
from sparknet.layers import (
    GRU,
    LSTM,
    Activation,
    AvgPool1D,
    AvgPool2D,
    BatchNormalization,
    Bidirectional,
    Conv1D,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    Layer,
    LayerNormalization,
    LeakyReLU,
    MaxPool1D,
    MaxPool2D,
    RMSNormalization,
    SimpleRNN,
    ZeroPadding1D,
    ZeroPadding2D,
)
from sparknet.model import Sequential

#: Keras activation names -> sparknet's
_ACTIVATIONS = {
    "linear": "identity",
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "softmax": "softmax",
    "gelu": "gelu",
    "silu": "silu",
    "swish": "silu",
}


def _np(v: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64)


def _where(k: Any) -> str:
    return f"Keras layer {k.name!r} ({type(k).__name__})"


def _activation(k: Any, fn: Any = None) -> str:
    import keras

    name = keras.activations.serialize(fn if fn is not None else k.activation)
    name = name if isinstance(name, str) else name.get("config", name.get("class_name"))
    if name == "gelu" and getattr(k, "approximate", False):
        name = "gelu_tanh"
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"{_where(k)}: activation {name!r} has no sparknet equivalent "
            f"({', '.join(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[name]


def _channels_last(k: Any) -> None:
    if getattr(k, "data_format", "channels_last") != "channels_last":
        raise ValueError(f"{_where(k)}: data_format={k.data_format!r}; sparknet is channels_last")


def _dense(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    layer = Dense(k.units, activation=_activation(k), use_bias=k.use_bias)

    def setter() -> None:
        layer.params["kernel"][...] = _np(k.kernel).T
        if k.use_bias:
            layer.params["bias"][...] = _np(k.bias)

    return layer, setter


def _conv_activation(k: Any) -> str:
    """The activation a convolution applies itself: not the gelus and silu, whose derivative
    needs the pre-activation a convolution does not keep (:func:`_after` adds them)."""
    act = _activation(k)
    return "identity" if act in INPUT_ACTIVATIONS else act


def _after(k: Any) -> list[Layer]:
    """The layers that follow Keras layer ``k``'s own: a convolution's gelu or silu."""
    import keras

    if isinstance(k, (keras.layers.Conv1D, keras.layers.Conv2D)):
        act = _activation(k)
        if act in INPUT_ACTIVATIONS:
            return [Activation(act)]
    return []


def _conv(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    _channels_last(k)
    if k.groups != 1 or k.padding not in ("valid", "same"):
        raise ValueError(
            f"{_where(k)}: groups={k.groups}, padding={k.padding!r}; sparknet convolutions "
            f"have groups=1 and 'valid' or 'same' padding"
        )
    one = len(k.kernel_size) == 1
    kind: Any = Conv1D if one else Conv2D
    pick = (lambda v: v[0]) if one else (lambda v: tuple(v))
    layer = kind(
        k.filters,
        pick(k.kernel_size),
        strides=pick(k.strides),
        padding=k.padding,
        dilation=pick(k.dilation_rate),
        activation=_conv_activation(k),
        use_bias=k.use_bias,
    )

    def setter() -> None:
        layer.params["kernel"][...] = _np(k.kernel)
        if k.use_bias:
            layer.params["bias"][...] = _np(k.bias)

    return layer, setter


def _pool(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    import keras

    _channels_last(k)
    is_max = isinstance(k, (keras.layers.MaxPooling1D, keras.layers.MaxPooling2D))
    one = len(k.pool_size) == 1
    kind: Any = {
        (True, True): MaxPool1D,
        (True, False): MaxPool2D,
        (False, True): AvgPool1D,
        (False, False): AvgPool2D,
    }[(is_max, one)]
    pick = (lambda v: v[0]) if one else (lambda v: tuple(v))
    return kind(pick(k.pool_size), strides=pick(k.strides), padding=k.padding), None


def _global(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    import keras

    _channels_last(k)
    if getattr(k, "keepdims", False):
        raise ValueError(f"{_where(k)}: keepdims=True; sparknet's global pools give (N, C)")
    L = keras.layers
    kind: Any = {
        L.GlobalAveragePooling1D: GlobalAveragePooling1D,
        L.GlobalMaxPooling1D: GlobalMaxPooling1D,
        L.GlobalAveragePooling2D: GlobalAveragePooling2D,
        L.GlobalMaxPooling2D: GlobalMaxPooling2D,
    }[type(k)]
    return kind(), None


def _gates(a: np.ndarray, order: tuple[int, ...], H: int) -> np.ndarray:
    """The gate blocks of ``H`` rows of ``a`` reordered."""
    return np.concatenate([a[g * H : (g + 1) * H] for g in order], axis=0)


def _cell(
    k: Any, backward: bool = False
) -> tuple[SimpleRNN | LSTM | GRU, Callable[[SimpleRNN | LSTM | GRU], None]]:
    """A sparknet recurrent layer for the Keras one ``k``, and how to fill its weights
    (``backward``: the backward direction of a Bidirectional, which reads backwards)."""
    import keras

    if getattr(k, "go_backwards", False) != backward:
        raise ValueError(
            f"{_where(k)}: go_backwards=True has no sparknet equivalent (use Bidirectional)"
        )
    cell = k.cell
    H = cell.units
    kw = dict(return_sequences=k.return_sequences, stateful=k.stateful)
    order: tuple[int, ...] = (0,)
    layer: SimpleRNN | LSTM | GRU
    if isinstance(k, keras.layers.SimpleRNN):
        layer = SimpleRNN(H, activation=_activation(k, cell.activation), **kw)
    else:
        if (
            _activation(k, cell.activation) != "tanh"
            or _activation(k, cell.recurrent_activation) != "sigmoid"
        ):
            raise ValueError(
                f"{_where(k)}: sparknet's gates use sigmoid and its cell tanh "
                f"(activation='tanh', recurrent_activation='sigmoid')"
            )
        if isinstance(k, keras.layers.LSTM):
            if getattr(k, "return_state", False):
                raise ValueError(
                    f"{_where(k)}: return_state=True (several outputs); a sparknet layer has one"
                )
            layer, order = LSTM(H, **kw), (0, 1, 2, 3)  # i, f, c, o: torch's i, f, g, o
        else:
            if not cell.reset_after:
                raise ValueError(
                    f"{_where(k)}: reset_after=False (the reset gate before the recurrent "
                    f"product); sparknet's GRU is reset_after=True, Keras' default"
                )
            layer, order = GRU(H, **kw), (1, 0, 2)  # z, r, h -> r, z, n

    def fill(target: SimpleRNN | LSTM | GRU) -> None:
        p = target.params
        p["weight_ih"][...] = _gates(_np(cell.kernel).T, order, H)
        p["weight_hh"][...] = _gates(_np(cell.recurrent_kernel).T, order, H)
        p["bias_ih"][...] = p["bias_hh"][...] = 0
        if cell.use_bias:
            b = _np(cell.bias)
            if b.ndim == 2:  # GRU reset_after: input, recurrent
                p["bias_ih"][...] = _gates(b[0], order, H)
                p["bias_hh"][...] = _gates(b[1], order, H)
            else:
                p["bias_ih"][...] = _gates(b, order, H)

    return layer, fill


def _recurrent(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    layer, fill = _cell(k)
    return layer, lambda: fill(layer)


def _bidirectional(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    if k.merge_mode not in ("concat", "sum"):
        raise ValueError(
            f"{_where(k)}: merge_mode={k.merge_mode!r}; sparknet merges by 'concat' or 'sum'"
        )
    fwd, fill_f = _cell(k.forward_layer)
    _, fill_b = _cell(k.backward_layer, backward=True)
    layer = Bidirectional(fwd, merge_mode=k.merge_mode)

    def setter() -> None:
        fill_f(layer.forward_layer)
        fill_b(layer.backward_layer)

    return layer, setter


def _axis_last(k: Any) -> None:
    axis = k.axis if isinstance(k.axis, int) else (k.axis[0] if len(k.axis) == 1 else None)
    if axis not in (-1, len(k.input.shape) - 1):
        raise ValueError(f"{_where(k)}: axis={k.axis}; sparknet normalises the last axis")


def _batch_norm(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    _axis_last(k)
    layer = BatchNormalization(
        momentum=1.0 - k.momentum, eps=k.epsilon, center=k.center, scale=k.scale
    )

    def setter() -> None:
        if k.scale:
            layer.params["gamma"][...] = _np(k.gamma)
        if k.center:
            layer.params["beta"][...] = _np(k.beta)
        layer.state["running_mean"][...] = _np(k.moving_mean)
        layer.state["running_var"][...] = _np(k.moving_variance)

    return layer, setter


def _layer_norm(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    _axis_last(k)
    if getattr(k, "rms_scaling", False):
        raise ValueError(
            f"{_where(k)}: rms_scaling=True has no sparknet equivalent (Keras deprecates it; "
            f"keras.layers.RMSNormalization comes in as sparknet's RMSNormalization)"
        )
    layer = LayerNormalization(eps=k.epsilon, center=k.center, scale=k.scale)

    def setter() -> None:
        if k.scale:
            layer.params["gamma"][...] = _np(k.gamma)
        if k.center:
            layer.params["beta"][...] = _np(k.beta)

    return layer, setter


def _rms_norm(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    _axis_last(k)
    layer = RMSNormalization(eps=k.epsilon)
    return layer, lambda: layer.params["gamma"].__setitem__(Ellipsis, _np(k.scale))


def _embedding(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    layer = Embedding(k.input_dim, k.output_dim, mask_zero=k.mask_zero)
    return layer, lambda: layer.params["embeddings"].__setitem__(Ellipsis, _np(k.embeddings))


def _leaky(k: Any, slope: float) -> Layer:
    if not 0.0 <= float(slope) <= 1.0:
        raise ValueError(
            f"{_where(k)}: negative_slope={slope}; sparknet's LeakyReLU takes a slope in [0, 1]"
        )
    return LeakyReLU(float(slope))


def _zero_padding(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    import keras

    if isinstance(k, keras.layers.ZeroPadding1D):  # padding (before, after)
        return ZeroPadding1D(tuple(int(p) for p in k.padding)), None
    _channels_last(k)  # padding ((top, bottom), (left, right))
    return ZeroPadding2D(tuple(tuple(int(p) for p in side) for side in k.padding)), None


def _activation_layer(k: Any) -> tuple[Layer, Callable[[], None] | None]:
    import keras

    if isinstance(k, keras.layers.Softmax):
        if k.axis not in (-1, len(k.input.shape) - 1):
            raise ValueError(
                f"{_where(k)}: axis={k.axis}; sparknet's softmax is over the last axis"
            )
        return Activation("softmax"), None
    if isinstance(k, keras.layers.LeakyReLU):
        return _leaky(k, k.negative_slope), None
    if isinstance(k, keras.layers.ReLU):
        if k.max_value is not None or k.threshold:
            raise ValueError(f"{_where(k)}: max_value and threshold have no sparknet equivalent")
        return (_leaky(k, k.negative_slope) if k.negative_slope else Activation("relu")), None
    return Activation(_activation(k)), None


def _converters() -> dict[type, Callable[[Any], tuple[Layer, Callable[[], None] | None]]]:
    import keras

    L = keras.layers
    return {
        L.Dense: _dense,
        L.Conv1D: _conv,
        L.Conv2D: _conv,
        L.MaxPooling1D: _pool,
        L.MaxPooling2D: _pool,
        L.AveragePooling1D: _pool,
        L.AveragePooling2D: _pool,
        L.GlobalAveragePooling1D: _global,
        L.GlobalMaxPooling1D: _global,
        L.GlobalAveragePooling2D: _global,
        L.GlobalMaxPooling2D: _global,
        L.SimpleRNN: _recurrent,
        L.LSTM: _recurrent,
        L.GRU: _recurrent,
        L.Bidirectional: _bidirectional,
        L.BatchNormalization: _batch_norm,
        L.LayerNormalization: _layer_norm,
        L.RMSNormalization: _rms_norm,
        L.Embedding: _embedding,
        L.Dropout: lambda k: (Dropout(k.rate), None),
        L.Flatten: lambda k: (Flatten(), None),
        L.Activation: _activation_layer,
        L.Softmax: _activation_layer,
        L.ReLU: _activation_layer,
        L.LeakyReLU: _activation_layer,
        L.MultiHeadAttention: attention,
        L.ZeroPadding1D: _zero_padding,
        L.ZeroPadding2D: _zero_padding,
    }


def from_keras(model: Any, dtype: Any = None) -> Sequential:
    """A sparknet model computing what the built Keras 3 ``model`` computes (in inference).

    Args:
        model: a ``keras.Sequential``, or a functional ``keras.Model`` that is one chain
            (with skip connections ``Add()([x, f(x)])``, read as ``Residual`` blocks) of
            ``Dense``, ``Conv1D``, ``Conv2D``, ``MaxPooling1D/2D``, ``AveragePooling1D/2D``,
            ``GlobalAveragePooling1D/2D``, ``GlobalMaxPooling1D/2D``, ``SimpleRNN``, ``LSTM``,
            ``GRU`` (``reset_after=True``), ``Bidirectional`` (``concat`` or ``sum``),
            ``BatchNormalization``, ``LayerNormalization``, ``RMSNormalization``,
            ``Embedding``, ``Dropout``,
            ``Flatten``, ``ZeroPadding1D/2D``, ``Activation``, ``Softmax``, ``ReLU``,
            ``LeakyReLU`` layers and
            self-attention ``MultiHeadAttention`` (``mha(x, x)``, ``num_heads * key_dim``
            the input width) (channels-last, as sparknet), with a known input shape.
        dtype: the model's float type (default: float64 for a float64 Keras model, else
            float32).

    Raises:
        ValueError: the first layer sparknet has no equivalent for, or a setting it cannot
            express (named with the layer).
    """
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"from_keras takes a keras.Model, got {type(model).__name__}")
    try:
        shape = tuple(model.input_shape[1:])
    except (AttributeError, ValueError) as exc:
        raise ValueError(
            f"the Keras model has no input shape yet ({exc}): build it or give it an Input"
        ) from exc
    if any(d is None for d in shape):
        raise ValueError(
            f"the Keras model's input shape {model.input_shape} has unknown sizes: sparknet "
            f"models have a fixed per-sample shape"
        )
    converters = _converters()
    setters: list[Callable[[], None]] = []

    def convert(k: Any) -> list[Layer]:
        make = converters.get(type(k))
        if make is None:
            raise ValueError(f"{_where(k)} has no sparknet equivalent")
        layer, setter = make(k)
        if setter is not None:
            setters.append(setter)
        return [layer, *_after(k)]

    if isinstance(model, keras.Sequential):
        layers = [
            layer
            for k in model.layers
            if not isinstance(k, keras.layers.InputLayer)
            for layer in convert(k)
        ]
    else:
        layers = layers_of(chain_of(model), convert)
    if dtype is None:
        dtype = "float64" if getattr(model, "dtype", None) == "float64" else "float32"
    out = Sequential(layers, input_shape=shape, dtype=dtype)
    for setter in setters:
        setter()
    return out

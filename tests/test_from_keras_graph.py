"""from_keras of functional models that are not one plain chain: skip connections
(``Add()([x, f(x)])`` or ``x + f(x)``) as Residual blocks and self-attention, against
Keras' predict (float32, torch backend); what a graph cannot express is refused, naming
the layer."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import rel_error


def _encoder(keras, mask_zero):
    """A Transformer encoder block on token ids, as Keras' text-classification examples."""
    L = keras.layers
    inp = keras.Input((6,), dtype="int32")
    x = L.Embedding(12, 8, mask_zero=mask_zero)(inp)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    x = L.LayerNormalization(epsilon=1e-5)(L.Add()([x, a]))
    f = L.Dense(8)(L.Dense(16, activation="relu")(x))
    # x + f drops Keras' mask (the Add layer keeps it)
    x = L.LayerNormalization(epsilon=1e-5)(L.Add()([x, f]) if mask_zero else x + f)
    out = L.Dense(3, activation="softmax")(L.GlobalAveragePooling1D()(x))
    return keras.Model(inp, out)


def _resnet(keras):
    """An identity block, then a block that halves the image and widens it (with a
    projection shortcut, as Keras' ResNet applications)."""
    L = keras.layers
    inp = keras.Input((6, 6, 3))
    x = L.Conv2D(4, 3, padding="same", activation="relu")(inp)
    y = L.Conv2D(4, 3, padding="same")(x)
    y = L.Activation("relu")(L.BatchNormalization()(y))
    y = L.BatchNormalization()(L.Conv2D(4, 3, padding="same")(y))
    x = L.Activation("relu")(L.add([x, y]))
    shortcut = L.BatchNormalization()(L.Conv2D(6, 1, strides=2)(x))
    y = L.Conv2D(6, 3, strides=2, padding="same", activation="relu")(x)
    x = L.Activation("relu")(L.Add()([L.Conv2D(6, 3, padding="same")(y), shortcut]))
    return keras.Model(inp, L.Dense(2)(L.GlobalAveragePooling2D()(x)))


def _branches(keras):
    """Inception-style branches joined on the channels, then a SwiGLU-style gate."""
    L = keras.layers
    inp = keras.Input((6, 6, 3))
    x = L.Concatenate()([L.Conv2D(4, 1)(inp), L.Conv2D(2, 3, padding="same", activation="relu")(inp),
                         L.MaxPooling2D(3, 1, padding="same")(inp)])
    x = L.GlobalAveragePooling2D()(x)
    x = L.Multiply()([L.Dense(8, activation="silu")(x), L.Dense(8)(x)])
    return keras.Model(inp, L.Dense(2)(x))


@pytest.mark.parametrize("name", ["encoder", "masked encoder", "resnet block", "branches"])
def test_a_functional_model_with_skips_and_attention_predicts_as_keras(keras, name):
    km = {"resnet block": _resnet, "branches": _branches}.get(
        name, lambda k: _encoder(k, name == "masked encoder"))(keras)
    rng = np.random.default_rng(0)
    for w in km.weights:
        v = keras.ops.convert_to_numpy(w)
        w.assign(rng.uniform(0.5, 1.5, v.shape) if "variance" in w.path else rng.standard_normal(v.shape) * 0.4)
    if name == "branches":
        x = rng.standard_normal((5, 6, 6, 3)).astype(np.float32)
        kinds = ["Parallel", "GlobalAveragePooling2D", "Parallel", "Dense"]
    elif name == "resnet block":
        x = rng.standard_normal((5, 6, 6, 3)).astype(np.float32)
        kinds = ["Conv2D", "Residual", "Activation", "Residual", "Activation",
                 "GlobalAveragePooling2D", "Dense"]
    else:
        x = rng.integers(1, 12, (5, 6))
        x[0, 3:] = 0  # padding, where the mask is on
        x[1, 5:] = 0
        kinds = ["Embedding", "Residual", "LayerNormalization", "Residual",
                 "LayerNormalization", "GlobalAveragePooling1D", "Dense"]
    from sparknet.interop import from_keras

    model = from_keras(km)
    assert [type(layer).__name__ for layer in model.layers] == kinds
    if name == "resnet block":
        assert [type(layer).__name__ for layer in model.layers[3].shortcut] == [
            "Conv2D", "BatchNormalization"]
    err = rel_error(model.predict_output(x), km.predict(x, verbose=0))
    print(f"from_keras {name}: float32 rel {err:.1e}")
    assert err <= 1e-6


def test_what_a_keras_graph_cannot_express_is_named(keras):
    from sparknet.interop import from_keras

    L = keras.layers
    img, seq, vec = keras.Input((6, 6, 3)), keras.Input((5, 8)), keras.Input((8,))
    shared = L.Dense(8, name="shared")
    cases = [
        (keras.Model(img, L.Add(name="twice")([img, img])),
         r"'twice' \(Add\) adds a tensor to itself"),
        (keras.Model(seq, L.MultiHeadAttention(2, 8, name="mha")(seq, seq)),
         r"'mha' \(MultiHeadAttention\): num_heads \* key_dim = 2 \* 8 must equal the input "
         r"width 8.*use key_dim=4"),
        (keras.Model(seq, L.MultiHeadAttention(2, 4, name="mha")(seq, L.Dense(8)(seq))),
         r"'mha' \(MultiHeadAttention\) attends to another tensor than its queries"),
        (keras.Model(vec, shared(shared(vec))),
         r"'shared' \(Dense\) is called 2 times in the model; sparknet layers do not share"),
        (keras.Model(img, L.Concatenate(axis=1, name="cat")([img, L.Conv2D(3, 1)(img)])),
         r"'cat' \(Concatenate\): axis=1; sparknet joins branches on the last axis"),
        (keras.Model([vec, seq], L.Dense(2)(vec)), r"has 2 inputs and 1 outputs"),
        (keras.Model(vec, L.Dense(2)(vec * 2.0)),
         r"'dense\w*' \(Dense\) reads the output of Keras operation 'multiply\w*' \(Multiply\), "
         r"which has no sparknet equivalent"),
    ]
    ids = keras.Input((6,), dtype="int32")
    e = L.Embedding(12, 8, mask_zero=True)(ids)
    cases.append((keras.Model(ids, e + L.Dense(8)(e)),
                  r"x \+ y of masked tensors, which drops Keras' mask \(sparknet keeps it\): "
                  r"write keras.layers.Add\(\)\(\[x, y\]\)"))
    for km, message in cases:
        with pytest.raises(ValueError, match=message):
            from_keras(km)

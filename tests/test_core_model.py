"""Sequential end to end: accuracy on real data, determinism, model files, bad input."""
import json
import time
import zipfile

import numpy as np
import pytest

from sparknet import SGD, Dense, Dropout, RMSprop, Sequential, load_model
from sparknet.datasets import read_idx


def digits_mlp(seed=0):
    return Sequential([Dense(256, activation="relu"), Dropout(0.2), Dense(128, activation="relu"),
                       Dropout(0.2), Dense(10, activation="softmax")], seed=seed)


@pytest.fixture(scope="module")
def trained(digits):
    Xtr, ytr, Xte, yte = digits
    model = digits_mlp()
    t0 = time.perf_counter()
    history = model.fit(Xtr, ytr, epochs=40, batch_size=32, validation_data=(Xte, yte),
                        optimizer=RMSprop(lr=1e-3), verbose=0)
    return model, history, time.perf_counter() - t0


def test_mlp_reaches_97_percent_on_digits_within_60s(trained, digits):
    model, history, seconds = trained
    _, _, Xte, yte = digits
    acc = float((model.predict(Xte) == yte).mean())
    print(f"digits MLP: test accuracy {acc:.4f} in {seconds:.2f} s")
    assert acc >= 0.97
    assert seconds < 60
    assert model.evaluate(Xte, yte)["accuracy"] == pytest.approx(acc)


def test_history_records_every_epoch(trained):
    _, history, _ = trained
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "time"):
        assert len(history[key]) == 40, key
    assert history["loss"][-1] < history["loss"][0] / 5
    assert history["val_accuracy"][-1] > 0.95


def test_predict_proba_is_a_distribution(trained, digits):
    model, _, Xte, _ = (trained[0], None, digits[2], None)
    p = model.predict_proba(Xte[:50])
    assert p.shape == (50, 10)
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(p.argmax(1), model.predict(Xte[:50]))


def test_same_seed_same_model_different_seed_different(digits):
    Xtr, ytr, _, _ = digits
    a, b, c = digits_mlp(1), digits_mlp(1), digits_mlp(2)
    for m in (a, b, c):
        m.fit(Xtr[:300], ytr[:300], epochs=2, batch_size=32, verbose=0)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.allclose(a.params, c.params)


def test_params_are_one_flat_buffer_with_layer_views():
    model = Sequential([Dense(5), Dense(3)], input_shape=(4,))
    assert model.params.ndim == 1 and model.params.size == 4 * 5 + 5 + 5 * 3 + 3
    k = model.layers[0].params["kernel"]
    assert np.shares_memory(k, model.params) and k.shape == (5, 4)
    assert np.shares_memory(model.layers[1].grads["bias"], model.grads)
    model.params[...] = 0
    assert not model.layers[0].params["kernel"].any()


def test_he_init_for_relu_and_glorot_otherwise():
    m = Sequential([Dense(400, activation="relu"), Dense(400, activation="tanh")],
                   input_shape=(400,), seed=0)
    k_relu = m.layers[0].params["kernel"]
    k_tanh = m.layers[1].params["kernel"]
    assert k_relu.std() == pytest.approx(np.sqrt(2 / 400), rel=0.05)
    assert k_tanh.std() == pytest.approx(np.sqrt(2 / 800), rel=0.05)


def test_regression_with_mse_learns_a_linear_map():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((512, 3)).astype(np.float32)
    W = np.array([[1.0, -2.0, 0.5], [0.3, 0.0, -1.0]], dtype=np.float32)
    y = X @ W.T + 0.1
    model = Sequential([Dense(2)], seed=0)
    model.fit(X, y, epochs=60, batch_size=32, optimizer=SGD(lr=0.05, momentum=0.9), loss="mse", verbose=0)
    np.testing.assert_allclose(model.layers[0].params["kernel"], W, atol=1e-3)
    assert model.evaluate(X, y)["loss"] < 1e-5
    assert model.predict(X[:3]).shape == (3, 2)


def test_save_load_gives_identical_predictions(trained, digits, tmp_path):
    model = trained[0]
    Xte = digits[2]
    path = tmp_path / "digits.npz"
    model.save(path, optimizer=model.optimizer)
    loaded, opt = load_model(path, with_optimizer=True)
    np.testing.assert_array_equal(loaded.params, model.params)
    np.testing.assert_array_equal(loaded.predict_proba(Xte), model.predict_proba(Xte))
    assert isinstance(opt, RMSprop) and opt.t == model.optimizer.t
    np.testing.assert_array_equal(opt.state["square_avg"], model.optimizer.state["square_avg"])
    assert [type(l).__name__ for l in loaded.layers] == ["Dense", "Dropout", "Dense", "Dropout", "Dense"]


def test_model_file_with_an_object_array_is_refused_without_unpickling(tmp_path):
    model = Sequential([Dense(3)], input_shape=(2,))
    good = tmp_path / "good.npz"
    model.save(good)
    with np.load(good) as data:
        arrays = {k: data[k] for k in data.files}
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    arrays["params"] = np.array([Evil()], dtype=object)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match="object array"):
        load_model(bad)
    assert not marker.exists()


def test_model_file_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a sparknet model file"):
        load_model(junk)
    model = Sequential([Dense(3)], input_shape=(2,))
    path = tmp_path / "m.npz"
    model.save(path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["params"] = arrays["params"][:-1]
    short = tmp_path / "short.npz"
    np.savez(short, **arrays)
    with pytest.raises(ValueError, match="parameters stored"):
        load_model(short)
    arrays = dict(arrays, version=np.array(99))
    np.savez(tmp_path / "v99.npz", **arrays)
    with pytest.raises(ValueError, match="version 99"):
        load_model(tmp_path / "v99.npz")


def test_failed_save_leaves_the_old_file_intact(tmp_path):
    model = Sequential([Dense(3)], input_shape=(2,))
    path = tmp_path / "m.npz"
    model.save(path)
    before = path.read_bytes()

    class Boom(Exception):
        pass

    class BadOptimizer:
        name = "rmsprop"

        def state_dict(self):
            return {"t": 1, "square_avg": np.zeros(3)}

        def get_config(self):
            raise Boom("disk full")

    with pytest.raises(Boom):
        model.save(path, optimizer=BadOptimizer())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # no temporary left behind


def test_model_file_is_plain_npz_with_json_architecture(tmp_path):
    model = Sequential([Dense(4, activation="relu"), Dense(2, activation="softmax")], input_shape=(3,))
    path = tmp_path / "m.npz"
    model.save(path)
    assert zipfile.is_zipfile(path)
    with np.load(path, allow_pickle=False) as data:
        arch = json.loads(str(data["architecture"]))
        assert str(data["format"]) == "sparknet-model" and int(data["version"]) == 1
    assert arch["input_shape"] == [3]
    assert [l["class"] for l in arch["layers"]] == ["Dense", "Dense"]


# ---------------------------------------------------------------- bad input
@pytest.fixture
def small():
    rng = np.random.default_rng(0)
    X = rng.random((20, 4)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    model = Sequential([Dense(3, activation="softmax")], input_shape=(4,))
    return model, X, y


def test_wrong_feature_count(small):
    model, X, y = small
    with pytest.raises(ValueError, match="5 features per sample, the model expects 4"):
        model.fit(np.zeros((20, 5)), y, verbose=0)
    with pytest.raises(ValueError, match="features per sample"):
        model.predict(np.zeros((2, 3)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_X(small, bad):
    model, X, y = small
    X = X.copy()
    X[3, 2] = bad
    with pytest.raises(ValueError, match=r"NaN or infinity \(first at index \(3, 2\)\)"):
        model.fit(X, y, verbose=0)


def test_labels_outside_the_classes(small):
    model, X, y = small
    with pytest.raises(ValueError, match=r"label 3 outside \[0, 3\)"):
        model.fit(X, np.where(y == 0, 3, y), verbose=0)
    with pytest.raises(ValueError, match=r"label -1 outside"):
        model.fit(X, np.where(y == 0, -1, y), verbose=0)
    with pytest.raises(ValueError, match="non-integer"):
        model.fit(X, y + 0.5, verbose=0)


def test_empty_X(small):
    model, X, y = small
    with pytest.raises(ValueError, match="X is empty"):
        model.fit(X[:0], y[:0], verbose=0)


def test_X_y_length_mismatch(small):
    model, X, y = small
    with pytest.raises(ValueError, match="X has 20 samples but y has 19"):
        model.fit(X, y[:-1], verbose=0)


def test_non_numeric_dtype(small):
    model, X, y = small
    with pytest.raises(ValueError, match="non-numeric dtype"):
        model.fit(X.astype(str), y, verbose=0)
    with pytest.raises(ValueError, match="non-numeric dtype"):
        model.fit(X, np.array(["a"] * 20), verbose=0)
    with pytest.raises(ValueError, match="ragged"):
        model.fit([[1.0, 2.0], [1.0]], [0, 1], verbose=0)


def test_bad_arguments_name_the_argument(small):
    model, X, y = small
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        model.fit(X, y, epochs=0, verbose=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        model.fit(X, y, batch_size=-1, verbose=0)
    with pytest.raises(ValueError, match="unknown loss"):
        model.fit(X, y, loss="hinge", verbose=0)
    with pytest.raises(ValueError, match="unknown activation"):
        Dense(3, activation="mish")
    with pytest.raises(ValueError, match="Dense units must be a positive integer"):
        Dense(0)
    with pytest.raises(ValueError, match="Dropout rate"):
        Dropout(1.0)
    with pytest.raises(RuntimeError, match="not built"):
        Sequential([Dense(2)]).predict(X)


def test_diverging_training_stops_with_a_clear_error():
    X = np.random.default_rng(0).standard_normal((64, 2)).astype(np.float32) * 1e3
    y = (X @ np.array([1.0, 1.0], np.float32))[:, None] * 1e3
    model = Sequential([Dense(8), Dense(1)], seed=0)
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        model.fit(X, y, epochs=50, optimizer=SGD(lr=10.0), loss="mse", verbose=0)


def test_read_idx_roundtrip_and_bad_magic(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3]) + np.array([2, 3, 4], ">i4").tobytes() + arr.tobytes())
    np.testing.assert_array_equal(read_idx(str(path)), arr)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(str(tmp_path / "bad"))


def test_load_mnist_reads_the_real_files(mnist_dir):
    from sparknet.datasets import load_mnist
    Xtr, ytr, Xte, yte = load_mnist(mnist_dir)
    assert Xtr.shape == (60000, 784) and Xte.shape == (10000, 784)
    assert Xtr.dtype == np.float32 and 0.0 <= Xtr.min() and Xtr.max() == 1.0
    assert np.bincount(ytr).tolist()[:2] == [5923, 6742]  # the published class counts

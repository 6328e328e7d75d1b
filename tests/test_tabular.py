"""ColumnEmbedding: lookups and concatenation against ``torch.nn.Embedding`` (float64),
gradients against central differences (tables and numeric inputs), refused ids naming the
position, value and row, model files, the Spark Estimator's network Param and a fit on a
small DataFrame, and log-price regression on the diamonds data against a one-hot linear
baseline."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from helpers.gradcheck import model_gradcheck, rel_error
from sparknet import Adam, ColumnEmbedding, Dense, Sequential, load_model, save_model

TOL = 1e-6
DIAMONDS = Path(__file__).parents[2] / "shared" / "data" / "diamonds" / "diamonds.csv"

# positions 1 and 4 hold ids (cardinalities 3 and 5), 0, 2, 3 and 5 are numeric
COLUMNS, CARD, WIDTH = [4, 1], [5, 3], [3, 2]


def _features(n=9, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6))
    x[:, 4] = rng.integers(0, 5, n)
    x[:, 1] = rng.integers(0, 3, n)
    x[:3, 4] = [2, 2, 2]                  # a repeated id: its table row gets the sum
    return x


def _net(dtype="float64", seed=0):
    return Sequential([ColumnEmbedding(COLUMNS, CARD, WIDTH), Dense(5, activation="tanh"),
                       Dense(2)], input_shape=(6,), dtype=dtype, seed=seed)


# ---------------------------------------------------------------- against PyTorch
def test_lookup_concatenation_and_gradients_match_torch():
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    model = _net()
    layer = model.layers[0]
    model.params[...] = 0.5 * np.random.default_rng(1).standard_normal(model.n_params)
    x, R = _features(), np.random.default_rng(2).standard_normal((9, 2))
    emb = layer.forward(x)
    out = model.forward(x, training=True)
    dx = model.backward(R.copy())

    tables = [torch.nn.Embedding(v, d, dtype=torch.float64) for v, d in zip(CARD, WIDTH)]
    sl = model.param_slices()
    for t, c in zip(tables, COLUMNS):
        a, b, shape = sl[0][f"embeddings_{c}"]
        t.weight.data[...] = torch.tensor(model.params[a:b].reshape(shape))
    lin = [torch.nn.Linear(6 - 2 + 5, 5, dtype=torch.float64),
           torch.nn.Linear(5, 2, dtype=torch.float64)]
    for i, m in enumerate(lin, start=1):
        for name, p in (("kernel", m.weight), ("bias", m.bias)):
            a, b, shape = sl[i][name]
            p.data[...] = torch.tensor(model.params[a:b].reshape(shape))
    xt = torch.tensor(x, requires_grad=True)
    ref_emb = torch.cat([t(xt[:, c].long()) for t, c in zip(tables, COLUMNS)]
                        + [xt[:, [0, 2, 3, 5]]], dim=1)
    ref = lin[1](torch.tanh(lin[0](ref_emb)))
    (ref * torch.tensor(R)).sum().backward()

    assert emb.shape == (9, 9) and np.abs(emb - ref_emb.detach().numpy()).max() == 0
    assert np.abs(out - ref.detach().numpy()).max() < 1e-12
    for t, c in zip(tables, COLUMNS):
        a, b, shape = sl[0][f"embeddings_{c}"]
        assert np.abs(model.grads[a:b].reshape(shape) - t.weight.grad.numpy()).max() < 1e-12
    assert np.abs(dx - xt.grad.numpy()).max() < 1e-12    # zero at positions 1 and 4 in torch too
    assert np.all(dx[:, COLUMNS] == 0)


# ---------------------------------------------------------- finite differences
def test_table_and_numeric_input_gradients_match_finite_differences():
    model = _net()
    x = _features(12, seed=3)
    p_err, _ = model_gradcheck(model, x, max_inputs=0)    # ids have no gradient to check
    assert p_err < TOL
    # the numeric positions, by central differences
    R = np.random.default_rng(4).standard_normal((12, 2))
    model.forward(x, training=True)
    dx = model.backward(R.copy())
    numeric, eps = [0, 2, 3, 5], 1e-6
    num = np.empty((12, 4))
    for r in range(12):
        for j, c in enumerate(numeric):
            xp, xm = x.copy(), x.copy()
            xp[r, c] += eps
            xm[r, c] -= eps
            num[r, j] = ((model.forward(xp) - model.forward(xm)) * R).sum() / (2 * eps)
    assert rel_error(dx[:, numeric], num) < TOL
    assert np.all(dx[:, COLUMNS] == 0)


def test_first_layer_skips_its_input_gradient_with_the_same_table_gradients():
    model = _net()
    x, R = _features(), np.random.default_rng(5).standard_normal((9, 2))
    model.forward(x, training=True)
    assert model.backward(R.copy(), input_grad=False) is None
    g = model.grads.copy()
    model.forward(x, training=True)
    assert model.backward(R.copy(), input_grad=True) is not None
    assert np.array_equal(model.grads, g)


def test_float32_agrees_with_float64_and_integer_arrays_are_read():
    m64, m32 = _net("float64"), _net("float32")
    assert np.array_equal(m32.params, m64.params.astype(np.float32))   # the same seeded tables
    x = _features()
    y32 = m32.forward(x.astype(np.float32))
    assert y32.dtype == np.float32 and np.abs(y32 - m64.forward(x)).max() < 1e-5
    layer = ColumnEmbedding([0], 4, 2)
    Sequential([layer], input_shape=(2,), dtype="float64")
    ints = np.array([[3, 7], [0, -2]])
    out = layer.forward(ints)
    assert np.array_equal(out[:, 2], [7, -2])
    assert np.array_equal(out[0, :2], layer.params["embeddings_0"][3])


# ----------------------------------------------------------------------- bad ids
@pytest.mark.parametrize("bad, shown", [(-1.0, "-1.0"), (5.0, "5.0"), (2.5, "2.5"),
                                        (np.nan, "nan"), (np.inf, "inf")])
def test_bad_ids_are_refused_naming_position_value_and_row(bad, shown):
    model = _net()
    layer = model.layers[0]
    x = _features(50, seed=6)
    x[37, 4] = bad
    msg = rf"column 4 holds {shown} at row 37, .*integers in \[0, 5\)"
    with pytest.raises(ValueError, match=msg):
        layer.check_input(x)
    with pytest.raises(ValueError, match=rf"column 4 holds {shown} at row 5 of the batch"):
        layer.forward(x[32:40])
    x[37, 4] = 0
    x[2, 1] = 3.0                                   # position 1 has 3 categories: 3 is too large
    with pytest.raises(ValueError, match=r"column 1 holds 3.0 at row 2, .*\[0, 3\)"):
        layer.check_input(x)


def test_fit_refuses_a_bad_id_before_the_first_step():
    model = _net()
    before = model.params.copy()
    x = _features(40, seed=7)
    x[33, 1] = 1.5
    with pytest.raises(ValueError, match=r"column 1 holds 1.5 at row 33"):
        model.fit(x, np.zeros((40, 2)), epochs=1, batch_size=8, verbose=0)
    assert np.array_equal(model.params, before)
    with pytest.raises(ValueError, match=r"column 1 holds 1.5 at row 33"):
        model.predict_output(x)


def test_bad_arguments_name_the_argument_and_value():
    cases = [
        (dict(columns=[], input_dims=3, output_dims=2), r"columns must be a non-empty list.*\[\]"),
        (dict(columns=3, input_dims=3, output_dims=2), "columns must be a non-empty list.*got 3"),
        (dict(columns=[0, -1], input_dims=3, output_dims=2),
         r"columns\[1\] must be a non-negative.*-1"),
        (dict(columns=[2, 0, 2], input_dims=3, output_dims=2), r"distinct.*position 2 twice"),
        (dict(columns=[0, 1], input_dims=[3], output_dims=2), r"input_dims .*2 columns.*\[3\]"),
        (dict(columns=[0, 1], input_dims=[3, 0], output_dims=2), r"input_dims\[1\] .*positive.*0"),
        (dict(columns=[0], input_dims=3, output_dims=1.5), r"output_dims must be a positive.*1.5"),
        (dict(columns=[0], input_dims=3, output_dims=2, embeddings_initializer="zeros"),
         "embeddings_initializer.*'zeros'"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(ValueError, match=msg):
            ColumnEmbedding(**kwargs)


def test_build_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"ColumnEmbedding 'cats': column 6 is outside the feature "
                                         r"vector of 6 values"):
        Sequential([ColumnEmbedding([1, 6], 3, 2, name="cats")], input_shape=(6,))
    with pytest.raises(ValueError, match=r"flat feature vectors.*\(3, 4\)"):
        Sequential([ColumnEmbedding([1], 3, 2)], input_shape=(3, 4))
    with pytest.raises(ValueError, match="float32 features cannot hold"):
        Sequential([ColumnEmbedding([0], 2 ** 24 + 2, 1)], input_shape=(2,))


# --------------------------------------------------------------- save and load
def test_model_file_round_trip(tmp_path):
    model = _net("float32", seed=3)
    x = _features(32, seed=8).astype(np.float32)
    model.fit(x, np.random.default_rng(9).standard_normal((32, 2)), epochs=2, verbose=0)
    save_model(model, tmp_path / "tab.npz")
    loaded = load_model(tmp_path / "tab.npz")
    assert loaded.get_config() == model.get_config()
    assert loaded.layers[0].get_config() == {
        "columns": [4, 1], "input_dims": [5, 3], "output_dims": [3, 2],
        "embeddings_initializer": "normal", "name": "columnembedding"}
    assert np.array_equal(loaded.forward(x), model.forward(x))


# ------------------------------------------------------------------------- Spark
def _small_frame(spark, n=240, seed=0):
    rng = np.random.default_rng(seed)
    colors, sizes = ["red", "green", "blue"], ["S", "M", "L", "XL"]
    rows = []
    for _ in range(n):
        c, s, v = int(rng.integers(3)), int(rng.integers(4)), float(rng.standard_normal())
        rows.append((colors[c], sizes[s], v, float(c - 0.5 * s + 0.3 * v)))
    return spark.createDataFrame(rows, ["color", "size", "v", "label"])


@pytest.mark.slow
def test_estimator_network_param_round_trips_and_fits_a_dataframe(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    from sparknet.ml import SparkNetRegressor

    df = _small_frame(spark)
    net = Sequential([ColumnEmbedding([0, 1], [4, 5], 3), Dense(8, activation="relu"), Dense(1)])
    reg = SparkNetRegressor(network=net, epochs=1, batchSize=16, numPartitions=2, seed=1)
    path = str(tmp_path / "estimator")
    reg.write().overwrite().save(path)
    again = SparkNetRegressor.load(path)
    assert again.getOrDefault("network") == reg.getOrDefault("network")
    assert again.getNetwork().layers[0].get_config() == net.layers[0].get_config()

    # handleInvalid="keep" adds one id for labels unseen in fit: cardinalities 3 + 1, 4 + 1
    pipe = Pipeline(stages=[
        StringIndexer(inputCols=["color", "size"], outputCols=["color_id", "size_id"],
                      handleInvalid="keep"),
        VectorAssembler(inputCols=["color_id", "size_id", "v"], outputCol="features"),
        again,
    ])
    fitted = pipe.fit(df)
    scored = fitted.transform(df).select("features", "prediction").collect()
    network = fitted.stages[-1].network
    X = np.array([r["features"].toArray() for r in scored])
    local = network.forward(X.astype(np.float32))[:, 0]
    assert np.allclose([r["prediction"] for r in scored], local, atol=1e-5)
    model_path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(model_path)
    loaded = PipelineModel.load(model_path)
    preds = [r["prediction"] for r in loaded.transform(df).select("prediction").collect()]
    assert np.array_equal(preds, [r["prediction"] for r in scored])


# ------------------------------------------------------------------- real data
def _diamonds(n_train=6000, n_test=2000, seed=0):
    pd = pytest.importorskip("pandas", reason="pandas not installed: diamonds check skipped")
    if not DIAMONDS.exists():
        print(f"skipped: {DIAMONDS} is absent")
        pytest.skip(f"diamonds data not found at {DIAMONDS}")
    df = pd.read_csv(DIAMONDS, index_col=0)
    df = df.iloc[np.random.default_rng(seed).permutation(len(df))[:n_train + n_test]]
    cats, nums = ["cut", "color", "clarity"], ["carat", "depth", "table", "x", "y", "z"]
    codes = [pd.Categorical(df[c]) for c in cats]
    ids = np.stack([c.codes for c in codes], axis=1).astype(float)
    cards = [len(c.categories) for c in codes]
    num = df[nums].to_numpy(float)
    mu, sd = num[:n_train].mean(axis=0), num[:n_train].std(axis=0)
    num = (num - mu) / sd
    y = np.log(df["price"].to_numpy(float))
    return ids, cards, num, y, n_train


def test_diamonds_log_price_beats_a_one_hot_linear_baseline():
    ids, cards, num, y, n = _diamonds()
    # baseline: least squares on an intercept, the numeric columns and one-hot categories
    onehot = [np.eye(k)[ids[:, j].astype(int)] for j, k in enumerate(cards)]
    A = np.concatenate([np.ones((len(y), 1)), num, *onehot], axis=1)
    w = np.linalg.lstsq(A[:n], y[:n], rcond=None)[0]
    rmse_linear = float(np.sqrt(np.mean((A[n:] @ w - y[n:]) ** 2)))

    t0 = time.perf_counter()
    X = np.concatenate([ids, num], axis=1)
    centre = y[:n].mean()
    net = Sequential([ColumnEmbedding([0, 1, 2], cards, 4), Dense(64, activation="relu"), Dense(1)],
                     seed=0, loss="mse")
    net.fit(X[:n], (y[:n] - centre)[:, None], epochs=15, batch_size=32, optimizer=Adam(lr=3e-3),
            verbose=0)
    pred = net.forward(X[n:].astype(np.float32))[:, 0] + centre
    rmse_net = float(np.sqrt(np.mean((pred - y[n:]) ** 2)))
    elapsed = time.perf_counter() - t0
    print(f"held-out RMSE of log price: network {rmse_net:.4f}, one-hot linear {rmse_linear:.4f} "
          f"({elapsed:.1f} s)")
    assert rmse_net < 0.2            # the standard deviation of log price is about 1.0
    assert rmse_net <= rmse_linear
    assert elapsed < 15

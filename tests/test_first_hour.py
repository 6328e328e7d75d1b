"""A new user's first hour: the honest mistakes of someone coming from Keras, PyTorch or
Spark ML, each answered by a message that names the problem and the fix."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from sparknet import Dense, Flatten, RMSprop, Sequential, load_model
from sparknet.datasets import load_digits


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_a_single_layer_passed_to_sequential_says_to_wrap_it_in_a_list():
    with pytest.raises(TypeError, match=r"got a single Dense: write Sequential\(\[Dense"):
        Sequential(Dense(10))


def test_class_labels_into_a_sigmoid_head_without_a_loss_are_refused_not_trained_as_mse(digits):
    X, y, _, _ = digits
    model = Sequential([Dense(1, activation="sigmoid")])
    with pytest.raises(ValueError, match=r"10 distinct integer labels .*Dense\(10, activation='softmax'\)"):
        model.fit(X, y, epochs=1, verbose=0)
    # an explicit loss is the user's word that this is regression
    history = Sequential([Dense(1, activation="sigmoid")]).fit(X, y, epochs=1, verbose=0, loss="mse")
    assert np.isfinite(history.history["loss"][0])


def test_one_optimizer_reused_for_a_second_model_is_refused_until_reset(digits):
    X, y, Xt, yt = digits
    opt = RMSprop(lr=1e-3)
    first = Sequential([Dense(10, activation="softmax")], seed=0)
    first.fit(X, y, epochs=1, verbose=0, optimizer=opt)
    second = Sequential([Dense(10, activation="softmax")], seed=0)
    with pytest.raises(ValueError, match=r"already taken \d+ steps for another model.*optimizer.reset\(\)"):
        second.fit(X, y, epochs=1, verbose=0, optimizer=opt)
    # the same model goes on with its optimizer; the optimizer still pickles (it travels to executors)
    first.fit(X, y, epochs=1, verbose=0, optimizer=opt)
    assert pickle.loads(pickle.dumps(opt)).t == opt.t
    # after reset, the second model trains exactly as with a fresh optimizer
    opt.reset()
    second.fit(X, y, epochs=2, verbose=0, optimizer=opt)
    fresh = Sequential([Dense(10, activation="softmax")], seed=0)
    fresh.fit(X, y, epochs=2, verbose=0, optimizer=RMSprop(lr=1e-3))
    np.testing.assert_array_equal(second.params, fresh.params)


def test_an_optimizer_whose_model_is_gone_is_refused_for_another_but_follows_the_reload(
        tmp_path, digits):
    """The loop a tuning user writes: ``Sequential(...).fit(..., optimizer=opt)`` per trial,
    the last model dropped.  The second model is refused; the first one saved and loaded
    again (the same weights) goes on with the optimizer's state."""
    import gc

    X, y, _, _ = digits
    opt = RMSprop(lr=1e-3)
    first = Sequential([Dense(10, activation="softmax")], seed=0)
    first.fit(X, y, epochs=1, verbose=0, optimizer=opt)
    first.save(tmp_path / "first.npz")
    del first
    gc.collect()
    with pytest.raises(ValueError, match=r"already taken \d+ steps for another model"):
        Sequential([Dense(10, activation="softmax")], seed=1).fit(X, y, epochs=1, verbose=0,
                                                                  optimizer=opt)
    again = load_model(tmp_path / "first.npz")
    steps = opt.t
    again.fit(X, y, epochs=1, verbose=0, optimizer=opt)
    assert opt.t > steps


def test_images_into_dense_without_flatten_point_to_flatten_not_to_the_labels(digits):
    X, y, _, _ = digits
    images = X.reshape(-1, 8, 8)
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")])
    with pytest.raises(ValueError, match=r"per-sample shape \(8, 10\).*add Flatten\(\)"):
        model.fit(images, y, epochs=1, verbose=0)
    Sequential([Flatten(), Dense(10, activation="softmax")]).fit(images, y, epochs=1, verbose=0)


def test_load_model_on_a_folder_names_what_the_folder_holds(tmp_path, digits):
    X, y, _, _ = digits
    model = Sequential([Dense(10, activation="softmax")])
    model.fit(X, y, epochs=1, verbose=0)
    model.save(tmp_path / "digits.npz")
    with pytest.raises(IsADirectoryError, match=r"is a folder.*digits\.npz.*pass one of them"):
        load_model(tmp_path)
    (tmp_path / "mp").mkdir()
    (tmp_path / "mp" / "manifest.json").write_text("{}")
    with pytest.raises(IsADirectoryError, match=r"ModelParallel\.load"):
        load_model(tmp_path / "mp")


def test_a_spark_ml_model_load_of_an_npz_file_points_to_load_model(tmp_path, digits):
    pytest.importorskip("pyspark", reason="pyspark not installed: Spark ML loading skipped")
    from sparknet.ml import SparkNetClassificationModel

    X, y, _, _ = digits
    model = Sequential([Dense(10, activation="softmax")])
    model.fit(X, y, epochs=1, verbose=0)
    path = str(tmp_path / "digits.npz")
    model.save(path)
    with pytest.raises(ValueError, match=r"sparknet\.load_model\("):
        SparkNetClassificationModel.load(path)


def test_set_params_refuses_non_finite_weights_and_keeps_the_old_ones():
    model = Sequential([Dense(3)], input_shape=(4,))
    before = model.params.copy()
    bad = before.copy()
    bad[5] = np.nan
    with pytest.raises(ValueError, match=r"1 NaN or infinite value\(s\), first at index 5"):
        model.set_params(bad)
    np.testing.assert_array_equal(model.params, before)


def test_a_pandas_dataframe_is_refused_with_how_to_pass_it(spark, digits):
    """A pandas DataFrame handed to the trainer or to an Estimator: a TypeError saying to
    make a Spark DataFrame (or numpy arrays), not "needs labels y" nor a missing ``schema``."""
    pd = pytest.importorskip("pandas")
    from sparknet.cluster import DataParallelTrainer
    from sparknet.ml import SparkNetClassifier

    X, y, _, _ = digits
    pdf = pd.DataFrame(X).assign(label=y)
    trainer = DataParallelTrainer(Sequential([Dense(10, activation="softmax")]), spark)
    with pytest.raises(TypeError, match=r"DataParallelTrainer.fit got a pandas DataFrame: pass a Spark "
                                        r"DataFrame \(spark.createDataFrame\(df\).*to_numpy\(\)"):
        trainer.fit(pdf, epochs=1, verbose=0)
    with pytest.raises(TypeError, match=r"validation data got a pandas Series"):
        trainer.fit(X, y, epochs=1, verbose=0, validation_data=(pdf[0], y))
    with pytest.raises(TypeError, match=r"SparkNetClassifier.fit takes a Spark DataFrame "
                                        r"\(spark.createDataFrame\(df\).*got a pandas DataFrame"):
        SparkNetClassifier(epochs=1).fit(pdf)

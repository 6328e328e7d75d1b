"""A new user's first hour: the honest mistakes of someone coming from Keras, PyTorch or
Spark ML, each answered by a message that names the problem and the fix."""
from __future__ import annotations

import json
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


def test_a_network_that_outputs_logits_is_told_the_loss_that_trains_it(digits):
    """A network from PyTorch ends in logits: the message names the cross-entropy that takes
    them, and that loss trains it."""
    X, y, Xt, yt = digits
    logits = Sequential([Dense(32, activation="relu"), Dense(10)], seed=0)
    with pytest.raises(ValueError, match=r"keep the logits \(a network from PyTorch\) and pass "
                                         r"loss='sparse_categorical_crossentropy'"):
        logits.fit(X, y, epochs=1, verbose=0)
    logits.fit(X, y, epochs=5, verbose=0, loss="sparse_categorical_crossentropy")
    assert float((logits.predict_output(Xt).argmax(1) == yt).mean()) > 0.85


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


def test_an_estimator_takes_the_networks_layers_as_a_list_and_refuses_one_layer():
    """``network=[Dense(...), ...]``, as ``Sequential([...])`` is written, is that network; one
    layer alone, or an empty list, is refused saying what to pass."""
    from sparknet.ml import SparkNetClassifier

    def layers():
        return [Dense(16, activation="relu"), Dense(10, activation="softmax")]

    as_list = SparkNetClassifier(network=layers())
    as_model = SparkNetClassifier(network=Sequential(layers()))
    assert as_list.getOrDefault("network") == as_model.getOrDefault("network")
    assert [layer["class"] for layer in json.loads(as_list.getOrDefault("network"))["layers"]] \
        == ["Dense", "Dense"]
    with pytest.raises(TypeError, match=r"one Dense layer was given; pass the network's layers "
                                        r"as a list"):
        SparkNetClassifier(network=Dense(10, activation="softmax"))
    with pytest.raises(TypeError, match=r"a list of its layers.*got list \(an empty or mixed list\)"):
        SparkNetClassifier(network=[])


@pytest.mark.parametrize("first,needs,shape", [
    ("conv", r"Conv2D 'conv2d'\) takes images \(H, W, C\)", r"\(8, 8, 1\) for 8 x 8 gray-scale"),
    ("lstm", r"LSTM 'lstm'\) takes sequences \(T, F\)", r"\(8, 8\) for 8 steps of 8 features"),
])
def test_flat_vector_rows_into_a_conv_or_recurrent_network_say_to_give_its_input_shape(
        spark, digits, first, needs, shape):
    """An ML Vector column of 64 pixels into a network that starts with a Conv2D (or an LSTM)
    and has no input shape: the message says to give one (``inputShape`` on the Estimator,
    ``input_shape`` on a Sequential), suggests the 8 x 8 shape, and does not tell a DataFrame
    user to reshape an array."""
    from pyspark.ml.linalg import Vectors

    from sparknet import LSTM, Conv2D
    from sparknet.ml import SparkNetClassifier

    X, y, _, _ = digits
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(X[:64], y[:64])],
                               ["features", "label"])
    head = [Flatten(), Dense(10, activation="softmax")]
    net = [Conv2D(4, 3)] + head if first == "conv" else [LSTM(8), Dense(10, activation="softmax")]
    with pytest.raises(ValueError, match=needs + r", and the training data holds flat rows of 64 "
                                         r"numbers: give the network the shape each row is read "
                                         r"as, e.g. " + shape) as err:
        SparkNetClassifier(network=net, epochs=1, verbose=0).fit(df)
    assert "inputShape" in str(err.value) and "reshape" not in str(err.value)


def _rank_layers():
    import sparknet as sn

    return [
        (lambda: sn.Conv2D(4, 3), 3, "images (H, W, C)"),
        (lambda: sn.MaxPool2D(2), 3, "images (H, W, C)"),
        (lambda: sn.GlobalAveragePooling2D(), 3, "images (H, W, C)"),
        (lambda: sn.LSTM(8), 2, "sequences (T, F)"),
        (lambda: sn.GRU(8), 2, "sequences (T, F)"),
        (lambda: sn.Bidirectional(sn.SimpleRNN(8)), 2, "sequences (T, F)"),
        (lambda: sn.Conv1D(4, 3), 2, "sequences (T, C)"),
        (lambda: sn.MaxPool1D(2), 2, "sequences (T, C)"),
        (lambda: sn.GlobalMaxPooling1D(), 2, "sequences (T, C)"),
        (lambda: sn.MultiHeadAttention(2, 4), 2, "sequences (T, D)"),
        (lambda: sn.TransformerEncoder(2, 8), 2, "sequences (T, D)"),
    ]


@pytest.mark.parametrize("make,rank,layout", _rank_layers())
def test_a_layer_given_inputs_of_another_rank_raises_input_rank_error(make, rank, layout):
    """Every layer that reads images or sequences refuses flat vectors with an
    InputRankError (a ValueError) that says what it reads and where it sits in the model;
    the Estimators' and the trainer's advice on flat rows is built from it."""
    from sparknet.cluster.data.fit_inputs import flat_rows_error
    from sparknet.errors import InputRankError

    first = Sequential([make(), Flatten(), Dense(3)])
    with pytest.raises(InputRankError) as err:
        first.build((64,))
    e = err.value
    assert isinstance(e, ValueError) and (e.index, e.rank, e.layout, e.got) == (0, rank, layout, (64,))
    assert str(e).startswith(f"layer 0 ({type(first.layers[0]).__name__} ")
    advice = str(flat_rows_error(e, first, 64, "the training data"))
    assert f"takes {layout}, and the training data holds flat rows of 64 numbers" in advice
    assert ("(8, 8, 1) for 8 x 8 gray-scale images" if rank == 3 else "(8, 8) for 8 steps") in advice

    second = Sequential([Dense(6), make()])  # not the first layer: the input shape is not at fault
    with pytest.raises(InputRankError) as err:
        second.build((64,))
    assert (err.value.index, err.value.got) == (1, (6,))
    assert flat_rows_error(err.value, second, 64, "the training data") is err.value


def test_flat_rows_of_a_size_that_is_no_square_get_the_layout_not_a_guess():
    from sparknet import Conv2D
    from sparknet.cluster.data.fit_inputs import flat_rows_error

    model = Sequential([Conv2D(4, 3), Flatten(), Dense(3)])
    with pytest.raises(ValueError) as err:
        model.build((60,))
    advice = str(flat_rows_error(err.value, model, 60, "the features column 'x'"))
    assert "the features column 'x' holds flat rows of 60 numbers" in advice
    assert "e.g. (H, W, C) (Sequential(..., input_shape=...)" in advice and "its product must be 60" in advice
    # another build error passes through unchanged
    other = ValueError("layer 0 (Dense 'dense'): something else")
    assert flat_rows_error(other, model, 60, "x") is other


def test_a_spark_dataframe_handed_to_a_one_process_model_names_the_parts_that_take_it(
        spark, digits):
    """``model.fit(df)`` / ``predict(df)`` / ``evaluate(df, ...)`` with a Spark DataFrame (or an
    RDD): a TypeError naming the trainer and the Spark ML Model that take it, not numpy's
    "dtype object (ragged rows ...)"; nothing is trained."""
    from pyspark.ml.linalg import Vectors

    X, y, _, _ = digits
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(X[:32], y[:32])],
                               ["features", "label"])
    want = (r"X is a Spark DataFrame: a Sequential's fit, predict and evaluate run in this "
            r"process on numpy arrays\. On the cluster, DataParallelTrainer\(model, spark\)"
            r"\.fit\(\.\.\.\) trains on it .* SparkNetClassificationModel\.from_network\(model\)"
            r"\.transform\(df\) scores a DataFrame")
    fresh = Sequential([Dense(10, activation="softmax")], seed=0)
    with pytest.raises(TypeError, match=want):
        fresh.fit(df, None, epochs=1, verbose=0)
    model = Sequential([Dense(10, activation="softmax")], input_shape=(64,), seed=0)
    before = model.params.copy()
    with pytest.raises(TypeError, match=want):
        model.fit(df, y[:32], epochs=1, verbose=0)
    np.testing.assert_array_equal(model.params, before)
    with pytest.raises(TypeError, match=want):
        model.predict(df)
    with pytest.raises(TypeError, match=want):
        model.evaluate(df, y[:32])
    with pytest.raises(TypeError, match=r"X_val is a Spark DataFrame"):
        model.fit(X[:32], y[:32], epochs=1, verbose=0, validation_data=(df, y[:32]))
    with pytest.raises(TypeError, match=r"X is a Spark RDD: a Sequential's fit"):
        model.predict(df.rdd)


@pytest.mark.parametrize("kwargs,want", [
    ({"resume": True}, r"unexpected keyword argument\(s\) resume; resume is an argument of "
                       r"fit\(\): trainer.fit\(\.\.\., resume=\.\.\.\)"),
    ({"epochs": 3}, r"epochs is an argument of fit\(\)"),
    ({"num_partition": 4}, r"num_partition; did you mean num_partitions for num_partition\?"),
    ({"mode": "async", "max_stalenes": 2}, r"did you mean max_staleness"),
    ({"max_staleness": 2}, r"max_staleness: option\(s\) of mode='async', and mode='sync'"),
])
def test_a_misplaced_or_misspelt_trainer_argument_is_named_with_where_it_belongs(kwargs, want):
    """The trainer's ``**mode_options`` catch every other keyword: an argument of ``fit``, a
    misspelling or an async option under ``mode="sync"`` each get their own message, not
    "mode='sync' takes no options" (no Spark is started)."""
    from sparknet.cluster import DataParallelTrainer

    with pytest.raises(TypeError, match=want):
        DataParallelTrainer(Sequential([Dense(10, activation="softmax")]), None, **kwargs)


@pytest.mark.parametrize("suffix,names", [
    (".onnx", r"not an ONNX file: sparknet.onnx.export\(model, path\) writes ONNX"),
    (".pt", r"not a PyTorch file: sparknet.interop.to_torch\(model\) gives a torch.nn.Module"),
    (".keras", r"not a Keras file: sparknet writes no Keras file; sparknet.onnx.export"),
    (".H5", r"not a Keras file"),
])
def test_saving_under_another_tools_file_name_is_refused_and_names_the_export(tmp_path, suffix, names):
    """``model.save("model.onnx")`` would write sparknet's npz archive under a name that
    promises ONNX (onnxruntime then fails on it far from the cause): refused, naming the
    export that writes the format and the name save() takes; a file already there is left
    as it was."""
    from sparknet.io import save_model

    model = Sequential([Dense(3)], input_shape=(4,))
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"kept")
    for save in (model.save, lambda p: save_model(model, p)):
        with pytest.raises(ValueError, match=rf"cannot save to .*model{suffix}'?: save\(\) writes sparknet's own "
                                             rf"model file \(an .npz archive\), {names}.*such as .*model.npz"):
            save(path)
        assert path.read_bytes() == b"kept"
    model.save(tmp_path / "model.npz")  # the name it takes
    assert load_model(tmp_path / "model.npz").input_shape == (4,)


def test_keras_and_pytorch_model_methods_name_their_sparknet_spelling():
    model = Sequential([Dense(10, activation="softmax")], input_shape=(4,))
    for name, says in [("compile", r"give the optimizer and the loss to fit\(\), e.g. model.fit\(X, y"),
                       ("train", r"fit\(\) trains .* there is no mode to switch"),
                       ("eval", r"fit\(\) trains .* predict\(\) / evaluate\(\) run in inference mode"),
                       ("parameters", r"the weights are one flat array, model.params"),
                       ("get_weights", r"the weights are .* \(model.param_slices\(\) says where each layer's lie")]:
        with pytest.raises(AttributeError, match=rf"Sequential has no {name}\(\): {says}"):
            getattr(model, name)
        assert not hasattr(model, name)
    with pytest.raises(AttributeError, match=r"^'Sequential' object has no attribute 'nonsense'$"):
        model.nonsense  # noqa: B018 - the attribute access is the test
    # copies and pickles still work (they look attributes up before __init__ has run)
    assert pickle.loads(pickle.dumps(model)).n_params == model.n_params


def test_an_optimizer_class_instead_of_an_instance_says_to_call_it(digits):
    X, y, _, _ = digits
    model = Sequential([Dense(10, activation="softmax")], seed=0)
    with pytest.raises(TypeError, match=r"optimizer=RMSprop is the class; pass an instance: "
                                        r"optimizer=RMSprop\(\)"):
        model.fit(X, y, epochs=1, verbose=0, optimizer=RMSprop)
    assert model.fit(X, y, epochs=1, verbose=0, optimizer=RMSprop()).history["loss"]


@pytest.mark.parametrize("package,call,extra", [
    ("torch", "from sparknet.interop import to_torch; to_torch(None)", "torch"),
    ("torch", "from sparknet.interop import from_torch; from_torch(None)", "torch"),
    ("torch", "from sparknet.interop import RecurrentOutput", "torch"),
    ("keras", "from sparknet.interop import from_keras; from_keras(None)", "keras"),
    ("onnx", "import sparknet.onnx", "onnx"),
])
def test_a_missing_optional_package_names_the_extra_that_installs_it(package, call, extra):
    """Without torch, keras or onnx (hidden from the import system in a fresh interpreter,
    whether or not they are installed here), the call says which extra installs it, not a
    bare ``No module named``."""
    import subprocess
    import sys

    code = f"import sys; sys.modules[{package!r}] = None\n{call}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"pip install 'sparknet[{extra}]'" in last, out.stderr


def test_validation_split_holds_out_the_last_samples_as_keras_does(digits):
    """``validation_split=0.2`` trains on the first 80% and validates on the last 20% (before
    shuffling): the same history, to the bit, as passing that split by hand."""
    X, y, _, _ = digits
    n = X.shape[0]
    cut = int(np.floor(n * 0.8))

    from helpers.models import mlp

    def model():
        return mlp(16, seed=3)

    split = model().fit(X, y, epochs=2, verbose=0, validation_split=0.2)
    by_hand = model().fit(X[:cut], y[:cut], epochs=2, verbose=0, validation_data=(X[cut:], y[cut:]))
    assert split.history["val_loss"] == by_hand.history["val_loss"]
    assert split.history["loss"] == by_hand.history["loss"]
    assert len(split.history["val_accuracy"]) == 2

    with pytest.raises(ValueError, match=r"give validation_data or validation_split, not both"):
        model().fit(X, y, epochs=1, verbose=0, validation_split=0.2, validation_data=(X, y))
    for bad in (1.0, -0.1, "0.2"):
        with pytest.raises(ValueError, match=r"validation_split must be in \[0, 1\), got"):
            model().fit(X, y, epochs=1, verbose=0, validation_split=bad)
    with pytest.raises(ValueError, match=r"validation_split=0.9 of 5 samples leaves no sample to train on"):
        model().fit(X[:5], y[:5], epochs=1, verbose=0, validation_split=0.9)
    with pytest.raises(ValueError, match=r"validation_split=1e-17 of 5 samples leaves no validation sample"):
        model().fit(X[:5], y[:5], epochs=1, verbose=0, validation_split=1e-17)


def test_a_logits_network_given_to_the_classifier_is_told_to_bring_its_softmax(spark, digits):
    """The Estimator's classifier needs the softmax head; a PyTorch network ends in logits,
    and the message says how ``from_torch`` reads it with its softmax (before any job)."""
    from helpers.frames import vector_frame
    from sparknet.ml import SparkNetClassifier

    X, y, _, _ = digits
    df = vector_frame(spark, X[:40], y[:40])
    clf = SparkNetClassifier(network=Sequential([Dense(16, activation="relu"), Dense(10)]))
    with pytest.raises(ValueError, match=r"last layer is Dense\(numClasses, activation='softmax'\) "
                                         r".*from_torch\(nn.Sequential\(net, nn.Softmax\(dim=1\)\)"):
        clf.fit(df)

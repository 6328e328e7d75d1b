"""Bad input across the single-process public API: every case is refused with a clear error.

Each case is ``(id, call, exception type, pattern)``: ``call(tmp_path)`` must raise that
type with a message matching the pattern, which names the argument, value, shape or file.
A fit that is refused must also be refused before its first optimizer step (the model's
parameters are unchanged).  Model files that are damaged, tampered with or declare more
than they hold are refused before anything of the declared size is allocated.
"""
from __future__ import annotations

import functools
import json
import os
import time
import tracemalloc
import zipfile
from typing import Any, Callable

import numpy as np
import pytest

from helpers.models import mlp
from sparknet import (
    LSTM,
    SGD,
    Activation,
    AvgPool2D,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    MaxPool2D,
    RMSprop,
    Sequential,
    SimpleRNN,
    load_model,
    losses,
    optim,
    save_model,
)
from sparknet.data import bptt_batches, char_vocab, lengths_to_mask, pad_sequences
from sparknet.errors import CheckpointError, TrainingDiverged

NAN, INF = float("nan"), float("inf")
RNG = np.random.default_rng(0)
X20 = RNG.random((20, 4)).astype(np.float32)
Y20 = RNG.integers(0, 3, 20)


# a built 4 -> 3 softmax classifier
clf = functools.partial(mlp, 5, 3, input_shape=(4,))


def reg() -> Sequential:
    """A built 4 -> 2 regression model (MSE)."""
    return Sequential([Dense(2)], input_shape=(4,), loss="mse")


def lstm() -> Sequential:
    return Sequential([LSTM(3), Dense(2, activation="softmax")], input_shape=(6, 2))


def with_(X: Any, where: tuple[int, ...], value: Any) -> np.ndarray:
    a = np.array(X, dtype=np.float64)
    a[where] = value
    return a


def fit_refused(model: Sequential, *args: Any, **kw: Any) -> None:
    """``model.fit(...)`` that must raise before any step: the caller's ``pytest.raises`` checks
    the error, this the parameters being unchanged when it comes."""
    before = model.params.copy()
    try:
        model.fit(*args, verbose=0, **kw)
    except BaseException:
        if not np.array_equal(model.params, before):
            raise AssertionError("parameters changed before the error") from None
        raise


# ----------------------------------------------------------------- model files
def saved(tmp: Any, name: str = "good.npz", optimizer: bool = True) -> str:
    """A small trained classifier saved with its RMSprop state (momentum: two state arrays)."""
    model = clf()
    opt = RMSprop(lr=1e-2, momentum=0.5)
    model.fit(X20, Y20, epochs=1, batch_size=10, optimizer=opt, verbose=0)
    path = os.path.join(str(tmp), name)
    save_model(model, path, optimizer=opt if optimizer else None)
    return path


def members(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def rewritten(tmp: Any, name: str = "bad.npz", drop: tuple[str, ...] = (), compressed: bool = False,
              **changes: Any) -> str:
    """A copy of :func:`saved`'s file with members replaced, added or dropped."""
    arrays = members(saved(tmp))
    for key in drop:
        arrays.pop(key)
    for key, value in changes.items():
        arrays[key] = value if isinstance(value, np.ndarray) else np.array(value)
    path = os.path.join(str(tmp), name)
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


def arch_json(layers: list[dict[str, Any]], input_shape: list[int] | None) -> str:
    return json.dumps({"name": "m", "dtype": "float32", "seed": 0, "input_shape": input_shape,
                       "loss": None, "layers": layers})


def huge(tmp: Any, units: int) -> str:
    """A 2 kB file whose architecture declares ``units * units + units`` parameters."""
    arch = arch_json([{"class": "Dense", "config": {"units": units}}], [units])
    return rewritten(tmp, "huge.npz", drop=("optimizer", "opt_t", "opt_square_avg", "opt_momentum_buffer"),
                     architecture=arch, params=np.zeros(10, np.float32))


def npy_bytes(arr: np.ndarray, header_shape: tuple[int, ...] | None = None) -> bytes:
    """``arr`` as .npy bytes whose header may declare another shape than the data holds."""
    header = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False,
              "shape": arr.shape if header_shape is None else header_shape}
    import io as _io
    buf = _io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + arr.tobytes()


def lying_header(tmp: Any, header_shape: tuple[int, ...], data: np.ndarray | None = None) -> str:
    """A model file whose ``params.npy`` header declares ``header_shape`` (zip CRCs intact)."""
    good = saved(tmp)
    params = members(good)["params"] if data is None else data
    path = os.path.join(str(tmp), "lying.npz")
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            body = npy_bytes(params, header_shape) if info.filename == "params.npy" else src.read(info)
            dst.writestr(info.filename, body)
    return path


def damaged(tmp: Any, how: str) -> str:
    good = saved(tmp)
    raw = bytearray(open(good, "rb").read())
    if how == "half":
        raw = raw[: len(raw) // 2]
    elif how == "tail":
        raw = raw[:-10]
    elif how == "flip":  # one byte inside the stored parameters: the zip CRC no longer matches
        with zipfile.ZipFile(good) as z:
            info = z.getinfo("params.npy")
        name_len, extra_len = np.frombuffer(bytes(raw[info.header_offset + 26:info.header_offset + 30]), "<u2")
        start = info.header_offset + 30 + int(name_len) + int(extra_len)
        raw[start + info.file_size - 3] ^= 0xFF
    path = os.path.join(str(tmp), f"damaged-{how}.npz")
    with open(path, "wb") as fh:
        fh.write(bytes(raw))
    return path


def text_file(tmp: Any) -> str:
    path = os.path.join(str(tmp), "notes.npz")
    with open(path, "w") as fh:
        fh.write("hello")
    return path


def object_member(tmp: Any) -> str:
    arrays = members(saved(tmp))
    arrays["extra"] = np.array([{"a": 1}], dtype=object)
    path = os.path.join(str(tmp), "pickled.npz")
    np.savez(path, **arrays)
    return path


def opt_meta(**over: Any) -> str:
    meta: dict[str, Any] = {"name": "rmsprop", "config": {"lr": 0.01, "momentum": 0.5}, "t": 2}
    meta.update(over)
    return json.dumps(meta)


# ------------------------------------------------------------ optimizer state
def state_step(arrays: dict[str, Any], n: int = 10, opt: optim.Optimizer | None = None) -> None:
    """Load ``arrays`` as RMSprop state, then step ``n`` float32 parameters with it."""
    opt = opt or RMSprop()
    opt.load_state_arrays({k: np.asarray(v) for k, v in arrays.items()})
    opt.step(np.zeros(n, np.float32), np.ones(n, np.float32))


def _raise(fn: Callable[[], Any]) -> Callable[[Any], Any]:
    return lambda tmp: fn()


def built_then_add(tmp: Any) -> None:
    clf().add(Dense(2))


def save_over_dir(tmp: Any) -> None:
    os.makedirs(os.path.join(str(tmp), "adir"))
    save_model(clf(), os.path.join(str(tmp), "adir"))


def save_nan(tmp: Any) -> None:
    model = clf()
    model.params[3] = np.nan
    save_model(model, os.path.join(str(tmp), "nan.npz"))


C = _raise  # a case whose call needs no folder
CASES: list[tuple[str, Callable[[Any], Any], type[BaseException], str]] = [
    # ---- Sequential construction and build
    ("seq-not-a-layer", C(lambda: Sequential(["dense"])), TypeError, "Layer instances, got str"),
    ("seq-dtype-int", C(lambda: Sequential([Dense(2)], dtype="int32")), ValueError, "dtype must be float32 or float64"),
    ("seq-dtype-bogus", C(lambda: Sequential([Dense(2)], dtype="floaty")), ValueError, "dtype .*'floaty'"),
    ("seq-dtype-none", C(lambda: Sequential([Dense(2)], dtype=None)), ValueError, "dtype must be float32 or float64, got None"),
    ("seq-seed-str", C(lambda: Sequential([Dense(2)], seed="abc")), ValueError, "seed .*'abc'"),
    ("seq-seed-float", C(lambda: Sequential([Dense(2)], seed=1.5)), ValueError, "seed .*1.5"),
    ("seq-seed-negative", C(lambda: Sequential([Dense(2)], seed=-1)), ValueError, "seed .*-1"),
    ("seq-seed-none", C(lambda: Sequential([Dense(2)], seed=None)), ValueError, "seed .*None"),
    ("seq-loss-unknown", C(lambda: Sequential([Dense(2)], loss="hinge")), ValueError, "unknown loss 'hinge'"),
    ("seq-loss-int", C(lambda: Sequential([Dense(2)], loss=3)), ValueError, "unknown loss 3"),
    ("seq-name-int", C(lambda: Sequential([Dense(2)], name=5)), ValueError, "name must be a string"),
    ("seq-input-shape-zero", C(lambda: Sequential([Dense(2)], input_shape=(0,))), ValueError, r"input_shape .*\(0,\)"),
    ("seq-input-shape-negative", C(lambda: Sequential([Dense(2)], input_shape=(4, -3))), ValueError, "input_shape .*-3"),
    ("seq-input-shape-float", C(lambda: Sequential([Dense(2)], input_shape=(2.5,))), ValueError, r"input_shape .*2\.5"),
    ("seq-input-shape-nan", C(lambda: Sequential([Dense(2)], input_shape=(NAN,))), ValueError, "input_shape .*nan"),
    ("seq-input-shape-str", C(lambda: Sequential([Dense(2)], input_shape="ab")), ValueError, "input_shape .*'ab'"),
    ("seq-input-shape-int", C(lambda: Sequential([Dense(2)], input_shape=5)), ValueError, "input_shape .*5"),
    ("seq-build-empty", C(lambda: Sequential([]).build((3,))), ValueError, "at least one layer"),
    ("seq-add-after-build", built_then_add, RuntimeError, "cannot add a layer to a built model"),
    ("build-conv-on-vectors", C(lambda: Sequential([Conv2D(2, 3)], input_shape=(8,))), ValueError,
     r"layer 0 \(Conv2D .*\(H, W, C\)"),
    ("build-kernel-too-large", C(lambda: Sequential([Conv2D(2, 5)], input_shape=(3, 3, 1))), ValueError,
     "kernel extent 5x5"),
    ("build-rnn-on-vectors", C(lambda: Sequential([LSTM(3)], input_shape=(5,))), ValueError, "takes sequences"),
    # ---- layer constructors
    ("dense-units-zero", C(lambda: Dense(0)), ValueError, "Dense units must be a positive integer, got 0"),
    ("dense-units-negative", C(lambda: Dense(-4)), ValueError, "Dense units .*-4"),
    ("dense-units-float", C(lambda: Dense(2.5)), ValueError, r"Dense units .*2\.5"),
    ("dense-units-str", C(lambda: Dense("3")), ValueError, "Dense units .*'3'"),
    ("dense-units-bool", C(lambda: Dense(True)), ValueError, "Dense units .*True"),
    ("dense-units-nan", C(lambda: Dense(NAN)), ValueError, "Dense units .*nan"),
    ("dense-activation-unknown", C(lambda: Dense(3, activation="mish")), ValueError, "unknown activation 'mish'"),
    ("dense-activation-list", C(lambda: Dense(3, activation=["relu"])), ValueError, r"unknown activation \['relu'\]"),
    ("dense-initializer-unknown", C(lambda: Dense(3, kernel_initializer="lecun")), ValueError, "unknown initializer 'lecun'"),
    ("dense-use-bias-str", C(lambda: Dense(3, use_bias="no")), ValueError, "use_bias must be True or False, got 'no'"),
    ("dense-name-int", C(lambda: Dense(3, name=7)), ValueError, "layer name must be a string, got 7"),
    ("conv-activation-unknown", C(lambda: Conv2D(4, 3, activation="elu")), ValueError, "unknown activation 'elu'"),
    ("conv-initializer-unknown", C(lambda: Conv2D(4, 3, kernel_initializer="x")), ValueError, "unknown initializer 'x'"),
    ("rnn-return-sequences-str", C(lambda: SimpleRNN(3, return_sequences="all")), ValueError,
     "SimpleRNN return_sequences must be True or False, got 'all'"),
    ("embedding-mask-zero-str", C(lambda: Embedding(10, 4, mask_zero="yes")), ValueError,
     "Embedding mask_zero must be True or False"),
    ("flatten-name-int", C(lambda: Flatten(name=3)), ValueError, "layer name must be a string, got 3"),
    ("activation-unknown", C(lambda: Activation("mish")), ValueError, "unknown activation 'mish'"),
    ("dropout-rate-one", C(lambda: Dropout(1.0)), ValueError, r"Dropout rate must be in \[0, 1\), got 1.0"),
    ("dropout-rate-negative", C(lambda: Dropout(-0.1)), ValueError, "Dropout rate .*-0.1"),
    ("dropout-rate-nan", C(lambda: Dropout(NAN)), ValueError, "Dropout rate .*nan"),
    ("dropout-rate-str", C(lambda: Dropout("half")), ValueError, "Dropout rate .*'half'"),
    ("conv-filters-zero", C(lambda: Conv2D(0, 3)), ValueError, "Conv2D filters .*0"),
    ("conv-kernel-zero", C(lambda: Conv2D(4, 0)), ValueError, "Conv2D kernel_size .*0"),
    ("conv-kernel-triple", C(lambda: Conv2D(4, (3, 3, 3))), ValueError, r"Conv2D kernel_size .*\(3, 3, 3\)"),
    ("conv-strides-zero", C(lambda: Conv2D(4, 3, strides=0)), ValueError, "Conv2D strides"),
    ("conv-dilation-negative", C(lambda: Conv2D(4, 3, dilation=-1)), ValueError, "Conv2D dilation"),
    ("conv-padding-unknown", C(lambda: Conv2D(4, 3, padding="full")), ValueError,
     "padding must be 'valid', 'same' or an integer >= 0 or 2 of them .*got 'full'"),
    ("conv-use-bias-int", C(lambda: Conv2D(4, 3, use_bias=2)), ValueError, "use_bias must be True or False, got 2"),
    ("maxpool-size-zero", C(lambda: MaxPool2D(0)), ValueError, "MaxPool2D pool_size"),
    ("avgpool-strides-float", C(lambda: AvgPool2D(2, strides=1.5)), ValueError, r"AvgPool2D strides .*1\.5"),
    ("pool-padding-over-half", C(lambda: MaxPool2D(2, padding=2)), ValueError,
     r"MaxPool2D padding \(2, 2\) must be at most half the pool window \(2, 2\)"),
    ("rnn-units-zero", C(lambda: SimpleRNN(0)), ValueError, "SimpleRNN units .*0"),
    ("rnn-softmax", C(lambda: SimpleRNN(3, activation="softmax")), ValueError, "not softmax"),
    ("rnn-activation-unknown", C(lambda: SimpleRNN(3, activation="mish")), ValueError, "unknown activation 'mish'"),
    ("lstm-state-and-sequences", C(lambda: LSTM(3, return_state=True, return_sequences=True)), ValueError,
     "return_state=True needs return_sequences=False"),
    ("lstm-initializer-unknown", C(lambda: LSTM(3, recurrent_initializer="eye")), ValueError, "unknown initializer 'eye'"),
    ("lstm-stateful-str", C(lambda: LSTM(3, stateful="yes")), ValueError, "stateful must be True or False, got 'yes'"),
    ("embedding-vocab-zero", C(lambda: Embedding(0, 4)), ValueError, "Embedding vocab .*0"),
    ("embedding-dim-str", C(lambda: Embedding(10, "4")), ValueError, "Embedding dim .*'4'"),
    ("embedding-initializer", C(lambda: Embedding(10, 4, embeddings_initializer="he")), ValueError,
     "embeddings_initializer must be 'normal' or 'uniform', got 'he'"),
    # ---- optimizer hyper-parameters
    ("rmsprop-lr-nan", C(lambda: RMSprop(lr=NAN)), ValueError, "learning rate .*nan"),
    ("rmsprop-lr-inf", C(lambda: RMSprop(lr=INF)), ValueError, "learning rate .*inf"),
    ("rmsprop-lr-negative", C(lambda: RMSprop(lr=-0.1)), ValueError, r"learning rate .*-0\.1"),
    ("rmsprop-lr-zero", C(lambda: RMSprop(lr=0)), ValueError, "learning rate .*0"),
    ("rmsprop-lr-str", C(lambda: RMSprop(lr="fast")), ValueError, "learning rate .*'fast'"),
    ("rmsprop-lr-none", C(lambda: RMSprop(lr=None)), ValueError, "learning rate .*None"),
    ("rmsprop-alpha-nan", C(lambda: RMSprop(alpha=NAN)), ValueError, "alpha .*nan"),
    ("rmsprop-alpha-one", C(lambda: RMSprop(alpha=1.0)), ValueError, r"alpha must be in \[0, 1\), got 1.0"),
    ("rmsprop-eps-nan", C(lambda: RMSprop(eps=NAN)), ValueError, "eps must be a positive finite number, got nan"),
    ("rmsprop-eps-zero", C(lambda: RMSprop(eps=0.0)), ValueError, "eps .*0.0"),
    ("rmsprop-eps-negative", C(lambda: RMSprop(eps=-1e-8)), ValueError, "eps .*-1e-08"),
    ("rmsprop-eps-inf", C(lambda: RMSprop(eps=INF)), ValueError, "eps .*inf"),
    ("rmsprop-momentum-nan", C(lambda: RMSprop(momentum=NAN)), ValueError, r"momentum must be in \[0, 1\), got nan"),
    ("rmsprop-momentum-one", C(lambda: RMSprop(momentum=1.0)), ValueError, "momentum .*1.0"),
    ("rmsprop-momentum-negative", C(lambda: RMSprop(momentum=-0.5)), ValueError, "momentum .*-0.5"),
    ("rmsprop-weight-decay-nan", C(lambda: RMSprop(weight_decay=NAN)), ValueError, "weight_decay .*nan"),
    ("rmsprop-weight-decay-inf", C(lambda: RMSprop(weight_decay=INF)), ValueError, "weight_decay .*inf"),
    ("rmsprop-weight-decay-negative", C(lambda: RMSprop(weight_decay=-1)), ValueError, "weight_decay .*-1"),
    ("rmsprop-centered-str", C(lambda: RMSprop(centered="yes")), ValueError, "centered must be True or False"),
    ("sgd-lr-nan", C(lambda: SGD(lr=NAN)), ValueError, "learning rate .*nan"),
    ("sgd-momentum-nan", C(lambda: SGD(momentum=NAN)), ValueError, "momentum .*nan"),
    ("sgd-momentum-large", C(lambda: SGD(momentum=1.5)), ValueError, r"momentum .*1\.5"),
    ("sgd-momentum-negative", C(lambda: SGD(momentum=-0.1)), ValueError, "momentum .*-0.1"),
    ("sgd-dampening-nan", C(lambda: SGD(momentum=0.9, dampening=NAN)), ValueError, r"dampening must be in \[0, 1\], got nan"),
    ("sgd-dampening-negative", C(lambda: SGD(dampening=-1)), ValueError, "dampening .*-1"),
    ("sgd-dampening-large", C(lambda: SGD(dampening=2)), ValueError, "dampening .*2"),
    ("sgd-weight-decay-nan", C(lambda: SGD(weight_decay=NAN)), ValueError, "weight_decay .*nan"),
    ("sgd-nesterov-no-momentum", C(lambda: SGD(nesterov=True)), ValueError, "Nesterov momentum requires"),
    ("sgd-nesterov-str", C(lambda: SGD(momentum=0.9, nesterov="on")), ValueError, "nesterov must be True or False"),
    ("optim-get-unknown", C(lambda: optim.get("adagrad")), ValueError, "unknown optimizer 'adagrad'"),
    ("optim-get-int", C(lambda: optim.get(5)), ValueError, "unknown optimizer 5"),
    ("optim-from-config-bad-key", C(lambda: optim.from_config("sgd", {"learning_rate": 0.1})), ValueError,
     "sgd.*learning_rate"),
    ("loss-get-unknown", C(lambda: losses.get("hinge")), ValueError, "unknown loss 'hinge'"),
    ("loss-get-none", C(lambda: losses.get(None)), ValueError, "unknown loss None"),
    # ---- optimizer state
    ("state-wrong-length", C(lambda: state_step({"opt_t": [3], "opt_square_avg": np.zeros(5, np.float32)})),
     ValueError, "square_avg has 5 entries but there are 10 parameters"),
    ("state-mismatched-lengths", C(lambda: state_step(
        {"opt_t": [3], "opt_square_avg": np.zeros(10, np.float32), "opt_momentum_buffer": np.zeros(8, np.float32)},
        opt=RMSprop(momentum=0.5))), ValueError, "momentum_buffer has 8 entries"),
    ("state-int-dtype", C(lambda: state_step({"opt_t": [3], "opt_square_avg": np.zeros(10, np.int64)})),
     ValueError, "square_avg has dtype int64"),
    ("state-2d", C(lambda: state_step({"opt_t": [3], "opt_square_avg": np.zeros((2, 5), np.float32)})),
     ValueError, r"square_avg must be 1-D, got shape \(2, 5\)"),
    ("state-nan", C(lambda: state_step({"opt_t": [3], "opt_square_avg": with_(np.zeros(10), (4,), NAN)})),
     ValueError, "square_avg contains NaN or infinity"),
    ("state-negative-square-avg", C(lambda: state_step({"opt_t": [3], "opt_square_avg": -np.ones(10)})),
     ValueError, "square_avg .*negative"),
    ("state-t-negative", C(lambda: state_step({"opt_t": [-1]})), ValueError, "opt_t .*-1"),
    ("state-t-fraction", C(lambda: state_step({"opt_t": [1.5]})), ValueError, r"opt_t .*1\.5"),
    ("state-t-many", C(lambda: state_step({"opt_t": [1, 2, 3]})), ValueError, "opt_t .*one"),
    ("state-dict-t-str", C(lambda: RMSprop().load_state_dict({"t": "x"})), ValueError, "t .*'x'"),
    # ---- fit arguments
    ("fit-epochs-zero", C(lambda: fit_refused(clf(), X20, Y20, epochs=0)), ValueError,
     "epochs must be a positive integer, got 0"),
    ("fit-epochs-float", C(lambda: fit_refused(clf(), X20, Y20, epochs=2.5)), ValueError, r"epochs .*2\.5"),
    ("fit-epochs-str", C(lambda: fit_refused(clf(), X20, Y20, epochs="3")), ValueError, "epochs .*'3'"),
    ("fit-batch-size-zero", C(lambda: fit_refused(clf(), X20, Y20, batch_size=0)), ValueError, "batch_size .*0"),
    ("fit-optimizer-unknown", C(lambda: fit_refused(clf(), X20, Y20, optimizer="adagrad")), ValueError,
     "unknown optimizer 'adagrad'"),
    ("fit-loss-unknown", C(lambda: fit_refused(clf(), X20, Y20, loss="hinge")), ValueError, "unknown loss 'hinge'"),
    ("fit-callbacks-not-callable", C(lambda: fit_refused(clf(), X20, Y20, callbacks=[5])), ValueError,
     "callbacks must be a list of callables; item 0 is 5"),
    ("fit-callbacks-bare-function", C(lambda: fit_refused(clf(), X20, Y20, callbacks=lambda e, l: None)), ValueError,
     "callbacks must be a list of callables"),
    ("fit-verbose-str", C(lambda: clf().fit(X20, Y20, verbose="loud")), ValueError, "verbose must be .*'loud'"),
    ("fit-shuffle-str", C(lambda: fit_refused(clf(), X20, Y20, shuffle="yes")), ValueError,
     "shuffle must be True or False, got 'yes'"),
    ("fit-num-threads-negative", C(lambda: fit_refused(clf(), X20, Y20, num_threads=-1)), ValueError, "num_threads .*-1"),
    ("fit-X-none", C(lambda: fit_refused(clf(), None, Y20)), ValueError, "X has dtype object"),
    ("fit-X-nan", C(lambda: fit_refused(clf(), with_(X20, (3, 1), NAN), Y20)), ValueError, r"X contains NaN .*\(3, 1\)"),
    ("fit-X-inf", C(lambda: fit_refused(clf(), with_(X20, (19, 0), -INF), Y20)), ValueError,
     r"X contains NaN or infinity .*\(19, 0\)"),
    ("fit-X-str", C(lambda: fit_refused(clf(), X20.astype(str), Y20)), ValueError, "X has non-numeric dtype"),
    ("fit-X-complex", C(lambda: fit_refused(clf(), X20 + 1j, Y20)), ValueError, "X has non-numeric dtype complex"),
    ("fit-X-ragged", C(lambda: fit_refused(clf(), [[1.0, 2.0, 3.0, 4.0], [1.0]], [0, 1])), ValueError, "X is ragged"),
    ("fit-X-empty", C(lambda: fit_refused(clf(), X20[:0], Y20[:0])), ValueError, "X is empty"),
    ("fit-X-scalar", C(lambda: fit_refused(clf(), 3.0, Y20)), ValueError, "X is a scalar"),
    ("fit-X-wrong-features", C(lambda: fit_refused(clf(), X20[:, :3], Y20)), ValueError,
     "X has 3 features per sample, the model expects 4"),
    ("fit-X-overflows-float32", C(lambda: fit_refused(clf(), with_(X20, (2, 2), 1e39), Y20)), ValueError,
     r"X holds values too large for float32 .*\(2, 2\)"),
    ("fit-X-1d-unbuilt", C(lambda: Sequential([Dense(3, activation="softmax")]).fit(X20[:, 0], Y20, verbose=0)),
     ValueError, r"X has shape \(20,\).*reshape\(-1, 1\)"),
    ("fit-y-none", C(lambda: fit_refused(clf(), X20, None)), ValueError, "y has non-numeric dtype object"),
    ("fit-y-nan", C(lambda: fit_refused(clf(), X20, with_(Y20, (4,), NAN))), ValueError, "y contains NaN"),
    ("fit-y-fraction", C(lambda: fit_refused(clf(), X20, Y20 + 0.5)), ValueError, "y holds non-integer values"),
    ("fit-y-out-of-range", C(lambda: fit_refused(clf(), X20, np.where(Y20 == 0, 3, Y20))), ValueError,
     r"label 3 outside \[0, 3\)"),
    ("fit-y-negative", C(lambda: fit_refused(clf(), X20, np.where(Y20 == 0, -1, Y20))), ValueError, "label -1 outside"),
    ("fit-y-short", C(lambda: fit_refused(clf(), X20, Y20[:-1])), ValueError, "X has 20 samples but y has 19"),
    ("fit-y-str", C(lambda: fit_refused(clf(), X20, Y20.astype(str))), ValueError, "y has non-numeric dtype"),
    ("fit-y-one-hot", C(lambda: fit_refused(clf(), X20, np.eye(3)[Y20])), ValueError,
     r"y has per-sample shape \(3,\).*class ids"),
    ("fit-y-regression-nan", C(lambda: fit_refused(reg(), X20, with_(np.zeros((20, 2)), (5, 1), NAN))), ValueError,
     "y contains NaN"),
    ("fit-y-regression-shape", C(lambda: fit_refused(reg(), X20, np.zeros((20, 3)))), ValueError,
     r"y has per-sample shape \(3,\), the model outputs \(2,\)"),
    ("fit-sample-weight-negative", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=with_(np.ones(20), (7,), -1))),
     ValueError, r"sample_weight holds a negative weight -1.0 at index 7"),
    ("fit-sample-weight-nan", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=with_(np.ones(20), (2,), NAN))),
     ValueError, "sample_weight contains NaN"),
    ("fit-sample-weight-inf", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=with_(np.ones(20), (2,), INF))),
     ValueError, "sample_weight contains NaN or infinity"),
    ("fit-sample-weight-shape", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=np.ones(19))), ValueError,
     r"sample_weight has shape \(19,\), expected \(20,\)"),
    ("fit-sample-weight-all-zero", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=np.zeros(20))), ValueError,
     "sample_weight is all zero"),
    ("fit-sample-weight-str", C(lambda: fit_refused(clf(), X20, Y20, sample_weight=["a"] * 20)), ValueError,
     "sample_weight has non-numeric dtype"),
    ("fit-mask-shape", C(lambda: fit_refused(lstm(), np.zeros((4, 6, 2)), [0, 1, 0, 1], mask=np.ones((4, 5)))),
     ValueError, r"mask has shape \(4, 5\); it must be \(N, T\) = \(4, 6\)"),
    ("fit-mask-nan", C(lambda: fit_refused(lstm(), np.zeros((4, 6, 2)), [0, 1, 0, 1], mask=with_(np.ones((4, 6)), (1, 2), NAN))),
     ValueError, "mask contains NaN"),
    ("fit-mask-all-zero", C(lambda: fit_refused(lstm(), np.zeros((2, 6, 2)), [0, 1], mask=np.zeros((2, 6)))), ValueError,
     "mask is all zero"),
    ("fit-mask-str", C(lambda: fit_refused(lstm(), np.zeros((2, 6, 2)), [0, 1], mask=[["a"] * 6] * 2)), ValueError,
     "mask has non-numeric dtype"),
    ("fit-validation-not-tuple", C(lambda: fit_refused(clf(), X20, Y20, validation_data=X20)), ValueError,
     r"validation_data must be \(X_val, y_val\)"),
    ("fit-validation-one-item", C(lambda: fit_refused(clf(), X20, Y20, validation_data=(X20,))), ValueError,
     "validation_data must be"),
    ("fit-validation-X-nan", C(lambda: fit_refused(clf(), X20, Y20, validation_data=(with_(X20, (0, 0), NAN), Y20))),
     ValueError, "X_val contains NaN"),
    ("fit-validation-y-range", C(lambda: fit_refused(clf(), X20, Y20, validation_data=(X20, Y20 + 3))), ValueError,
     "y_val holds label"),
    ("fit-validation-features", C(lambda: fit_refused(clf(), X20, Y20, validation_data=(X20[:, :2], Y20))), ValueError,
     "X_val has 2 features"),
    ("fit-token-id-out-of-range-late-batch", C(lambda: fit_refused(
        Sequential([Embedding(5, 2), Flatten(), Dense(2, activation="softmax")], input_shape=(3,)),
        with_(np.zeros((40, 3), np.int64), (39, 1), 9).astype(np.int64), np.zeros(40, np.int64), batch_size=8, shuffle=False)),
     ValueError, r"token id 9 at index \(39, 1\)"),
    ("fit-token-id-fraction-late-batch", C(lambda: fit_refused(
        Sequential([Embedding(5, 2), Flatten(), Dense(2, activation="softmax")], input_shape=(3,)),
        with_(np.zeros((40, 3)), (30, 0), 1.5), np.zeros(40, np.int64), batch_size=8, shuffle=False)),
     ValueError, "non-integer token ids"),
    # ---- predict / evaluate
    ("predict-unbuilt", C(lambda: Sequential([Dense(2)]).predict(X20)), RuntimeError, "not built"),
    ("predict-X-nan", C(lambda: clf().predict(with_(X20, (1, 1), NAN))), ValueError, r"X contains NaN .*\(1, 1\)"),
    ("predict-X-features", C(lambda: clf().predict(np.zeros((2, 5)))), ValueError, "X has 5 features per sample"),
    ("predict-X-none", C(lambda: clf().predict(None)), ValueError, "X has dtype object"),
    ("predict-batch-size-zero", C(lambda: clf().predict(X20, batch_size=0)), ValueError, "batch_size .*0"),
    ("predict-proba-batch-size-negative", C(lambda: clf().predict_proba(X20, batch_size=-2)), ValueError, "batch_size .*-2"),
    ("evaluate-unbuilt", C(lambda: Sequential([Dense(2)]).evaluate(X20, Y20)), RuntimeError, "not built"),
    ("evaluate-y-out-of-range", C(lambda: clf().evaluate(X20, Y20 + 5)), ValueError, "label .* outside"),
    ("evaluate-y-short", C(lambda: clf().evaluate(X20, Y20[:5])), ValueError, "X has 20 samples but y has 5"),
    ("evaluate-batch-size-zero", C(lambda: clf().evaluate(X20, Y20, batch_size=0)), ValueError, "batch_size .*0"),
    ("evaluate-loss-unknown", C(lambda: clf().evaluate(X20, Y20, loss="l1")), ValueError, "unknown loss 'l1'"),
    # ---- save
    ("save-unbuilt", lambda tmp: save_model(Sequential([Dense(2)]), os.path.join(str(tmp), "m.npz")), ValueError,
     "not built"),
    ("save-missing-folder", lambda tmp: save_model(clf(), os.path.join(str(tmp), "no", "m.npz")), ValueError,
     "folder .* does not exist"),
    ("save-over-a-folder", save_over_dir, ValueError, "adir.* is a folder"),
    ("save-path-none", C(lambda: save_model(clf(), None)), TypeError, "path must be a string or os.PathLike, got None"),
    ("save-extra-not-json", lambda tmp: save_model(clf(), os.path.join(str(tmp), "m.npz"), extra={"a": object()}),
     ValueError, "extra .*JSON"),
    ("save-non-finite-params", save_nan, ValueError, "params .*NaN or infinity .*index 3"),
    # ---- load: not a model file, damaged, tampered
    ("load-missing", lambda tmp: load_model(os.path.join(str(tmp), "missing.npz")), FileNotFoundError, "no model file at"),
    ("load-path-none", C(lambda: load_model(None)), TypeError, "path must be a string or os.PathLike, got None"),
    ("load-a-folder", lambda tmp: load_model(str(tmp)), IsADirectoryError, "is a folder; load_model reads one .npz model file"),
    ("load-text-file", lambda tmp: load_model(text_file(tmp)), CheckpointError, "notes.npz.* not a sparknet model file"),
    ("load-truncated-half", lambda tmp: load_model(damaged(tmp, "half")), CheckpointError,
     "damaged-half.npz.*(truncated|damaged)"),
    ("load-truncated-tail", lambda tmp: load_model(damaged(tmp, "tail")), CheckpointError,
     "damaged-tail.npz.*(truncated|damaged)"),
    ("load-flipped-byte", lambda tmp: load_model(damaged(tmp, "flip")), CheckpointError,
     "damaged-flip.npz.*params.*(CRC|damaged)"),
    ("load-pickled-member", lambda tmp: load_model(object_member(tmp)), CheckpointError,
     "pickled.npz.*'extra' holds an object array"),
    ("load-no-format", lambda tmp: load_model(rewritten(tmp, drop=("format",))), CheckpointError, "not a sparknet model file"),
    ("load-version-99", lambda tmp: load_model(rewritten(tmp, version=99)), CheckpointError, "version 99"),
    ("load-version-str", lambda tmp: load_model(rewritten(tmp, version="one")), CheckpointError, "version 'one'"),
    ("load-no-params", lambda tmp: load_model(rewritten(tmp, drop=("params",))), CheckpointError, "lacks its 'params'"),
    ("load-no-architecture", lambda tmp: load_model(rewritten(tmp, drop=("architecture",))), CheckpointError,
     "lacks its 'architecture'"),
    ("load-architecture-bad-json", lambda tmp: load_model(rewritten(tmp, architecture="{layers: ")), CheckpointError,
     "bad.npz.*malformed architecture"),
    ("load-architecture-a-list", lambda tmp: load_model(rewritten(tmp, architecture="[1, 2]")), CheckpointError,
     "malformed architecture"),
    ("load-architecture-unknown-layer", lambda tmp: load_model(rewritten(tmp, architecture=arch_json(
        [{"class": "Bogus", "config": {}}], [4]))), CheckpointError, "unknown layer class 'Bogus'"),
    ("load-architecture-bad-layer-arg", lambda tmp: load_model(rewritten(tmp, architecture=arch_json(
        [{"class": "Dense", "config": {"units": -3}}], [4]))), CheckpointError, "bad.npz.*Dense units .*-3"),
    ("load-architecture-unknown-layer-arg", lambda tmp: load_model(rewritten(tmp, architecture=arch_json(
        [{"class": "Dense", "config": {"units": 3, "colour": "red"}}], [4]))), CheckpointError, "malformed architecture.*colour"),
    ("load-architecture-layer-config-not-dict", lambda tmp: load_model(rewritten(tmp, architecture=arch_json(
        [{"class": "Flatten", "config": ""}], [4]))), CheckpointError, r"layer 0 \(Flatten\): config must be a dict"),
    ("load-architecture-no-input-shape", lambda tmp: load_model(rewritten(tmp, architecture=arch_json(
        [{"class": "Dense", "config": {"units": 3}}], None))), CheckpointError, "no input shape"),
    ("load-params-count", lambda tmp: load_model(rewritten(tmp, params=np.zeros(7, np.float32))), CheckpointError,
     "7 parameters stored, the architecture declares 43"),
    ("load-params-int", lambda tmp: load_model(rewritten(tmp, params=np.zeros(43, np.int32))), CheckpointError,
     "params has dtype int32"),
    ("load-params-2d", lambda tmp: load_model(rewritten(tmp, params=np.zeros((43, 1), np.float32))), CheckpointError,
     r"params must be 1-D, got shape \(43, 1\)"),
    ("load-params-all-nan", lambda tmp: load_model(rewritten(tmp, params=np.full(43, np.nan, np.float32))),
     CheckpointError, "bad.npz.*params holds 43 NaN or infinite values"),
    ("load-params-one-inf", lambda tmp: load_model(rewritten(tmp, params=with_(np.zeros(43), (40,), INF).astype(np.float32))),
     CheckpointError, r"params holds 1 NaN or infinite value .*index 40"),
    ("load-huge-architecture", lambda tmp: load_model(huge(tmp, 20000)), CheckpointError,
     "10 parameters stored, the architecture declares 400,020,000"),
    ("load-header-declares-more", lambda tmp: load_model(lying_header(tmp, (4300,))), CheckpointError,
     r"lying.npz.*params.npy declares shape \(4300,\)"),
    ("load-header-declares-less", lambda tmp: load_model(lying_header(tmp, (4,))), CheckpointError,
     r"params.npy declares shape \(4,\)"),
    ("load-header-overflows", lambda tmp: load_model(lying_header(tmp, (2 ** 40, 2 ** 40))), CheckpointError,
     "params.npy declares shape"),
    # ---- load: the optimizer part
    ("load-version-zip-bomb", lambda tmp: load_model(rewritten(tmp, compressed=True, version=np.zeros(2 ** 23, np.int64))),
     CheckpointError, "'version' declares 67,108,992 bytes"),
    ("load-optimizer-bad-json", lambda tmp: load_model(rewritten(tmp, optimizer="{"), with_optimizer=True), CheckpointError,
     "bad.npz.*malformed optimizer"),
    ("load-optimizer-unknown", lambda tmp: load_model(rewritten(tmp, optimizer=opt_meta(name="adagrad")), with_optimizer=True),
     CheckpointError, "unknown optimizer 'adagrad'"),
    ("load-optimizer-lr-nan", lambda tmp: load_model(rewritten(tmp, optimizer=opt_meta(config={"lr": NAN})), with_optimizer=True),
     CheckpointError, "learning rate .*nan"),
    ("load-optimizer-unknown-arg", lambda tmp: load_model(rewritten(tmp, optimizer=opt_meta(config={"lr": 0.1, "beta": 2})),
                                                          with_optimizer=True), CheckpointError, "rmsprop.*beta"),
    ("load-optimizer-state-length", lambda tmp: load_model(rewritten(tmp, opt_square_avg=np.zeros(40, np.float32)),
                                                           with_optimizer=True), CheckpointError,
     "square_avg has 40 entries, the model has 43 parameters"),
    ("load-optimizer-state-nan", lambda tmp: load_model(rewritten(tmp, opt_momentum_buffer=np.full(43, np.nan, np.float32)),
                                                        with_optimizer=True), CheckpointError, "momentum_buffer contains NaN"),
    ("load-optimizer-state-int", lambda tmp: load_model(rewritten(tmp, opt_square_avg=np.zeros(43, np.int16)),
                                                        with_optimizer=True), CheckpointError, "square_avg has dtype int16"),
    ("load-optimizer-t-negative", lambda tmp: load_model(rewritten(tmp, opt_t=np.array([-4])), with_optimizer=True),
     CheckpointError, "opt_t .*-4"),
    ("load-extra-bad-json", lambda tmp: load_model(rewritten(tmp, extra="{x"), with_extra=True), CheckpointError,
     "bad.npz.*malformed extra"),
    # ---- data helpers
    ("pad-padding", C(lambda: pad_sequences([[1, 2]], padding="middle")), ValueError,
     "padding must be 'post' or 'pre', got 'middle'"),
    ("pad-empty", C(lambda: pad_sequences([])), ValueError, "pad_sequences got no sequences"),
    ("pad-maxlen-zero", C(lambda: pad_sequences([[1, 2]], maxlen=0)), ValueError, "maxlen .*0"),
    ("pad-not-a-list", C(lambda: pad_sequences(5)), ValueError, "pad_sequences takes a list of sequences"),
    ("pad-feature-shapes", C(lambda: pad_sequences([np.zeros((2, 3)), np.zeros((2, 4))])), ValueError,
     r"sequence 1 has steps of shape \(4,\)"),
    ("pad-strings", C(lambda: pad_sequences([["a", "b"]])), ValueError, "sequence 0 is not numeric"),
    ("lengths-negative", C(lambda: lengths_to_mask([2, -1])), ValueError, "lengths must be .*non-negative"),
    ("lengths-maxlen-str", C(lambda: lengths_to_mask([2, 1], maxlen="x")), ValueError, "maxlen .*'x'"),
    ("bptt-batch-size-zero", C(lambda: bptt_batches(np.arange(50), 0, 5)), ValueError, "batch_size .*0"),
    ("bptt-too-short", C(lambda: bptt_batches(np.arange(5), 2, 5)), ValueError, "too short"),
    ("bptt-float-tokens", C(lambda: bptt_batches(np.linspace(0, 1, 50), 2, 5)), ValueError, "tokens must be a 1-D integer array"),
    ("char-vocab-not-text", C(lambda: char_vocab(5)), ValueError, "char_vocab takes a str, got int"),
]


@pytest.mark.parametrize("case_id, call, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly(case_id, call, exc, match, tmp_path):
    with pytest.raises(exc, match=match):
        call(tmp_path)


def test_the_corpus_covers_every_public_entry_point():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


def test_a_file_declaring_a_huge_architecture_is_refused_before_allocating(tmp_path):
    for units in (20000, 10 ** 6):  # 400M parameters (1.6 GB) and 10^12 (no MemoryError either)
        path = huge(tmp_path, units)
        assert os.path.getsize(path) < 5000
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            with pytest.raises(CheckpointError, match=f"the architecture declares {units * units + units:,}"):
                load_model(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.perf_counter() - t0 < 2.0
        assert peak < 20 * 2 ** 20, f"peak {peak / 2 ** 20:.1f} MiB while refusing"


def test_random_damage_to_a_model_file_is_refused_or_harmless(tmp_path):
    """Flipped bytes, truncations and insertions anywhere in a model file: each one is either
    refused with a CheckpointError or (bytes nobody reads, such as timestamps) loads the very
    same weights; never another exception."""
    good = saved(tmp_path)
    raw, params = open(good, "rb").read(), members(good)["params"]
    rng = np.random.default_rng(0)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(400):
        b = bytearray(raw)
        kind = int(rng.integers(0, 3))
        if kind == 0:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] ^= int(rng.integers(1, 256))
        elif kind == 1:
            del b[int(rng.integers(0, len(b))):]
        else:
            pos = int(rng.integers(0, len(b)))
            b[pos:pos] = rng.bytes(int(rng.integers(1, 50)))
        path = os.path.join(str(tmp_path), "fuzzed.npz")
        with open(path, "wb") as fh:
            fh.write(bytes(b))
        try:
            model, _ = load_model(path, with_optimizer=True)
        except CheckpointError:
            outcomes["refused"] += 1
        else:
            np.testing.assert_array_equal(model.params, params)
            outcomes["same"] += 1
    assert outcomes["refused"] > 300


def test_good_files_still_round_trip(tmp_path):
    path = saved(tmp_path)
    model, opt, extra = load_model(path, with_optimizer=True, with_extra=True)
    assert isinstance(opt, RMSprop) and opt.t == 2 and extra == {}
    assert set(opt.state) == {"square_avg", "momentum_buffer"}
    np.testing.assert_array_equal(model.params, members(path)["params"])


def test_a_compressed_model_file_loads_too(tmp_path):
    arrays = members(saved(tmp_path))
    path = os.path.join(str(tmp_path), "compressed.npz")
    np.savez_compressed(path, **arrays)
    model, opt = load_model(path, with_optimizer=True)
    np.testing.assert_array_equal(model.params, arrays["params"])
    np.testing.assert_array_equal(opt.state["momentum_buffer"], arrays["opt_momentum_buffer"])


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = saved(tmp_path, "m.npz")
    before = open(path, "rb").read()

    def half_written(fh, **arrays):
        fh.write(b"PK\x03\x04 partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(np, "savez", half_written)
    with pytest.raises(OSError, match="No space left"):
        save_model(clf(), path)
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]


def test_loaded_optimizer_state_must_fit_the_model(tmp_path):
    opt = RMSprop()
    opt.load_state_arrays({"opt_t": np.array([2]), "opt_square_avg": np.ones(43, np.float32)})
    model = Sequential([Dense(2, activation="softmax")], input_shape=(9,))  # 20 parameters, not 43
    with pytest.raises(ValueError, match="square_avg has 43 entries but there are 20 parameters"):
        model.fit(X20[:, :1].repeat(9, axis=1), Y20 % 2, epochs=1, optimizer=opt, verbose=0)


# ---------------------------------------------------------------- divergence
def recorded_fit(model: Sequential, X: np.ndarray, y: np.ndarray, opt: optim.Optimizer
                 ) -> tuple[TrainingDiverged, list[np.ndarray]]:
    """Fit until it diverges; returns the error and the weights each step started from."""
    starts: list[np.ndarray] = []
    loss_and_grad = model.loss_and_grad

    def recording(*args: Any, **kw: Any) -> Any:
        starts.append(model.params.copy())
        return loss_and_grad(*args, **kw)

    model.loss_and_grad = recording  # type: ignore[method-assign]  # observes, changes nothing
    with pytest.raises(TrainingDiverged, match="lower the learning rate") as info:
        model.fit(X, y, epochs=5, batch_size=32, optimizer=opt, verbose=0)
    return info.value, starts


def digits_mlp() -> Sequential:
    return Sequential([Dense(256, activation="relu"), Dense(128, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(64,), seed=0)


@pytest.mark.parametrize("opt, what", [(SGD(lr=1e3), "loss"), (RMSprop(lr=1e38), "parameters")],
                         ids=["lr=1e3: a non-finite loss, the step that led to it undone",
                              "lr=1e38: non-finite weights, undone"])
def test_divergence_stops_with_the_last_finite_weights(digits, opt, what):
    Xtr, ytr, _, _ = digits
    model = digits_mlp()
    err, starts = recorded_fit(model, Xtr, ytr, opt)
    assert isinstance(err, FloatingPointError) and err.what == what
    assert err.epoch == 1 and err.step == len(starts)
    assert f"the {what} became" in str(err) and f"epoch 1, step {err.step}" in str(err)
    assert np.isfinite(model.params).all()
    # a loss is computed at the weights the step before made: that step is undone too
    back = 2 if what == "loss" else 1
    np.testing.assert_array_equal(model.params, starts[err.step - back])
    assert opt.t == err.step - back  # the undone steps are not counted either
    assert all(np.isfinite(v).all() for v in opt.state.values())
    assert np.isfinite(model.evaluate(Xtr, ytr)["loss"])  # the weights kept give a finite loss
    if what == "parameters":  # undone back to the initial weights: the model predicts again
        assert err.step == 1 and np.isfinite(model.predict_proba(Xtr[:5])).all()

"""MLflow integration: a pyfunc flavour for sparknet networks and a logger callback.

Needs MLflow (``pip install 'sparknet[mlflow]'``, which installs ``mlflow-skinny``; the
full ``mlflow`` works too).  Importing this module does not import MLflow: each
function does, and says how to install it when it is missing.

The flavour (:func:`save_model`, :func:`log_model`, :func:`load_model`):

- the model directory holds the network as a sparknet model file (``data/model.npz``,
  :meth:`sparknet.Sequential.save`: flat weights and the JSON architecture, read back
  without pickle) and an ``MLmodel`` file with two flavours: ``python_function``
  (``loader_module: sparknet.mlflow``) and ``sparknet``.  No Python object is pickled;
- ``mlflow.pyfunc.load_model(uri).predict(...)`` takes what the signature describes
  (MLflow checks it first).  The default, ``input_schema="auto"``, is ``"columns"`` for a
  network of flat rows and ``"tensor"`` otherwise.  ``"columns"``: one numeric column per
  feature, matched by position (no names are invented), so a numpy array ``(N,
  features)`` of any float or integer dtype, a pandas DataFrame of those values (whatever
  its column names) and a Spark UDF's columns all work; with ``feature_names`` the
  columns are named and matched by name.  ``"array"``: a DataFrame of one column
  (``features_col``, default ``"features"``) holding a feature array per row.
  ``"tensor"``: a numpy array ``(N, *input_shape)`` of the network's dtype (MLflow
  refuses another dtype: ``X.astype("float32")``);
- it returns, with ``output="predict"`` (the default), what
  :meth:`~sparknet.Sequential.predict` returns: class ids (int64) for a classifier, the
  network's outputs for a regression; with ``output="proba"``, the class
  probabilities of :meth:`~sparknet.Sequential.predict_proba`, ``(N, classes)``;
- the signature's outputs: one ``long`` column for class ids, an array column for
  probabilities or a multi-output regression, one column of the network's float type
  for a single-output regression.  ``mlflow.pyfunc.spark_udf(spark, uri)`` takes its
  Spark result type from them (``long``, ``array<float>``, ...), so the UDF scores a
  DataFrame's feature columns (``udf(*columns)``, ``"columns"``) or its array column
  (``udf("features")``, ``"array"``) with no ``result_type`` to give;
- pip requirements: ``sparknet`` and ``numpy`` at the versions saving the model (MLflow
  adds itself).

A fitted Spark ML model (:class:`sparknet.ml.SparkNetClassificationModel` or
:class:`~sparknet.ml.SparkNetRegressionModel`) is logged through its ``network``.

:class:`MLflowLogger` is a training callback: at the start of a fit it logs the
trainer's and optimizer's settings and the model's architecture as parameters
(flattened: ``model.layers.0.config.units``), after every epoch the epoch's numeric logs
as metrics (step = the 0-based epoch; values that are not finite are skipped: a ``NaN`` ``val_loss``
of an epoch inside a round of several epochs), and at the end the model file as an
artifact and, with ``log_model=True``, the model in this flavour.  It uses the active
run, or starts one (and ends it) when none is active.  A fit that raises calls no
``on_fit_end``: a run the logger started then stays active until the logger's next fit
begins (which ends it as ``FAILED``) or ``mlflow.end_run()``.

Tracking stores: ``mlflow-skinny`` writes to a tracking server (``http://...``) or to
MLflow's file store (``file:/path/mlruns``; MLflow 3 keeps it in maintenance mode and
asks for ``MLFLOW_ALLOW_FILE_STORE=true``); a ``sqlite:`` store needs the full ``mlflow``
package (its database drivers).  MLflow 3 links a logged model to its run's metrics by
writing the run's latest values again, so a metric's history can hold a step twice
(with the same value).

Example::

    import mlflow
    import pandas as pd
    import sparknet.mlflow as snm

    logger = snm.MLflowLogger(run_name="digits")      # a run with params, metrics, the model
    model.fit(X, y, epochs=10, callbacks=[logger])
    uri = logger.model_info.model_uri

    scorer = mlflow.pyfunc.load_model(uri)             # the columns of the rows, by position
    scorer.predict(X_test)                             # == model.predict(X_test)
    scorer.predict(pd.DataFrame(X_test))               # the same
    udf = mlflow.pyfunc.spark_udf(spark, uri)         # result type long, from the signature
    df.withColumn("prediction", udf(*feature_columns))

    with mlflow.start_run():                           # probabilities, from numpy input
        info = snm.log_model(model, "proba", output="proba", input_schema="tensor")
"""
from __future__ import annotations

import importlib
import math
import numbers
import os
import tempfile
from types import ModuleType
from typing import Any, Mapping, Sequence

import numpy as np

from sparknet.callbacks import Callback
from sparknet.model import Sequential

FLAVOR_NAME = "sparknet"
#: the file name of the network inside the model directory's ``data`` folder
MODEL_FILE = "model.npz"
#: what the pyfunc model returns: class ids (or regression outputs), or class probabilities
OUTPUTS = ("predict", "proba")
#: the input signatures: "columns" for flat rows, else "tensor" ("auto"); one column per
#: feature; one column of feature arrays; one tensor
INPUT_SCHEMAS = ("auto", "columns", "array", "tensor")
#: MLflow's limits on a parameter (its key and its value's length) and on a batch
_MAX_PARAM_KEY = 250
_MAX_PARAM_VALUE = 6000
_PARAMS_PER_BATCH = 100

_INSTALL = "pip install 'sparknet[mlflow]'"


def _import(name: str) -> ModuleType:
    """Import ``name`` (``mlflow`` or one of its modules): absolute, never this module."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"sparknet.mlflow needs MLflow, which is not installed ({e}): {_INSTALL} "
                          f"(or pip install mlflow-skinny)") from e


def as_network(model: Any) -> Sequential:
    """The :class:`~sparknet.Sequential` behind ``model``: the model itself, or the
    ``network`` of a fitted :mod:`sparknet.ml` Model.

    Raises:
        TypeError: ``model`` is neither (an unfitted Estimator, another library's model).
        ValueError: the network is not built (not fitted, no input shape).
    """
    net = model
    package = type(model).__module__
    if not isinstance(model, Sequential) and (package == "sparknet.ml"
                                              or package.startswith("sparknet.ml.")):
        net = getattr(model, "network", None)
    if not isinstance(net, Sequential):
        unfitted = type(model).__name__.startswith("SparkNet")
        hint = " (fit it first: log the Model its fit returns)" if unfitted else ""
        raise TypeError(f"model must be a sparknet Sequential or a fitted sparknet.ml Model "
                        f"(SparkNetClassificationModel, SparkNetRegressionModel), got "
                        f"{type(model).__module__}.{type(model).__qualname__}{hint}")
    if not net.built:
        raise ValueError("model is a sparknet Sequential that is not built: fit it or call "
                         "build(input_shape) first")
    return net


def _check_choice(value: Any, what: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}; got "
                         f"{what}={value!r}")
    return str(value)


def _shape(shape: Sequence[int] | None) -> tuple[int, ...]:
    """A built network's per-row input or output shape."""
    if shape is None:
        raise ValueError("the network is not built: fit it or call build(input_shape) first")
    return tuple(int(d) for d in shape)


def _n_features(net: Sequential) -> int:
    return int(np.prod(_shape(net.input_shape)))


# ------------------------------------------------------------------ signature
def model_signature(model: Any, output: str = "predict", input_schema: str = "auto",
                    feature_names: Sequence[str] | None = None,
                    features_col: str = "features") -> Any:
    """The MLflow ``ModelSignature`` the flavour saves for ``model``.

    Args:
        model: a built :class:`~sparknet.Sequential` or a fitted :mod:`sparknet.ml` Model.
        output: ``"predict"`` (class ids, or regression outputs) or ``"proba"`` (class
            probabilities; classifiers only).
        input_schema: ``"auto"`` (default: ``"columns"`` for a network of flat rows,
            ``"tensor"`` for images or sequences), ``"columns"`` (one ``double`` column
            per feature: matched by position, so numpy arrays of any numeric dtype and
            DataFrames with any column names pass; by name with ``feature_names``),
            ``"array"`` (one column ``features_col`` of double arrays) or ``"tensor"``
            (one tensor ``(-1, *input_shape)`` of the network's dtype: numpy input of
            that dtype).
        feature_names: names for the ``"columns"`` (default: none, matched by position).
        features_col: the array column's name for ``"array"``.

    Returns:
        ``mlflow.models.ModelSignature``.

    Raises:
        ValueError: an unknown ``output`` or ``input_schema``, ``"proba"`` for a
            regression, or ``feature_names`` of the wrong length.
    """
    net = as_network(model)
    output = _check_choice(output, "output", OUTPUTS)
    input_schema = _check_choice(input_schema, "input_schema", INPUT_SCHEMAS)
    if output == "proba" and not net.is_classifier:
        raise ValueError("output='proba' needs a classifier (a cross-entropy network); this one "
                         f"has loss {net.loss.name!r}: use output='predict'")
    schema = _import("mlflow.types.schema")
    signature = _import("mlflow.models.signature")
    n = _n_features(net)
    if input_schema == "auto":
        input_schema = "columns" if len(_shape(net.input_shape)) == 1 else "tensor"
    if input_schema == "array":
        inputs = [schema.ColSpec(schema.Array(schema.DataType.double), features_col)]
    elif input_schema == "tensor":
        inputs = [schema.TensorSpec(np.dtype(net.dtype), (-1,) + _shape(net.input_shape))]
    else:
        names: list[str | None] = ([None] * n if feature_names is None
                                   else [str(c) for c in feature_names])
        if len(names) != n:
            raise ValueError(f"feature_names has {len(names)} names, the network reads {n} "
                             f"features (input shape {_shape(net.input_shape)})")
        inputs = [schema.ColSpec(schema.DataType.double, c) for c in names]
    float_type = schema.DataType.double if net.dtype == np.float64 else schema.DataType.float
    n_out = int(np.prod(_shape(net.output_shape)))
    if output == "proba":
        out = schema.ColSpec(schema.Array(float_type), "probability")
    elif net.is_classifier:
        out = schema.ColSpec(schema.DataType.long, "prediction")
    elif n_out == 1:
        out = schema.ColSpec(float_type, "prediction")
    else:
        out = schema.ColSpec(schema.Array(float_type), "prediction")
    return signature.ModelSignature(inputs=schema.Schema(inputs), outputs=schema.Schema([out]))


# ------------------------------------------------------------------ the flavour
def default_pip_requirements() -> list[str]:
    """``sparknet`` and ``numpy`` pinned at the versions in use (MLflow adds itself)."""
    import sparknet
    return [f"sparknet=={sparknet.__version__}", f"numpy=={np.__version__}"]


def save_model(model: Any, path: str | os.PathLike[str], output: str = "predict",
               input_schema: str = "auto", feature_names: Sequence[str] | None = None,
               features_col: str = "features",
               input_example: Any = None, pip_requirements: Sequence[str] | None = None,
               extra_pip_requirements: Sequence[str] | None = None,
               metadata: Mapping[str, Any] | None = None, mlflow_model: Any = None) -> None:
    """Save ``model`` as an MLflow model directory at ``path`` (which must not exist).

    Args:
        model: a built :class:`~sparknet.Sequential` or a fitted :mod:`sparknet.ml` Model.
        path: the new directory.
        output: what ``predict`` returns: ``"predict"`` (class ids for a classifier,
            outputs for a regression) or ``"proba"`` (class probabilities).  Stored as the
            pyfunc ``model_config``; ``mlflow.pyfunc.load_model(uri, model_config=
            {"output": "proba"})`` overrides it (the signature stays the saved one).
        input_schema: the signature's inputs: ``"auto"`` (default), ``"columns"``,
            ``"array"`` or ``"tensor"`` (see :func:`model_signature`).
        feature_names: column names of the ``"columns"`` signature (default: none, the
            columns are matched by position).
        features_col: column name of the ``"array"`` signature.
        input_example: a few rows of input (numpy or pandas), saved with the model.
        pip_requirements: replaces :func:`default_pip_requirements`.
        extra_pip_requirements: added to them.
        metadata: free-form metadata for the ``MLmodel`` file.
        mlflow_model: the ``mlflow.models.Model`` to add the flavours to (used by
            :func:`log_model`; default a new one).

    Raises:
        TypeError: ``model`` is not a sparknet model (see :func:`as_network`).
        ValueError: a bad ``output``, ``input_schema`` or ``feature_names``, or ``path``
            exists.
        ImportError: MLflow is not installed.
    """
    net = as_network(model)
    signature = model_signature(net, output, input_schema, feature_names, features_col)
    if os.path.exists(path):
        raise ValueError(f"path={os.fspath(path)!r} exists: save_model writes a new directory")
    pyfunc = _import("mlflow.pyfunc")
    models = _import("mlflow.models")
    if mlflow_model is None:
        mlflow_model = models.Model()
    import sparknet
    mlflow_model.add_flavor(FLAVOR_NAME, sparknet_version=sparknet.__version__, data=MODEL_FILE,
                            output=output, dtype=net.dtype.name)
    if input_example is not None and not signature.inputs.is_tensor_spec():
        input_example = _example_frame(input_example, signature, input_schema == "array")
    reqs = list(pip_requirements) if pip_requirements is not None else default_pip_requirements()
    with tempfile.TemporaryDirectory(prefix="sparknet-mlflow-") as tmp:
        data = os.path.join(tmp, MODEL_FILE)
        net.save(data)
        pyfunc.save_model(os.fspath(path), loader_module=__name__, data_path=data,
                          mlflow_model=mlflow_model, signature=signature,
                          input_example=input_example, pip_requirements=reqs,
                          extra_pip_requirements=None if extra_pip_requirements is None
                          else list(extra_pip_requirements),
                          metadata=None if metadata is None else dict(metadata),
                          model_config={"output": output})


def _example_frame(example: Any, signature: Any, arrays: bool) -> Any:
    """A numpy input example as a DataFrame of the signature: one column per feature,
    or (``arrays``) one column of feature arrays."""
    if not isinstance(example, np.ndarray):
        return example
    import pandas as pd
    names = signature.inputs.input_names()
    rows = example.reshape(example.shape[0], -1).astype(np.float64)
    if arrays:
        return pd.DataFrame({names[0]: list(rows)})
    return pd.DataFrame(rows, columns=names)


def log_model(model: Any, artifact_path: str = "model", **kwargs: Any) -> Any:
    """Log ``model`` in this flavour to the active MLflow run (one is started if none is).

    Args:
        model: a built :class:`~sparknet.Sequential` or a fitted :mod:`sparknet.ml` Model.
        artifact_path: the logged model's name in the run.
        **kwargs: :func:`save_model`'s options (``output``, ``input_schema``,
            ``feature_names``, ``features_col``, ``input_example``, ``pip_requirements``,
            ``extra_pip_requirements``, ``metadata``) and MLflow's ``Model.log`` options
            (``registered_model_name``, ``tags``, ``params``, ``step``, ...).

    Returns:
        MLflow's ``ModelInfo``: ``model_info.model_uri`` loads it back.

    Raises:
        TypeError: ``model`` is not a sparknet model.
        ImportError: MLflow is not installed.
    """
    as_network(model)
    models = _import("mlflow.models")
    return models.Model.log(artifact_path=None, name=artifact_path,
                            flavor=importlib.import_module(__name__), model=model, **kwargs)


def load_model(model_uri: str) -> Sequential:
    """The :class:`~sparknet.Sequential` of a model saved or logged in this flavour.

    Args:
        model_uri: ``runs:/<run_id>/<name>``, ``models:/<model_id>``, a local path, ...

    Raises:
        ValueError: the model at ``model_uri`` has no ``sparknet`` flavour.
        ImportError: MLflow is not installed.
    """
    artifacts = _import("mlflow.artifacts")
    models = _import("mlflow.models")
    local = artifacts.download_artifacts(artifact_uri=model_uri)
    conf = models.Model.load(os.path.join(local, "MLmodel")).flavors.get(FLAVOR_NAME)
    if conf is None:
        raise ValueError(f"model_uri={model_uri!r} is not a sparknet model (its MLmodel file has "
                         f"no {FLAVOR_NAME!r} flavour)")
    return Sequential.load(os.path.join(local, "data", conf["data"]))


class _PyfuncModel:
    """What ``mlflow.pyfunc.load_model`` wraps: the network and the chosen output."""

    def __init__(self, network: Sequential, output: str) -> None:
        self.network = network
        self.output = _check_choice(output, "output", OUTPUTS)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        x = features_array(model_input, self.network)
        if self.output == "proba":
            return self.network.predict_proba(x)
        return self.network.predict(x)


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> _PyfuncModel:
    """The pyfunc loader MLflow calls with the model's ``data`` file (``loader_module``)."""
    output = (model_config or {}).get("output", "predict")
    return _PyfuncModel(Sequential.load(data_path), output)


def features_array(model_input: Any, network: Sequential) -> np.ndarray:
    """``model_input`` as the network's input array ``(N, *input_shape)``.

    Takes a numpy array (or nested lists) of ``N`` rows, a pandas DataFrame of one
    numeric column per feature (in the signature's order), or a DataFrame of one column
    whose cells are feature arrays.

    Raises:
        ValueError: the rows do not hold the network's feature count.
    """
    import pandas as pd
    if isinstance(model_input, pd.DataFrame):
        if model_input.shape[1] == 1 and pd.api.types.is_object_dtype(model_input.dtypes.iloc[0]):
            col = model_input.iloc[:, 0]
            x = np.stack([np.asarray(v, dtype=network.dtype) for v in col]) if len(col) else \
                np.empty((0, _n_features(network)), network.dtype)
        else:
            x = model_input.to_numpy(dtype=network.dtype)
    else:
        x = np.asarray(model_input, dtype=network.dtype)
    shape = _shape(network.input_shape)
    if x.ndim == 0 or int(np.prod(x.shape[1:])) != int(np.prod(shape)):
        raise ValueError(f"model_input has shape {x.shape}: the network reads rows of "
                         f"{int(np.prod(shape))} features (input shape {shape})")
    return x.reshape((x.shape[0],) + shape)


# ------------------------------------------------------------------ the logger
def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts and lists as MLflow parameters: ``{"a.b.0": "value"}``.

    Keys past MLflow's 250 characters and values past 6000 are cut (the value ending
    in ``...``); ``None`` becomes ``"None"``.
    """
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple))
                                                      for v in value):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}")
        else:
            text = str(value)
            if len(text) > _MAX_PARAM_VALUE:
                text = text[:_MAX_PARAM_VALUE - 3] + "..."
            out[key[:_MAX_PARAM_KEY]] = text

    walk(tree, prefix)
    return out


def trainer_settings(trainer: Any) -> dict[str, Any]:
    """A trainer's public settings: its attributes that are numbers, strings or booleans,
    and the ``get_config()`` of those that have one (an outer optimizer); the model, the
    optimizer (logged on its own), the session, state objects and unset (``None``)
    attributes are left out."""
    if trainer is None:
        return {}
    out: dict[str, Any] = {}
    for k, v in sorted(vars(trainer).items()):
        if k.startswith("_") or k in ("model", "optimizer") or v is None:
            continue
        if isinstance(v, (str, bool, numbers.Number)):
            out[k] = v
        elif callable(getattr(v, "get_config", None)):
            out[k] = {"name": type(v).__name__, **v.get_config()}
    return out


def _optimizer_settings(optimizer: Any) -> dict[str, Any]:
    if optimizer is None:
        return {}
    config = optimizer.get_config() if hasattr(optimizer, "get_config") else {}
    return {"name": type(optimizer).__name__, **config}


class MLflowLogger(Callback):
    """A training callback that records a fit in MLflow.

    At fit begin: starts a run when none is active (named ``run_name``, with ``tags``,
    in ``experiment_name`` when given), else uses the active one; logs as parameters
    the scalar entries of the fit's ``logs``, the trainer's settings (``trainer.*``),
    the optimizer's (``optimizer.*``) and the model's architecture (``model.*``).
    After each epoch: the epoch's finite numeric logs as metrics, ``step=epoch``.  At
    fit end: the model file (``<artifact_path>.npz``, :meth:`sparknet.Sequential.save`)
    as a run artifact, the model in the pyfunc flavour when ``log_model`` (name
    ``artifact_path``, :func:`log_model` with ``log_model_kwargs``), and ends the run
    if it started it.

    Args:
        run_name: the name of a run this callback starts.
        log_model: log the model in this module's flavour at fit end.
        artifact_path: name of the logged model (and stem of the model file).
        experiment_name: the experiment of a run this callback starts (default the
            active experiment).
        tags: tags of a run this callback starts.
        log_model_kwargs: options for :func:`log_model` (``output``, ``input_example``, ...).

    Attributes:
        run_id: the run written to (set at fit begin).
        model_info: the ``ModelInfo`` of the logged model (set at fit end with ``log_model``).
    """

    def __init__(self, run_name: str | None = None, log_model: bool = True,
                 artifact_path: str = "model", experiment_name: str | None = None,
                 tags: Mapping[str, Any] | None = None,
                 log_model_kwargs: Mapping[str, Any] | None = None) -> None:
        if run_name is not None and not isinstance(run_name, str):
            raise ValueError(f"run_name must be a string or None, got run_name={run_name!r}")
        if not isinstance(log_model, bool):
            raise ValueError(f"log_model must be True or False, got log_model={log_model!r}")
        if not isinstance(artifact_path, str) or not artifact_path or "/" in artifact_path:
            raise ValueError("artifact_path must be a non-empty name without '/', got "
                             f"artifact_path={artifact_path!r}")
        super().__init__()
        self.run_name = run_name
        self.log_model = log_model
        self.artifact_path = artifact_path
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.log_model_kwargs = dict(log_model_kwargs or {})
        self.run_id: str | None = None
        self.model_info: Any = None
        self._owns_run = False

    def _network(self) -> Sequential:
        """The trained network: the model, or a model-parallel model gathered."""
        if self.model is None:
            raise RuntimeError("MLflowLogger has no model: the trainer calls set_context(model, "
                               "trainer) before the fit")
        if not isinstance(self.model, Sequential) and hasattr(self.model, "to_sequential"):
            return as_network(self.model.to_sequential())
        return as_network(self.model)

    def _params(self, logs: Mapping[str, Any] | None) -> dict[str, str]:
        """The fit's parameters, flattened: the logs' scalars, trainer, optimizer, model."""
        params: dict[str, Any] = {k: v for k, v in (logs or {}).items()
                                  if v is None or isinstance(v, (str, bool, numbers.Number))}
        trainer = self.trainer
        own = trainer is None or trainer is self.model
        params["trainer"] = {"class": type(self.model if own else trainer).__name__
                             + (".fit" if own else ""),
                             **({} if own else trainer_settings(trainer))}
        optimizer = getattr(trainer, "optimizer", None) or getattr(self.model, "optimizer", None)
        params["optimizer"] = _optimizer_settings(optimizer)
        if hasattr(self.model, "get_config"):
            n_params = getattr(self.model, "n_params", None)
            params["model"] = {**({"n_params": n_params} if isinstance(n_params, int) else {}),
                               **self.model.get_config()}
        return flatten_params(params)

    def on_fit_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        """Start or join a run and log the fit's parameters."""
        mlflow = _import("mlflow")
        run = mlflow.active_run()
        if run is not None and self._owns_run and run.info.run_id == self.run_id:
            mlflow.end_run(status="FAILED")  # the previous fit raised: no on_fit_end closed its run
            run = None
        self._owns_run = run is None
        if run is None:
            if self.experiment_name is not None:
                mlflow.set_experiment(self.experiment_name)
            run = mlflow.start_run(run_name=self.run_name, tags=self.tags or None)
        self.run_id = run.info.run_id
        self.model_info = None
        flat = list(self._params(logs).items())
        client = _import("mlflow.tracking").MlflowClient()
        param = _import("mlflow.entities").Param
        for i in range(0, len(flat), _PARAMS_PER_BATCH):
            client.log_batch(self.run_id,
                             params=[param(k, v) for k, v in flat[i:i + _PARAMS_PER_BATCH]])

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        """Log the epoch's finite numeric ``logs`` as metrics at ``step=epoch``."""
        if self.run_id is None:
            raise RuntimeError("MLflowLogger.on_epoch_end before on_fit_begin: the trainer starts "
                               "the fit first")
        metrics = {str(k): float(v) for k, v in (logs or {}).items()
                   if isinstance(v, numbers.Real) and not isinstance(v, bool)
                   and math.isfinite(float(v))}
        if metrics:
            _import("mlflow").log_metrics(metrics, step=int(epoch), run_id=self.run_id)

    def on_fit_end(self, logs: Mapping[str, Any] | None = None) -> None:
        """Log the model file (and the pyfunc model) and end the run this callback started."""
        mlflow = _import("mlflow")
        try:
            net = self._network()
            with tempfile.TemporaryDirectory(prefix="sparknet-mlflow-") as tmp:
                path = os.path.join(tmp, f"{self.artifact_path}.npz")
                net.save(path)
                mlflow.log_artifact(path, run_id=self.run_id)
            if self.log_model:
                self.model_info = log_model(net, self.artifact_path, run_id=self.run_id,
                                            **self.log_model_kwargs)
        finally:
            if self._owns_run:
                mlflow.end_run()
                self._owns_run = False

"""ML persistence for sparknet's Estimators and Models, with no pickle on the load path.

Layout of a saved stage at ``path`` (any Hadoop file system Spark can write):

- ``path/metadata``: Spark's standard JSON metadata
  (:meth:`pyspark.ml.util.DefaultParamsWriter.saveMetadata`): class, uid, Spark version
  and every Param (the network architecture is the ``network`` Param, JSON text);
- ``path/data`` (Models only): a one-row Parquet file with one ``binary`` column,
  ``model``, holding the fitted network as a sparknet model file
  (:func:`sparknet.io.save_model`: an ``.npz`` of plain arrays, JSON architecture plus
  the flat weights).

A save is atomic: everything is written into a hidden folder beside ``path``
(``.<name>.sparknet-tmp-<id>``) that is renamed to ``path`` once complete, through
Hadoop's ``FileSystem`` (a rename within one folder: atomic on local and HDFS file
systems).  A failed write deletes the hidden folder and leaves ``path`` as it was; with
``overwrite()`` the old folder stays in place until the new one is complete.  The
metadata also records the stored network's architecture, parameter count and the
SHA-256 of its bytes.

Loading reads the JSON, checks that the class named there is one of sparknet's ML
classes (and the one asked for), then reads the Parquet bytes and opens them with
:func:`sparknet.io.load_model`, which uses ``numpy.load(..., allow_pickle=False)`` and
refuses object arrays: a file crafted to run code on load is rejected before anything
in it runs.  Weights that are not the ones saved with the metadata (another network's,
truncated, altered) are refused, naming both networks or the checksum.  Every damaged
file (metadata, stored network, training history) raises
:class:`~sparknet.errors.CheckpointError` (a ``ValueError``) naming it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import uuid
from typing import Any, ClassVar, TypeVar

from pyspark.ml.param import Params
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparknet.cluster.engine.base import HadoopPath, engine_for
from sparknet.errors import CheckpointError
from sparknet.model import Sequential

#: Classes this reader instantiates (metadata naming anything else is refused).
SPARKNET_CLASSES = ("sparknet.ml.SparkNetClassifier", "sparknet.ml.SparkNetRegressor",
                    "sparknet.ml.SparkNetClassificationModel",
                    "sparknet.ml.SparkNetRegressionModel")
FORMAT_VERSION = 1
#: age past which the hidden temporary folder of a save is taken for a killed save's, and
#: deleted by the next save to the same path (a save of a model takes seconds)
STALE_SAVE_SECONDS = 3600.0


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def network_to_bytes(model: Sequential) -> bytes:
    """A built Sequential as the bytes of a sparknet model file."""
    from sparknet.io import save_model

    with tempfile.TemporaryDirectory(prefix="sparknet-ml-") as tmp:
        path = os.path.join(tmp, "model.npz")
        save_model(model, path)
        with open(path, "rb") as fh:
            return fh.read()


def network_from_bytes(blob: bytes, where: str) -> Sequential:
    """The Sequential stored in ``blob`` (a sparknet model file; pickle is refused)."""
    from sparknet.io import load_model

    if not isinstance(blob, (bytes, bytearray)):
        raise CheckpointError(f"{where}: the weights entry is not binary data")
    with tempfile.TemporaryDirectory(prefix="sparknet-ml-") as tmp:
        path = os.path.join(tmp, "model.npz")
        with open(path, "wb") as fh:
            fh.write(blob)
        try:
            return load_model(path)
        except Exception as exc:  # numpy/zip errors of a damaged file too: all named here
            why = str(exc).replace(repr(path), "the stored model").replace(path, "the stored model")
            if not isinstance(exc, ValueError):
                why = f"the stored model file is damaged ({type(exc).__name__}: {why})"
            raise CheckpointError(f"{where}: {why}") from exc


def describe_network(config: dict[str, Any], n_params: int | None) -> str:
    """A one-line description of an architecture, e.g. ``input (64,), Dense(8) ->
    Dense(10), 610 parameters``, for messages that compare two networks."""
    layers = []
    for layer in config.get("layers") or []:
        cfg = layer.get("config") or {}
        size = next((cfg[k] for k in ("units", "filters") if k in cfg), None)
        layers.append(f"{layer.get('class', '?')}({'' if size is None else size})")
    shape = config.get("input_shape")
    count = "?" if n_params is None else f"{n_params}"
    return (f"input {tuple(shape) if shape else '?'}, {' -> '.join(layers) or 'no layers'}, "
            f"{count} parameters")


def check_params_json(instance: Params) -> None:
    """Raise ValueError naming the first Param whose value JSON cannot hold (before
    anything is written)."""
    for param, value in [*instance._paramMap.items(), *instance._defaultParamMap.items()]:
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cannot save {type(instance).__name__}: Param {param.name} holds "
                             f"{value!r}, which JSON cannot store ({exc})") from None


class _Folder:
    """Hadoop ``FileSystem`` operations on a stage folder and its hidden siblings."""

    def __init__(self, where: HadoopPath) -> None:
        self._jvm, self.fs, self.target = where.jvm, where.fs, where.path

    @classmethod
    def of(cls, spark: Any, path: str) -> _Folder | None:
        """The folder ``path`` of ``spark``'s file system, or None where this client reaches
        no Hadoop ``FileSystem`` (Spark Connect)."""
        where = engine_for(spark, fit=False).filesystem(path)
        return None if where is None else cls(where)

    def sibling(self, kind: str) -> Any:
        """A new hidden path beside the target: ``.<name>.sparknet-<kind>-<id>``."""
        name = f".{self.target.getName()}.sparknet-{kind}-{uuid.uuid4().hex[:12]}"
        return self._jvm.org.apache.hadoop.fs.Path(self.target.getParent(), name)

    def exists(self, p: Any) -> bool:
        return bool(self.fs.exists(p))

    def leftovers(self, kind: str, older_than: float = 0.0) -> list[str]:
        """The hidden ``kind`` siblings (``"tmp"``, ``"old"``) that saves killed before
        they finished left beside the target, last modified over ``older_than`` seconds ago."""
        parent = self.target.getParent()
        if parent is None or not self.fs.exists(parent):
            return []
        pattern = self._jvm.org.apache.hadoop.fs.Path(parent,
                                                      f".{self.target.getName()}.sparknet-{kind}-*")
        now_ms = time.time() * 1000.0
        found = self.fs.globStatus(pattern) or []
        return [st.getPath().toString() for st in found
                if now_ms - st.getModificationTime() > older_than * 1000.0]

    def remove_stale(self) -> None:
        """Delete the temporary folders of saves to the target killed over
        :data:`STALE_SAVE_SECONDS` ago (a live save's folder is younger)."""
        for p in self.leftovers("tmp", STALE_SAVE_SECONDS):
            self.delete(self._jvm.org.apache.hadoop.fs.Path(p))

    def delete(self, p: Any) -> None:
        try:
            self.fs.delete(p, True)
        except Exception:  # noqa: BLE001 -- cleanup after a failure must not hide it
            pass

    def put_in_place(self, tmp: Any) -> None:
        """Rename the complete ``tmp`` to the target; an old target is moved aside first
        and deleted only after the new one is in place (put back if that rename fails)."""
        old = None
        if self.exists(self.target):
            old = self.sibling("old")
            if not self.fs.rename(self.target, old):
                raise OSError(f"cannot move the old {self.target.toString()} aside to replace it")
        if not self.fs.rename(tmp, self.target):
            if old is not None:
                self.fs.rename(old, self.target)
            raise OSError(f"cannot rename the saved stage into place at {self.target.toString()}")
        if old is not None:
            self.delete(old)


class Persistable(Params, MLReadable[Any], MLWritable):
    """ML persistence shared by the Estimators and the Models: ``write()`` and ``read()``
    in the layout above.  A Model sets :attr:`_has_network` and :meth:`_set_network`."""

    #: whether the stage saves a fitted network beside its Params
    _has_network: ClassVar[bool] = False
    #: the fitted network (Models only)
    _network: Sequential | None = None
    #: the training history of the fit that made a Model (Models only; saved in the metadata)
    _history: Any = None

    def write(self) -> SparkNetWriter:
        return SparkNetWriter(self)

    @classmethod
    def read(cls: type[_S]) -> SparkNetReader[_S]:
        return SparkNetReader(cls)

    @classmethod
    def load(cls: type[_S], path: str) -> _S:
        """The stage saved at ``path`` (``read().load(path)``)."""
        return cls.read().load(path)

    def _set_network(self, network: Sequential) -> None:
        raise TypeError(f"{type(self).__name__} holds no fitted network")


_S = TypeVar("_S", bound=Persistable)


class SparkNetWriter(MLWriter):
    """Writes the Params as Spark metadata and, for Models, the network as Parquet bytes."""

    def __init__(self, instance: Persistable) -> None:
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Save the stage to ``path`` atomically (see the module docstring): written in a
        hidden folder beside it, renamed into place when complete.  An existing ``path``
        is refused unless ``overwrite()`` was called; then it is replaced only once the
        new folder is complete."""
        if not isinstance(path, str) or not path:
            raise TypeError(f"path must be a non-empty str, got {path!r}")
        check_params_json(self.instance)
        folder = _Folder.of(self.sparkSession, path)
        if folder is None:  # no Hadoop FileSystem on this client (Spark Connect): Spark's save
            super().save(path)
            return
        folder.remove_stale()
        if folder.exists(folder.target) and not self.shouldOverwrite:
            raise ValueError(f"cannot save to {path!r}: it already exists; use "
                             f"write().overwrite().save(path) to replace it")
        tmp = folder.sibling("tmp")
        try:
            self.saveImpl(tmp.toString())
            folder.put_in_place(tmp)
        except BaseException as exc:
            folder.delete(tmp)
            if isinstance(exc, (ValueError, TypeError)) or not isinstance(exc, Exception):
                raise
            kept = ("the folder there is unchanged" if folder.exists(folder.target)
                    else "nothing was left there")
            raise OSError(f"cannot save {type(self.instance).__name__} to {path!r}: "
                          f"{_first_line(exc)} ({kept})") from exc

    def saveImpl(self, path: str) -> None:
        inst = self.instance
        network = inst._network
        extra: dict[str, Any] = {"sparknet_format": FORMAT_VERSION}
        blob = b""
        if network is not None:
            blob = network_to_bytes(network)
            extra.update(numParams=int(network.n_params),
                         networkSha256=hashlib.sha256(blob).hexdigest(),
                         architecture=network.get_config())
        history = getattr(inst, "_history", None)
        if history is not None:  # the per-epoch metrics: a few values an epoch
            extra["history"] = json.loads(_epoch_metrics(history).to_json())
        DefaultParamsWriter.saveMetadata(inst, path, self.sparkSession, extraMetadata=extra)
        if network is not None:
            from pyspark.sql import types as T

            schema = T.StructType([T.StructField("model", T.BinaryType(), False)])
            df = self.sparkSession.createDataFrame([(bytearray(blob),)], schema)
            df.coalesce(1).write.mode("error").parquet(os.path.join(path, "data"))


class SparkNetReader(MLReader[_S]):
    """Reads what :class:`SparkNetWriter` wrote, refusing foreign classes and pickles."""

    def __init__(self, cls: type[_S]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> _S:
        if str(path).endswith(".npz") and os.path.isfile(path):
            raise ValueError(f"{path!r} is a sparknet model file (.npz), not a saved Spark ML "
                             f"stage: load it with sparknet.load_model({path!r}), or wrap a "
                             f"network in a Model by fitting an Estimator")
        try:
            metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        except Exception as exc:  # a Py4J/Analysis error for a missing or unreadable folder
            hint, error = "", ValueError
            folder = _Folder.of(self.sparkSession, path)
            if folder is not None:
                old = folder.leftovers("old")
                if old:  # killed between moving the old folder aside and renaming the new one in
                    hint = ("; an overwrite of it was interrupted, its previous version is at "
                            f"{old[-1]}")
                if folder.exists(folder.target):  # there, but unreadable: damaged
                    error = CheckpointError
            raise error(f"{path!r} holds no readable saved stage (its metadata/ folder "
                        f"{os.path.join(path, 'metadata')!r}: {_first_line(exc)}){hint}") from None
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{os.path.join(path, 'metadata')!r} is damaged: not a JSON "
                                  "object")
        name = metadata.get("class")
        want = class_name(self.cls)
        if name not in SPARKNET_CLASSES:
            raise ValueError(f"{path!r} holds a {name!r}, not a sparknet ML stage; refusing to "
                             "load it")
        if name != want:
            raise ValueError(f"{path!r} holds a {name}; load it with {name.rsplit('.', 1)[1]}.load")
        version = metadata.get("sparknet_format")
        if version != FORMAT_VERSION:
            raise ValueError(f"{path!r} has sparknet ML format {version!r}; this sparknet reads "
                             f"{FORMAT_VERSION}")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if self.cls._has_network:
            instance._set_network(self._network(path, metadata))
        if metadata.get("history") is not None:
            from sparknet.history import History

            try:
                instance._history = History.from_json(json.dumps(metadata["history"]),
                                                      f"{path!r}: the training history in its "
                                                      "metadata")
            except ValueError as exc:
                raise CheckpointError(str(exc)) from None
        return instance

    def _network(self, path: str, metadata: dict[str, Any]) -> Sequential:
        """The stored network, checked against what the metadata says was saved."""
        try:
            # through Arrow (not collect(), whose rows travel as pickles)
            table = self.sparkSession.read.parquet(os.path.join(path,
                                                                "data")).select("model").toArrow()
        except Exception as exc:  # a Py4J/Analysis error: missing, truncated or foreign Parquet
            raise CheckpointError(f"{path!r}: its stored network (data/) cannot be read: "
                                  f"{_first_line(exc)}") from None
        if table.num_rows != 1:
            raise CheckpointError(f"{path!r}: expected one stored network in data/, found "
                                  f"{table.num_rows}")
        blob = table.column(0)[0].as_py()
        network = network_from_bytes(blob, f"{path!r}: its stored network (data/)")
        saved = metadata.get("architecture")
        want_n = metadata.get("numParams")
        if (want_n is not None and int(want_n) != network.n_params) or \
                (saved is not None and _layout(network.get_config()) != _layout(saved)):
            described = describe_network(saved, want_n) if saved else f"{want_n} parameters"
            raise CheckpointError(f"{path!r}: the weights in data/ belong to another network: the "
                                  f"metadata describes {described}, data/ holds "
                                  f"{describe_network(network.get_config(), network.n_params)}")
        digest = metadata.get("networkSha256")
        if digest is not None and hashlib.sha256(blob).hexdigest() != digest:
            raise CheckpointError(f"{path!r}: the weights in data/ are not the ones saved with its "
                                  "metadata (SHA-256 differs; same architecture, other or altered "
                                  "values)")
        return network


def _epoch_metrics(history: Any) -> Any:
    """A plain :class:`~sparknet.history.History` of ``history``'s per-epoch metrics (what a
    saved Model keeps: not a data-parallel fit's set-up times or per-delta records)."""
    from sparknet.history import History

    plain = History()
    plain.epoch, plain.history = list(history.epoch), {k: list(v)
                                                       for k, v in history.history.items()}
    return plain


def _layout(config: dict[str, Any]) -> Any:
    """An architecture as JSON values, without its seed (which only chose the initial weights)."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k != "seed"}))


def _first_line(exc: BaseException) -> str:
    """The first meaningful line of an error (a Py4J error's Java message, not its trace)."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()
             and not ln.strip().startswith("at ")]
    java = [ln for ln in lines if "Exception:" in ln or "Error:" in ln or ln.startswith("[")]
    line = (java or lines or [type(exc).__name__])[0]
    return line if len(line) <= 300 else line[:297] + "..."

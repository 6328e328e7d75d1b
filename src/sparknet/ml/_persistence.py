"""ML persistence for sparknet's Estimators and Models, with no pickle on the load path.

Layout of a saved stage at ``path`` (any Hadoop file system Spark can write):

- ``path/metadata``: Spark's standard JSON metadata
  (:meth:`pyspark.ml.util.DefaultParamsWriter.saveMetadata`): class, uid, Spark version
  and every Param (the network architecture is the ``network`` Param, JSON text);
- ``path/data`` (Models only): a one-row Parquet file with one ``binary`` column,
  ``model``, holding the fitted network as a sparknet model file
  (:func:`sparknet.io.save_model`: an ``.npz`` of plain arrays, JSON architecture plus
  the flat weights).

Loading reads the JSON, checks that the class named there is one of sparknet's ML
classes (and the one asked for), then reads the Parquet bytes and opens them with
:func:`sparknet.io.load_model`, which uses ``numpy.load(..., allow_pickle=False)`` and
refuses object arrays: a file crafted to run code on load is rejected with a
``ValueError`` before anything in it runs.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, ClassVar, TypeVar

from pyspark.ml.param import Params
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparknet.model import Sequential

#: Classes this reader instantiates (metadata naming anything else is refused).
SPARKNET_CLASSES = ("sparknet.ml.SparkNetClassifier", "sparknet.ml.SparkNetRegressor",
                    "sparknet.ml.SparkNetClassificationModel", "sparknet.ml.SparkNetRegressionModel")
FORMAT_VERSION = 1


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
        raise ValueError(f"{where}: the weights entry is not binary data")
    with tempfile.TemporaryDirectory(prefix="sparknet-ml-") as tmp:
        path = os.path.join(tmp, "model.npz")
        with open(path, "wb") as fh:
            fh.write(blob)
        try:
            return load_model(path)
        except ValueError as exc:
            raise ValueError(f"{where}: {str(exc).replace(repr(path), 'the stored model')}") from exc


class Persistable(Params, MLReadable[Any], MLWritable):
    """ML persistence shared by the Estimators and the Models: ``write()`` and ``read()``
    in the layout above.  A Model sets :attr:`_has_network` and :meth:`_set_network`."""

    #: whether the stage saves a fitted network beside its Params
    _has_network: ClassVar[bool] = False
    #: the fitted network (Models only)
    _network: Sequential | None = None

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

    def saveImpl(self, path: str) -> None:
        inst = self.instance
        network = inst._network
        extra = {"sparknet_format": FORMAT_VERSION}
        if network is not None:
            extra["numParams"] = int(network.n_params)
        DefaultParamsWriter.saveMetadata(inst, path, self.sparkSession, extraMetadata=extra)
        if network is not None:
            from pyspark.sql import types as T

            schema = T.StructType([T.StructField("model", T.BinaryType(), False)])
            df = self.sparkSession.createDataFrame([(bytearray(network_to_bytes(network)),)], schema)
            df.coalesce(1).write.mode("overwrite" if self.shouldOverwrite else "errorifexists") \
                .parquet(os.path.join(path, "data"))


class SparkNetReader(MLReader[_S]):
    """Reads what :class:`SparkNetWriter` wrote, refusing foreign classes and pickles."""

    def __init__(self, cls: type[_S]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> _S:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        name = metadata.get("class")
        want = class_name(self.cls)
        if name not in SPARKNET_CLASSES:
            raise ValueError(f"{path!r} holds a {name!r}, not a sparknet ML stage; refusing to load it")
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
            # through Arrow (not collect(), whose rows travel as pickles)
            table = self.sparkSession.read.parquet(os.path.join(path, "data")).select("model").toArrow()
            if table.num_rows != 1:
                raise ValueError(f"{path!r}: expected one stored network, found {table.num_rows}")
            network = network_from_bytes(table.column(0)[0].as_py(), f"{path!r}")
            instance._set_network(network)
        return instance

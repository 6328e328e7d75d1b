"""The data of one data-parallel fit on the executors: its training and validation
shards, loaded side by side and checked against the model.

When the model is built before the fit (its ``input_shape`` known), the validation
data is loaded in a second driver thread while the training data loads: its driver-side
planning and its job's scheduling overlap the training shards' job, and its tasks start
as soon as an executor slot frees (``history.setup_breakdown["validation data"]`` then
holds only the wait past the training shards).  An unbuilt model is built from the
training data first, so its validation data is checked against that and loaded after.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING, Any, Iterator

from sparknet.cluster.data.labels import check_label_range, label_desc
from sparknet.cluster.data.sharding import ShardedData, is_dataframe, is_rdd, shard_data
from sparknet.cluster.engine.base import engine_for
from sparknet.errors import InputRankError

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
    from sparknet.model import Sequential


def n_outputs(model: "Sequential") -> int:
    """Outputs of a built model (its classes, for a classifier)."""
    if model.output_shape is None:
        raise RuntimeError("the model is not built")
    return tuple(model.output_shape)[-1]


def split_validation(validation_data: Any) -> tuple[Any, Any]:
    """``validation_data`` as ``(data, y)``: a DataFrame or RDD (``y`` None) or ``(X, y)``."""
    if is_dataframe(validation_data) or is_rdd(validation_data):
        return validation_data, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) == 2:
        return validation_data[0], validation_data[1]
    raise ValueError("validation_data must be a DataFrame, an RDD of (x, y) pairs or a tuple "
                     "(X_val, y_val)")


def load(trainer: "DataParallelTrainer", data: Any, y: Any, cols: tuple[str, str],
         classification: bool, num_partitions: int | None, what: str, name: str,
         reuse: bool = True) -> ShardedData:
    """``data`` on the executors, checked; builds the model from the data's feature
    length when it is not built yet."""
    model = trainer.model
    features_col, label_col = cols
    n_classes = n_outputs(model) if (model.built and classification) else None
    d = shard_data(data, y, sc=engine_for(trainer.spark), num_partitions=num_partitions,
                   features_col=features_col, label_col=label_col, dtype=model.dtype,
                   classification=classification, n_classes=n_classes,
                   sample_shape=model.input_shape, seed=trainer.seed, what=what, name=name,
                   reuse=reuse)
    try:
        if not model.built:
            try:
                model.build((d.dim,))
            except ValueError as exc:
                raise flat_rows_error(exc, model, d.dim, f"the {what}") from None
        if classification:
            check_label_range(d.resident.infos, n_outputs(model), what,
                              label_desc(d.source, label_col))
    except BaseException:
        d.close()
        raise
    return d


def flat_rows_error(exc: ValueError, model: Any, size: int, where: str) -> ValueError:
    """The error for a network whose first layer cannot read flat rows of ``size`` numbers
    (a Conv2D, a recurrent layer: an :class:`~sparknet.errors.InputRankError` of layer 0)
    and was given no input shape: how to give it one, in the trainer (``input_shape``) and
    in the Estimators (``inputShape``); ``exc`` itself when the build failed for another
    reason."""
    if not (isinstance(exc, InputRankError) and exc.index == 0 and exc.got == (size,)):
        return exc
    first = model.layers[0]
    side = math.isqrt(size)
    square = side * side == size
    if exc.rank == 3:
        shape = f"({side}, {side}, 1) for {side} x {side} gray-scale images" if square else \
            "(H, W, C)"
    elif exc.rank == 2:
        shape = f"({side}, {side}) for {side} steps of {side} features" if square else "(T, F)"
    else:
        return exc
    return ValueError(
        f"layer 0 ({type(first).__name__} {first.name!r}) takes {exc.layout}, and {where} holds "
        f"flat rows of {size} numbers: give the network the shape each row is read as, e.g. "
        f"{shape} (Sequential(..., input_shape=...) for a trainer, the inputShape Param for "
        f"an Estimator); its product must be {size}")


def _partitions(trainer: "DataParallelTrainer", data: Any,
                num_partitions: int | None) -> int | None:
    """The training shards' count, known before they are built."""
    if num_partitions is not None:
        return int(num_partitions)
    if is_dataframe(data):  # under Connect: known once it runs
        return engine_for(data.sparkSession).num_partitions(data)
    if is_rdd(data):
        return int(data.getNumPartitions())
    return engine_for(trainer.spark).default_parallelism()


@contextlib.contextmanager
def resident_data(trainer: "DataParallelTrainer", data: Any, y: Any, validation_data: Any,
                  cols: tuple[str, str], classification: bool, key: str, reuse: bool,
                  num_partitions: int | None) -> Iterator[tuple[ShardedData, ShardedData | None]]:
    """The training (and validation) data on the executors for the ``with`` block, the
    training data in ``num_partitions`` shards (None: the source's); their resident
    shards are deleted after it (or kept for reuse, see ``fit``)."""

    engine = engine_for(trainer.spark)
    train = val = None
    vdata, vy = split_validation(validation_data) if validation_data is not None else (None, None)
    parts = _partitions(trainer, data, num_partitions) if trainer.model.built else None
    side: dict[str, Any] = {}

    def load_val(n: int | None) -> None:
        t0 = time.perf_counter()
        try:
            engine.describe("sparknet: loading validation data onto the executors")
            side["val"] = load(trainer, vdata, vy, cols, classification, n, "validation data",
                               f"val-{key}", reuse)
        except BaseException as exc:  # re-raised by the fit's thread
            side["error"] = exc
        side["seconds"] = time.perf_counter() - t0

    thread = None
    try:
        if validation_data is not None and parts is not None:
            thread = engine.thread(load_val, f"sparknet-val-{key}", args=(parts,))
            thread.start()
        engine.describe("sparknet: loading training data onto the executors")
        try:
            train = load(trainer, data, y, cols, classification, num_partitions, "training data",
                         f"train-{key}", reuse)
        finally:
            if thread is not None:
                t_wait = time.perf_counter()
                thread.join()
                val = side.get("val")
                if val is not None:  # what the fit waited for past the training data
                    val.phases = {"wait past the training data": time.perf_counter() - t_wait}
        if "error" in side:
            raise side["error"]
        if validation_data is not None and thread is None:
            load_val(train.num_partitions)
            if "error" in side:
                raise side["error"]
            val = side["val"]
        yield train, val
    finally:
        engine.describe(None)
        for d in (train, val):
            if d is not None:
                d.close()

"""The ``fit`` shared by sparknet's Estimators: the network and data prepared from the
Params and the DataFrame, then trained by :class:`~sparknet.cluster.DataParallelTrainer`."""
from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
from pyspark.ml.base import Predictor

from sparknet.layers import SequenceMask
from sparknet.ml import _columns
from sparknet.ml._params import _EstimatorParams
from sparknet.ml._persistence import Persistable
from sparknet.ml._scoring import _SparkNetModel
from sparknet.model import History, Sequential

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparknet.optim import Optimizer

_M = TypeVar("_M", bound=_SparkNetModel)


def _sequence_network(config: dict[str, Any], input_shape: tuple[int, int]) -> Sequential:
    """The network of ``config`` behind one :class:`~sparknet.layers.SequenceMask` (which
    turns the mask value ending each step into the recurrent layers' mask), built for
    ``(T, F + 1)`` rows.  A mask layer already in ``config`` is replaced."""
    net = Sequential.from_config(config)
    layers = [SequenceMask(name="sequence_mask"), *(ly for ly in net.layers if not isinstance(ly, SequenceMask))]
    return Sequential(layers, input_shape=input_shape, dtype=net.dtype, seed=net.seed,
                      loss=config.get("loss"), name=net.name)


class _SparkNetEstimator(Persistable, _EstimatorParams, Predictor[_M]):
    """The fit shared by the classifier and the regressor."""

    #: whether the network is trained as a classifier (cross-entropy on class ids)
    _classification: ClassVar[bool] = True

    @abstractmethod
    def _new_model(self) -> _M:
        """A new, empty Model of the kind ``fit`` returns."""

    def _fit(self, dataset: DataFrame) -> _M:
        network, history = self._train(dataset)
        model = self._new_model()
        model._set_network(network)
        model._history = history
        return self._copy_to_model(model)

    # the optimizer -------------------------------------------------------------
    def _make_optimizer(self) -> Optimizer:
        from sparknet import optim

        lr, mom, wd = self.getLearningRate(), self.getMomentum(), self.getWeightDecay()
        if self.getOptimizer() == "sgd":
            return optim.SGD(lr=lr, momentum=mom, weight_decay=wd)
        rho = self.getRho()
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        return optim.RMSprop(lr=lr, alpha=rho, weight_decay=wd, momentum=mom)

    # the network and the data ----------------------------------------------------
    def _prepare(self, dataset: DataFrame) -> tuple[Sequential, DataFrame]:
        """Returns ``(model, data)`` for the trainer: the network (built when the data
        tell its input shape) and the DataFrame it reads."""
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        config = dict(self._network_config(), seed=int(self.getSeed()) & 0x7FFFFFFF, input_shape=None)
        kind = _columns.feature_kind(dataset, fcol)
        shape = tuple(self.getInputShape())
        if kind.kind == "sequence":
            if len(shape) not in (0, 2):
                raise ValueError(f"sequence features need inputShape [T, F] or [], got {list(shape)}")
            stats = _columns.sequence_stats(dataset, fcol)
            longest, feat = _columns.check_sequences(stats, fcol, shape[1] if shape else None,
                                                     "training data")
            T = self.getMaxSequenceLength() or (shape[0] if shape else longest)
            model = _sequence_network(config, (T, feat + 1))
            data = dataset.select(_columns.flat_features(dataset, fcol, kind, model.dtype.name, (T, feat))
                                  .alias(fcol), dataset[lcol])
            return model, data
        model = Sequential.from_config(config)
        if shape:
            model.build(shape)
            _columns.vector_size_check(kind, fcol, int(np.prod(shape)), "training data")
        elif kind.size is not None:
            model.build((kind.size,))
        return model, dataset

    def _check_network(self, model: Sequential) -> None:
        from sparknet.cluster.data_parallel import _is_classifier

        if self._classification and not _is_classifier(model):
            raise ValueError("SparkNetClassifier needs a network whose last layer is "
                             "Dense(numClasses, activation='softmax') (cross-entropy loss)")

    def _train(self, dataset: DataFrame) -> tuple[Sequential, History]:
        from sparknet.cluster.data_parallel import DataParallelTrainer, resolve_mode

        model, data = self._prepare(dataset)
        self._check_network(model)
        trainer = DataParallelTrainer(
            model, dataset.sparkSession, num_partitions=self.getNumPartitions() or None,
            mode=resolve_mode(self.getMode()), sync=self.getSyncMethod(),
            local_steps=self.getLocalSteps() or "auto", optimizer=self._make_optimizer(),
            loss=None if self._classification else "mse", seed=int(self.getSeed()) & 0x7FFFFFFF)
        return trainer.fit(data, epochs=self.getEpochs(), batch_size=self.getBatchSize(),
                           features_col=self.getFeaturesCol(), label_col=self.getLabelCol(),
                           verbose=self.getVerbose())

    def _copy_to_model(self, model: _M) -> _M:
        """The Estimator's Params that the Model shares (columns, batch sizes, ...)."""
        for p in model.params:
            if self.hasParam(p.name) and self.isSet(self.getParam(p.name)):
                model._set(**{p.name: self.getOrDefault(self.getParam(p.name))})
        return model

"""The ``fit`` shared by sparknet's Estimators: the network and data prepared from the
Params and the DataFrame, then trained by :class:`~sparknet.cluster.DataParallelTrainer`."""
from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence, TypeVar

import numpy as np
from pyspark.ml.base import Predictor, _FitMultipleIterator

from sparknet._validation import refuse_pandas
from sparknet.cluster.data.fit_inputs import flat_rows_error
from sparknet.errors import CheckpointMismatch
from sparknet.layers import SequenceMask
from sparknet.ml import _columns, _jvm
from sparknet.ml._params import EstimatorParams
from sparknet.ml._persistence import Persistable
from sparknet.ml._scoring import SparkNetModel
from sparknet.model import History, Sequential

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparknet.optim import Optimizer

_M = TypeVar("_M", bound=SparkNetModel)


def _sequence_network(config: dict[str, Any], input_shape: tuple[int, int]) -> Sequential:
    """The network of ``config`` behind one :class:`~sparknet.layers.SequenceMask` (which
    turns the mask value ending each step into the recurrent layers' mask), built for
    ``(T, F + 1)`` rows.  A mask layer already in ``config`` is replaced."""
    net = Sequential.from_config(config)
    layers = [SequenceMask(name="sequence_mask"),
              *(ly for ly in net.layers if not isinstance(ly, SequenceMask))]
    return Sequential(layers, input_shape=input_shape, dtype=net.dtype, seed=net.seed,
                      loss=config.get("loss"), name=net.name)


class SparkNetEstimator(Persistable, EstimatorParams, Predictor[_M]):
    """The fit shared by the classifier and the regressor."""

    #: whether the network is trained as a classifier (cross-entropy on class ids)
    _classification: ClassVar[bool] = True

    @abstractmethod
    def _new_model(self) -> _M:
        """A new, empty Model of the kind ``fit`` returns."""

    def fitMultiple(self, dataset: DataFrame, paramMaps: Sequence[Any]) -> Iterator[tuple[int, _M]]:
        """Fit a Model for each of ``paramMaps`` (what ``CrossValidator`` and
        ``TrainValidationSplit`` call, the fits possibly in parallel), each fit with its
        own checkpoint folder under ``checkpointDir``: ``<checkpointDir>/<uid>_fit<n>_params<i>``,
        ``n`` counting this Estimator's calls (a ``CrossValidator``'s folds) and ``i`` the
        param map, so that parallel fits never overwrite each other's checkpoints."""
        self._tuning_runs = getattr(self, "_tuning_runs", 0) + 1
        run, estimator = self._tuning_runs, self.copy()

        def fit_one(index: int) -> _M:
            params = dict(paramMaps[index])
            folder = params.get(estimator.checkpointDir, estimator.getCheckpointDir())
            if folder is not None:
                params[estimator.checkpointDir] = (f"{str(folder).rstrip('/')}/"
                                                   f"{self.uid}_fit{run}_params{index}")
            return estimator.fit(dataset, params)

        return _FitMultipleIterator(fit_one, len(paramMaps))

    def _fit(self, dataset: DataFrame) -> _M:
        refuse_pandas(dataset, f"{type(self).__name__}.fit", spark_only=True)
        network, history = self._train(dataset)
        model = self._new_model()
        model._set_network(network)
        model._history = history
        return self._copy_to_model(model)

    # the optimizer -------------------------------------------------------------
    def _make_optimizer(self) -> Optimizer:
        from sparknet import optim

        lr, mom, wd = self.getLearningRate(), self.getMomentum(), self.getWeightDecay()
        cn, cv = self.getClipNorm() or None, self.getClipValue() or None  # 0: no clipping
        if self.getOptimizer() == "sgd":
            return optim.SGD(lr=lr, momentum=mom, weight_decay=wd, clipnorm=cn, clipvalue=cv)
        if self.getOptimizer() in ("adam", "adamw"):  # weightDecay as given (AdamW: decoupled)
            klass = optim.AdamW if self.getOptimizer() == "adamw" else optim.Adam
            return klass(lr=lr, weight_decay=wd, clipnorm=cn, clipvalue=cv)
        rho = self.getRho()
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"rho must be in [0, 1), got {rho}")
        return optim.RMSprop(lr=lr, alpha=rho, weight_decay=wd, momentum=mom, clipnorm=cn,
                             clipvalue=cv)

    # the network and the data ----------------------------------------------------
    def _prepare(self, dataset: DataFrame) -> tuple[Sequential, DataFrame]:
        """Returns ``(model, data)`` for the trainer: the network (built when the data
        tell its input shape) and the DataFrame it reads."""
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        config = dict(self._network_config(), seed=int(self.getSeed()) & 0x7FFFFFFF,
                      input_shape=None)
        kind = _columns.feature_kind(dataset, fcol)
        shape = tuple(self.getInputShape())
        if kind.kind == "sequence":
            from sparknet.cluster.engine.base import functions_for

            F, _ = functions_for(dataset)
            if len(shape) not in (0, 2):
                raise ValueError(f"sequence features need inputShape [T, F] or [], "
                                 f"got {list(shape)}")
            stats = _columns.sequence_stats(dataset, fcol)
            longest, feat = _columns.check_sequences(stats, fcol, shape[1] if shape else None,
                                                     "training data")
            T = self.getMaxSequenceLength() or (shape[0] if shape else longest)
            model = _sequence_network(config, (T, feat + 1))
            features = _columns.flat_features(dataset, fcol, kind, model.dtype.name, (T, feat))
            vcol = self.getValidationIndicatorCol()
            kept = [F.col(_columns.quote(c)) for c in (lcol, vcol) if c is not None]
            data = dataset.select(features.alias(fcol), *kept)
            return model, data
        model = Sequential.from_config(config)
        if shape:
            model.build(shape)
            _columns.vector_size_check(kind, fcol, int(np.prod(shape)), "training data")
        elif kind.size is not None:
            try:
                model.build((kind.size,))
            except ValueError as exc:
                where = f"the features column {fcol!r}"
                raise flat_rows_error(exc, model, kind.size, where) from None
        return model, dataset

    def _check_network(self, model: Sequential) -> None:
        if self._classification and not model.is_classifier:
            raise ValueError("SparkNetClassifier needs a network whose last layer is "
                             "Dense(numClasses, activation='softmax') (cross-entropy loss); "
                             "a PyTorch network that ends in logits comes in with its softmax: "
                             "from_torch(nn.Sequential(net, nn.Softmax(dim=1)), ...)")

    def _check_params(self) -> None:
        """The checks of Params that need several of them (or the network): before any job."""
        for p in (self.featuresCol, self.labelCol):
            if not self.getOrDefault(p):
                raise ValueError(f"{p.name} is empty: name the DataFrame's {p.name[:-3]} column")
        if self.getResume() and self.getCheckpointDir() is None:
            raise ValueError("resume=True continues from a checkpoint in checkpointDir: "
                             "set checkpointDir (the folder of the interrupted fit's checkpoints)")
        if self.hasParam("thresholds") and self.isDefined(self.getParam("thresholds")):
            k = _columns.declared_outputs(self._network_config())
            n = len(self.getOrDefault(self.getParam("thresholds")))
            if k is not None and n != k:
                raise ValueError(f"thresholds has {n} values, the network has {k} classes")

    def _checkpoint_options(self) -> tuple[dict[str, Any], bool]:
        """``(trainer keyword arguments, resume)`` from the checkpoint Params."""
        folder, every = self.getCheckpointDir(), self.getCheckpointInterval()
        if folder is None:
            return {}, False
        if every == -1:
            if self.getResume():
                raise ValueError("resume=True with checkpointInterval=-1: "
                                 "set checkpointInterval >= 1 "
                                 "(the resumed fit checkpoints to checkpointDir too)")
            return {}, False
        return {"checkpoint_dir": folder, "checkpoint_every": f"{every} epochs"}, self.getResume()

    def _split_validation(self, data: DataFrame) -> tuple[DataFrame, DataFrame | None]:
        """``(training rows, validation rows or None)`` by ``validationIndicatorCol``."""
        vcol = self.getValidationIndicatorCol()
        if vcol is None:
            return data, None
        from sparknet.cluster.engine.base import functions_for

        F, _ = functions_for(data)
        flag = F.col(_columns.quote(vcol))
        # a null flag trains, as false does (a plain filter on ~flag would drop it silently)
        return data.filter(~flag | flag.isNull()), data.filter(flag)

    def _train(self, dataset: DataFrame) -> tuple[Sequential, History]:
        from sparknet.cluster.data_parallel.trainer import DataParallelTrainer, resolve_mode

        self._check_params()
        if self.getValidationIndicatorCol() is not None:
            _columns.check_indicator(dataset, self.getValidationIndicatorCol())
        _jvm.quiet_task_errors(dataset.sparkSession)  # errors of tasks, raised as themselves
        optimizer = self._make_optimizer()
        checkpoints, resume = self._checkpoint_options()
        model, data = self._prepare(dataset)
        self._check_network(model)
        self._check_targets(dataset, model)
        trainer = DataParallelTrainer(
            model, dataset.sparkSession, num_partitions=self.getNumPartitions() or None,
            mode=resolve_mode(self.getMode()), sync=self.getSyncMethod(),
            local_steps=self.getLocalSteps() or "auto", optimizer=optimizer,
            loss=None if self._classification else "mse", seed=int(self.getSeed()) & 0x7FFFFFFF,
            precision=self.getPrecision(), **checkpoints)
        fit_options: dict[str, Any] = {"resume": True} if resume else {}
        data, val = self._split_validation(data)
        if val is not None:
            fit_options["validation_data"] = val
        try:
            return trainer.fit(data, epochs=self.getEpochs(), batch_size=self.getBatchSize(),
                               features_col=self.getFeaturesCol(), label_col=self.getLabelCol(),
                               verbose=self.getVerbose(), callbacks=self.getCallbacks(),
                               **fit_options)
        except CheckpointMismatch as exc:  # named with the Estimator's Param
            raise exc.for_option("checkpointDir") from None

    def _check_targets(self, dataset: DataFrame, model: Sequential) -> None:
        """A regressor's targets per row against the network's outputs (the trainer reshapes
        them to the outputs): from the schema, or one row for Vector/array labels."""
        if self._classification:
            return
        outputs = (int(np.prod(model.output_shape)) if model.output_shape is not None
                   else _columns.declared_outputs(model.get_config()))
        if outputs is None:
            return
        lcol = self.getLabelCol()
        width = _columns.label_width(dataset, lcol)
        if width is not None and width != outputs:
            per_row = "one value" if width == 1 else f"{width} values"
            raise ValueError(f"label column {lcol!r} holds {per_row} per row, "
                             f"the network has {outputs} outputs")

    def _copy_to_model(self, model: _M) -> _M:
        """The Estimator's Params that the Model shares (columns, batch sizes, ...)."""
        for p in model.params:
            if self.hasParam(p.name) and self.isSet(self.getParam(p.name)):
                model._set(**{p.name: self.getOrDefault(self.getParam(p.name))})
        return model

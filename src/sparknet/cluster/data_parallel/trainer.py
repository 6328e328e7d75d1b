"""Data-parallel training on Spark with synchronous parameter-server rounds.

The training data is split across Spark partitions and stays resident on the
executors for the whole fit (:mod:`sparknet.cluster.data.sharding`,
:mod:`sparknet.cluster.resident.driver`).  The driver is the parameter server
(:mod:`sparknet.cluster.data_parallel.parameter_server`): each *round* broadcasts the flat parameter
vector, every partition works on its shard, and one parameter-sized vector per partition comes
back and is summed.

Two synchronous flavours (``sync=``):

``"gradient"`` -- exact minibatch SGD.
    Every round is one step on one *global* minibatch of ``batch_size`` rows: each
    partition computes the gradient of the loss *sum* over its slice of that
    minibatch, the sums are added, divided by the global row count, and the driver's
    optimizer takes one step.  This is the same computation as single-process
    training on the same global minibatches (equal to float rounding).
``"average"`` -- local steps then average (SparkNet's tau).
    Every round, each partition starts from the broadcast parameters, runs ``tau``
    optimizer steps of ``batch_size`` rows on its own shard, and returns its weight
    delta; the driver applies the row-weighted mean delta to the parameters: added as
    it is (plain averaging), or through an outer Nesterov step on it
    (:mod:`sparknet.cluster.data_parallel.outer_optimizer`; the default ``outer="auto"`` when the
    trainer sizes the rounds itself, ``local_steps="auto"``).  Each
    partition keeps *its own* optimizer state (RMSprop's running squared-gradient
    average, momentum buffers, step count) resident next to its shard across rounds
    and epochs, so the state follows that partition's gradient statistics and is
    never reset or shipped within the fit (a later fit on reused shards starts its
    own).  ``tau`` defaults to the smallest number of steps that
    keeps Spark's fixed cost at most ``max_overhead`` (10 %) of a round
    (:class:`~sparknet.cluster.planning.rounds.RoundCostModel`), computed once from the
    network's flops and parameter bytes on a nominal machine, so that a seed reproduces a
    fit (``local_steps="timed"`` measures them instead: a local step timed on the driver
    for the first epoch, then the rounds run, which re-size the next epochs).  When one
    epoch of local steps is too short to pay for a round, a round spans several whole
    epochs (at most ``max_epochs_per_round``); validation then runs at the end of each
    round, and the epochs inside it get ``NaN`` validation metrics (as with Keras's
    ``validation_freq``).

The minibatch schedule (documented because it is the contract the exactness test
checks): in epoch ``e`` (0-based), partition ``p`` with ``n_p`` rows permutes them with
``numpy.random.default_rng([seed, e, p]).permutation(n_p)`` and cuts the permutation
into ``R`` consecutive chunks, chunk ``r`` being rows ``[n_p*r//R, n_p*(r+1)//R)``.
Round ``r`` of the epoch uses chunk ``r`` of every partition.  A round spanning ``m``
epochs runs the whole permutations of epochs ``e .. e+m-1`` in turn.  With
``sync="gradient"``, ``R = ceil(N / batch_size)`` (``N`` rows in all), so round ``r``'s
global minibatch is the union of the chunks.  With ``sync="average"``, each chunk is
processed in local minibatches of ``batch_size`` rows, in order.

Example::

    from sparknet.cluster import DataParallelTrainer
    trainer = DataParallelTrainer(model, spark, num_partitions=2)
    model, history = trainer.fit(df, epochs=10, batch_size=64, validation_data=val_df)
    history["val_accuracy"][-1], history["spark_overhead"]

The executor side of a round is :mod:`sparknet.cluster.data_parallel.round_task`; the driver side of
one fit (round sizing, the synchronous rounds, evaluation) is
:mod:`sparknet.cluster.data_parallel.fit_context`.
"""
from __future__ import annotations

import difflib
import inspect
import logging
import math
import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from sparknet import losses as losses_mod
from sparknet import optim as optim_mod
from sparknet._validation import positive_int, refuse_pandas
from sparknet.callbacks import CallbackList, FitControl
from sparknet.cluster.data import fit_inputs as fit_data
from sparknet.cluster.data.shard_cache import release_shards
from sparknet.cluster.data_parallel import async_mode, checkpoints
from sparknet.cluster.data_parallel.async_options import AsyncOptions, check_options
from sparknet.cluster.data_parallel.epoch_logs import record_epochs
from sparknet.cluster.data_parallel.fit_context import (
    FitContext,
    FitHistory,
    RoundLog,
    evaluate_once,
)
from sparknet.cluster.data_parallel.outer_optimizer import OuterOptimizer, resolve_outer
from sparknet.cluster.data_parallel.parameter_server import ParameterServer
from sparknet.cluster.data_parallel.round_task import FitSpec
from sparknet.cluster.data_parallel.wire import check_wire
from sparknet.cluster.engine import layer_classes
from sparknet.cluster.engine.base import engine_for
from sparknet.cluster.planning.cost import RoundCostModel
from sparknet.cluster.planning.rounds import SIZED
from sparknet.errors import TrainingDiverged
from sparknet.losses import Loss
from sparknet.model import Sequential
from sparknet.optim import Optimizer
from sparknet.precision import check_model_precision
from sparknet.progress import FitProgress, check_verbose, status

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_SYNC = ("gradient", "average")

# ------------------------------------------------------------------------ training modes
#: The training modes: synchronous rounds (this module, with :class:`FitContext`) and
#: asynchronous ones (:mod:`sparknet.cluster.data_parallel.async_mode`).
MODES = ("sync", "async")


def resolve_mode(mode: str) -> str:
    """``mode`` checked against the training modes (:data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode


class DataParallelTrainer:
    """Train a :class:`~sparknet.model.Sequential` on Spark by data parallelism.

    Any model whose layers are registered (every layer of :mod:`sparknet.layers`)
    works: it travels to the executors as its JSON config plus the flat parameter
    vector.

    Args:
        model: the model to train (updated in place; built from the data's feature
            length when not built yet).
        spark: a ``SparkSession`` (default: the active one, or a new ``local[*]`` one via
            :func:`sparknet.cluster.engine.session.get_spark`).
        num_partitions: shards of the training data; default: the DataFrame's/RDD's
            partitions, or ``defaultParallelism`` for numpy input; ``"auto"``: the
            planner's choice for this network, data and session at each ``fit``
            (:func:`sparknet.cluster.planning.planner.auto_partitions`: the session's costs
            measured once, a few seconds).
        mode: ``"sync"`` (synchronous rounds) or ``"async"`` (asynchronous Downpour
            rounds, see :mod:`sparknet.cluster.data_parallel.async_mode`).
        sync: ``"average"`` (default: tau local steps then average the deltas) or
            ``"gradient"`` (exact minibatch SGD, one global step per round).
        local_steps: tau for ``sync="average"``: an int; ``"auto"`` (default) for the
            fewest steps keeping Spark's fixed cost at most ``max_overhead`` of a round,
            cut to a quarter of an epoch's while that keeps it at most 4 times that, else
            to half or a whole epoch's within twice (shorter rounds learn more per epoch;
            :mod:`sparknet.cluster.planning.rounds`), the costs being a nominal machine's
            (the network's flops, its parameter bytes): no clock is read, so the same seed,
            data and settings train the same weights in every run; or ``"timed"``, the
            same rule on costs measured in this process (a step timed on the driver, then
            the median fixed cost of the fit's last rounds, re-sized between epochs):
            rounds fitted to this cluster, but not reproducible from run to run.  More
            steps than an epoch holds make rounds of several whole epochs
            (``local_steps // steps per epoch``, at most ``max_epochs_per_round``).
        optimizer: an :class:`~sparknet.optim.Optimizer` or its name (default RMSprop).
            ``"gradient"``: the driver's optimizer.  ``"average"``: the configuration
            of each partition's local optimizer (its state stays on the partition).
        loss: ``"cross_entropy"``, ``"mse"`` or a Loss; default the model's loss.
        max_overhead: target share of Spark's fixed cost in a round (default 0.1).
        max_epochs_per_round: the longest round ``sync="average"`` may make, in epochs
            (default 4): longer rounds pay Spark's fixed cost less often, but average
            the partitions' models less often too.
        reduce: how round results come back: ``"tree"`` (``treeAggregate``, default) or
            ``"accumulator"`` (numpy ``AccumulatorParam``).
        seed: seeds the data split and the per-epoch shuffles; default the model's seed.
        outer: the outer optimizer of ``sync="average"``, a step with momentum on
            each round's averaged delta (:mod:`sparknet.cluster.data_parallel.outer_optimizer`): an
            :class:`~sparknet.cluster.data_parallel.outer_optimizer.OuterOptimizer`, ``"nesterov"``
            (``OuterOptimizer()``: sized from the partitions, so that a steady
            direction moves as far as one process's steps would), ``None``/``"none"``
            (plain averaging: the mean delta added as it is) or ``"auto"`` (default:
            ``"nesterov"`` when ``local_steps="auto"`` in synchronous average mode;
            plain averaging with a given ``local_steps``, which runs the schedule
            documented in this module exactly).  Its momentum is kept in the object across fits,
            like the driver's optimizer of ``sync="gradient"``.
        checkpoint_dir: folder (local, shared, or a Hadoop URI such as ``hdfs://...``)
            where every fit writes checkpoints (:mod:`sparknet.cluster.data_parallel.checkpoints`:
            parameters, every optimizer state -- the partitions' too --, the position in
            the data order, the history, the architecture and these settings), which
            ``fit(..., resume=True)`` continues from; ``None`` (default): none.
        checkpoint_every: when a checkpoint is written: ``"epoch"`` (default: after every
            epoch, its validation included), an int N (every N rounds), ``"N epochs"``, or
            ``"Ns"`` (at the first round end N seconds after the last one).  ``mode="async"``
            writes them at epoch ends only (no round is in flight there).
        checkpoint_keep: how many of the newest checkpoints are kept (default 3).
        round_timeout: seconds one round (one Spark job) may run before the fit fails with
            :class:`~sparknet.errors.RoundTimeout`, its jobs cancelled: a number, ``None``
            (wait forever) or ``"auto"`` (default: ``max(120 s, 20 x`` the slowest round of
            its kind measured so far, or predicted by the round cost model``)``).
        precision: ``"fp32"`` (default) or ``"bf16"``: the executors' training steps run the
            layers' matrix products on bfloat16 operands with float32 accumulation, as
            ``Sequential.fit(precision="bf16")`` does (:mod:`sparknet.precision`); the parameters,
            optimizer states, losses, round sums and evaluation stay float32.  Needs a float32
            model.  Executors without a bfloat16 kernel train in float32, and the fit warns once
            (:class:`~sparknet.precision.PrecisionFallbackWarning`).
        wire: ``"fp32"`` (default) or ``"bf16"``: how ``sync="average"`` and ``mode="async"``
            tasks send their deltas back: ``"bf16"`` halves the bytes, rounding to nearest even
            with error feedback (:mod:`sparknet.cluster.data_parallel.wire`).
        **mode_options: the options of ``mode="async"``:
            ``max_staleness``, ``stale``, ``on_update``, ``delta_weight``, ``coalesce``;
            see :class:`sparknet.cluster.data_parallel.async_options.AsyncOptions`.

    Raises:
        ValueError: unknown ``mode``/``sync``/``reduce``/``precision``/``wire``, bad
            ``local_steps``, ``max_overhead``, ``outer`` (an outer optimizer outside synchronous
            average mode), ``checkpoint_every``, ``checkpoint_keep`` or ``round_timeout``.
    """

    checkpoint_dir: str | None
    checkpoint_every: checkpoints.CheckpointEvery
    checkpoint_keep: int
    round_timeout: float | str | None

    def __init__(self, model: Sequential, spark: "SparkSession | None" = None,
                 num_partitions: int | str | None = None, mode: str = "sync", sync: str = "average",
                 local_steps: "int | str" = "auto", optimizer: "Optimizer | str | None" = None,
                 loss: "Loss | str | None" = None, max_overhead: float = 0.1,
                 reduce: str = "tree", seed: int | None = None, max_epochs_per_round: int = 4,
                 outer: "OuterOptimizer | str | None" = "auto", checkpoint_dir: "str | None" = None,
                 checkpoint_every: "str | int" = "epoch", checkpoint_keep: int = 3,
                 round_timeout: "float | str | None" = "auto", precision: str = "fp32",
                 wire: str = "fp32", **mode_options: Any) -> None:
        if not isinstance(model, Sequential):
            raise TypeError(f"model must be a sparknet Sequential, got {type(model).__name__}")
        mode = resolve_mode(mode)
        if sync not in _SYNC:
            raise ValueError(f"sync must be 'gradient' or 'average', got {sync!r}")
        if local_steps not in SIZED:
            positive_int(local_steps, "local_steps", extra="or 'auto' or 'timed'")
        if not 0.0 < float(max_overhead) < 1.0:
            raise ValueError(f"max_overhead must be in (0, 1), got {max_overhead!r}")
        if reduce not in ("tree", "accumulator"):
            raise ValueError(f"reduce must be 'tree' or 'accumulator', got {reduce!r}")
        self.precision = check_model_precision(model, precision)
        self.wire = check_wire(wire, mode, sync)
        self.max_epochs_per_round = positive_int(max_epochs_per_round, "max_epochs_per_round")
        self.num_partitions = num_partitions if num_partitions in (None, "auto") else \
            positive_int(num_partitions, "num_partitions", extra="or 'auto'")
        self.model = model
        self._spark = spark
        self.mode, self.sync, self.local_steps = mode, sync, local_steps
        self.optimizer = optim_mod.get(optimizer)
        if loss is not None:
            model._loss = losses_mod.get(loss)
        self.max_overhead = float(max_overhead)
        self.reduce = reduce
        self.seed = model.seed if seed is None else int(seed)
        self.cost: RoundCostModel | None = None
        self.outer = resolve_outer(outer, mode=mode, sync=sync, local_steps=local_steps)
        checkpoints.configure(self, checkpoint_dir, checkpoint_every, checkpoint_keep,
                              round_timeout)
        self.mode_options: AsyncOptions | None = None
        _check_option_names(mode, mode_options)
        if mode == "async":
            self.mode_options = check_options(self, **mode_options)

    @property
    def spark(self) -> "SparkSession":
        """The session the trainer runs on (the active one, or a new one, on first use)."""
        if self._spark is None:
            from sparknet.cluster.engine.session import get_spark
            self._spark = get_spark()
        return self._spark

    # ----------------------------------------------------------------- fit
    def fit(self, data: Any, y: Any = None, epochs: int = 10, batch_size: int = 32,
            validation_data: Any = None, features_col: str = "features", label_col: str = "label",
            verbose: int = 1, reuse_data: bool = True, resume: bool = False,
            callbacks: Sequence[Any] = ()) -> tuple[Sequential, FitHistory]:
        """Train for ``epochs`` passes over ``data``.

        Args:
            data: a Spark DataFrame (``features_col``: ML Vector or array column;
                ``label_col``: class ids, or targets for MSE), an RDD of ``(x, y)``
                pairs, or a numpy array of inputs (then pass ``y``).
            y: labels/targets for numpy ``data``.
            epochs: passes over the training data.
            batch_size: ``sync="gradient"``: rows of each global minibatch (split over
                the partitions); ``sync="average"``: rows of each local minibatch.
            validation_data: held-out data evaluated after every epoch on the
                executors: a DataFrame (same columns), an RDD of pairs or ``(X, y)``.
            features_col: features column of DataFrames.
            label_col: label column of DataFrames.
            verbose: 1 (default) a line while Spark starts and the data loads, then one
                live progress bar over the epochs (the round within the epoch, running
                train figures, validation and Spark's share) with a line kept per epoch;
                2 the lines alone; 0 nothing (:class:`~sparknet.progress.FitProgress`).
            reuse_data: keep the shards of a cached DataFrame (``df.cache()``) or a
                persisted RDD on the executors after the fit, and reuse them in the next
                fit (or :meth:`evaluate`) on the same data, columns and partitions: no
                job then (``history.reused_shards``).  Other data, or data whose cache
                was dropped (``unpersist()``), is loaded anew.  They take the data's
                size (float32/float64) in the executors' ``/dev/shm`` or local
                directory until :meth:`release_shards` (or the end of the driver);
                ``False`` deletes them after the fit.
            resume: continue from the newest complete checkpoint in ``checkpoint_dir``
                (a fresh fit, logged, when there is none): parameters, optimizer states,
                history and the position in the data order come back, and the fit runs
                until ``epochs`` epochs in all (``epochs`` is the total, not a count of
                further ones).  Needs the same data, partitions, mode, sync, batch size
                and seed as the fit that wrote it.
            callbacks: :class:`sparknet.callbacks.Callback` objects or callables
                ``f(epoch, logs)`` (:mod:`sparknet.callbacks`), run on the driver:
                ``on_round_end`` after every round; a per-step ``LearningRateScheduler``
                sets the driver's step (``sync="gradient"``) or travels with the tasks
                to set each local step's rate (see :mod:`sparknet.schedules`); a rate
                set by a callback reaches the local steps of the next rounds.

        Returns:
            ``(model, history)``: the trained model (the object passed in, updated in
            place) and a :class:`~sparknet.cluster.data_parallel.fit_context.FitHistory` (a
            :class:`~sparknet.model.History`) with, per epoch, ``loss``,
            ``accuracy`` (classifiers), ``val_loss``, ``val_accuracy``, ``lr`` (the rate
            of the epoch's first step), ``val_time``
            (seconds of the validation job), ``time`` (the epoch's seconds, validation
            included), ``rounds`` (rounds of the epoch; ``1/m`` for a round of ``m``
            epochs), ``local_steps`` (per partition per round) and ``spark_overhead``
            (the measured share of the round time not spent computing in the slowest
            task).  Validation runs when a round ends: epochs that end inside a round
            of several epochs have ``NaN`` ``val_*`` values, and the round's training
            time is shared equally by its epochs (the last one adding the validation's).
            ``history.setup_time`` holds the seconds spent before the first epoch
            (loading the data onto the executors, checks, calibration), and
            ``history.setup_breakdown`` what they went to (see
            :class:`~sparknet.cluster.data_parallel.fit_context.FitHistory`).

        Raises:
            ValueError: bad arguments or bad data (missing column, ragged vectors, NaN,
                labels out of range, empty data), always before the first round; a
                checkpoint of another network or schedule (``resume``).
            TrainingDiverged: a loss, gradient, delta or the parameters became NaN or
                infinite (epoch, round and partition named); the model keeps its last
                finite weights and no checkpoint of the diverged state is written.
            RoundTimeout: a round ran past ``round_timeout``; its jobs were cancelled.

        ``KeyboardInterrupt`` (Ctrl-C) cancels the fit's jobs and returns the model as of
        the last applied round (``history.interrupted``).
        """
        epochs = positive_int(epochs, "epochs")
        batch_size = positive_int(batch_size, "batch_size")
        verbose = check_verbose(verbose)
        refuse_pandas(data, "DataParallelTrainer.fit")  # before Spark starts
        cbl = CallbackList(callbacks, self.model, self, FitControl(self.model, self.optimizer))
        store = checkpoints.open_store(self, resume)
        model = self.model
        classification = model.is_classifier
        t_fit = time.perf_counter()
        # numpy input: build the model from its shape before splitting (labels checked on the
        # driver)
        if not model.built and isinstance(data, np.ndarray) and data.ndim >= 2:
            model.build(data.shape[1:])
        key = uuid.uuid4().hex[:12]
        history = FitHistory()
        if verbose and self._spark is None:
            status("sparknet: starting Spark (or joining the running session) ...", verbose)
        engine = engine_for(self.spark)
        parts = self._partitions_for(data, batch_size)
        status("sparknet: loading the data onto the executors and sizing the rounds ...", verbose)
        with fit_data.resident_data(self, data, y, validation_data, (features_col, label_col),
                                    classification, key, reuse_data, parts) as (train, val):
            ps = ParameterServer(engine, model.params, reduce=self.reduce, state=model.state)
            tag = f"sparknet-fit-{key}"
            engine.add_tag(tag)
            ctx: FitContext | None = None
            try:
                ctx = FitContext(self, self._spec(key, batch_size, classification), train, val, ps,
                                 epochs, batch_size, history=history,
                                 state=checkpoints.FitState(self, store, self.checkpoint_every),
                                 callbacks=cbl)
                ctx.schedule = cbl.step_schedule(math.ceil(train.total / batch_size))
                if resume and checkpoints.resume(ctx.state, ctx):
                    history.setup_time = time.perf_counter() - t_fit
                else:
                    checkpoints.fresh(ctx.state)
                    self._calibrate(ctx, t_fit)
                cbl.on_fit_begin()
                self._train(ctx, verbose, tag)
            finally:
                if ctx is not None and ctx.cost is not None:
                    self.cost = ctx.cost  # the rounds' cost as last measured (or calibrated)
                engine.remove_tag(tag)
                ps.close()
                history.bytes_out, history.bytes_in = ps.bytes_out, ps.bytes_in
                history.precision = "fp32" if ps.fell_back else self.precision
        model.optimizer = self.optimizer
        cbl.on_fit_end({k: v[-1] for k, v in history.history.items() if v})
        return model, history

    def _partitions_for(self, data: Any, batch_size: int) -> int | None:
        """This fit's partitions: the given count, or the planner's for ``"auto"``."""
        if self.num_partitions != "auto":
            return None if self.num_partitions is None else int(self.num_partitions)
        if engine_for(self.spark).sc is None:  # a Connect client: no SparkContext to probe
            raise NotImplementedError("num_partitions='auto' probes the executors through a "
                                      "SparkContext; under Spark Connect pass a number of "
                                      "partitions (or None: the data's own)")
        from sparknet.cluster.planning.planner import auto_partitions

        parts = auto_partitions(self.model, data, self.spark, batch_size=batch_size, mode=self.mode,
                                sync=self.sync, local_steps=self.local_steps)
        log.info("sparknet: num_partitions='auto' chose %d partitions", parts)
        return parts

    def _spec(self, key: str, batch_size: int, classification: bool) -> FitSpec:
        """What every task of the fit (or evaluation) ``key`` needs; the model is built."""
        model = self.model
        config = model.get_config()
        return FitSpec(key=key, config=config, loss=model.loss.name,
                       optimizer=(self.optimizer.name, self.optimizer.get_config()),
                       batch_size=batch_size, seed=self.seed, input_shape=_shape(model.input_shape),
                       classification=classification,
                       int_input=bool(getattr(model.layers[0], "accepts_int_input", False)),
                       y_shape=() if classification else _shape(model.output_shape),
                       precision=self.precision, wire=self.wire,
                       layer_classes=layer_classes.ship(config))

    def _calibrate(self, ctx: FitContext, t_fit: float) -> None:
        """Size the rounds (from an estimate when ``local_steps="auto"``); the fit's
        set-up ends here: ``history.setup_time`` and its ``setup_breakdown``."""
        t_cal = time.perf_counter()
        ctx.calibrate()
        now = time.perf_counter()
        h, train = ctx.history, ctx.train
        h.setup_time, h.reused_shards = now - t_fit, train.reused
        h.setup_breakdown = dict(train.phases)
        if ctx.val is not None:
            h.setup_breakdown["validation data"] = sum(ctx.val.phases.values())
        h.setup_breakdown["calibration"] = now - t_cal
        h.setup_breakdown["other"] = max(h.setup_time - sum(h.setup_breakdown.values()), 0.0)
        share = "" if ctx.cost is None else \
            f", predicted Spark share {100 * ctx.cost.overhead(ctx.steps_per_round):.1f}%"
        sizing = "" if self.sync == "gradient" else f", local_steps={self.local_steps!r}"
        log.info("sparknet: %s rows in %d partitions (%s), %s: %s%s%s", train.total,
                 train.num_partitions, train.source, self.sync, ctx.describe_round(span=ctx.epochs),
                 sizing, share)
        if train.num_partitions > train.total:
            log.warning("sparknet: %d partitions for %d training rows: %d or more of them hold "
                        "no row, and every round still runs a task for each; fewer partitions "
                        "train faster (num_partitions='auto' chooses)", train.num_partitions,
                        train.total, train.num_partitions - train.total)

    def _train(self, ctx: FitContext, verbose: int, tag: str) -> None:
        """The epochs of the fit; ``KeyboardInterrupt`` cancels the fit's jobs (tagged
        ``tag``) and returns with the model as of the last applied round."""
        try:
            with FitProgress(ctx.epochs, verbose) as ctx.progress:
                ctx.progress.skip(ctx.state.start.epoch)
                self._epochs(ctx, verbose)
        except KeyboardInterrupt:
            ctx.engine.cancel(tag)
            ctx.history.interrupted = True
            log.warning("sparknet: interrupted after %d epoch(s); cancelled the fit's jobs; the "
                        "model is as of the last applied round", len(ctx.history.epoch))

    def _epochs(self, ctx: FitContext, verbose: int) -> None:
        """The epochs of the fit (from a resumed position on), each validated, recorded in
        ``ctx.history`` and checkpointed when one is due."""
        state = ctx.state
        epochs, epoch = ctx.epochs, state.start.epoch
        start = state.start.round if self.mode == "sync" else 0
        while epoch < epochs:
            t0 = time.perf_counter()
            carry = checkpoints.epoch_carry(state.start, RoundLog) if start else None
            t0 -= float(state.start.partial.get("elapsed", 0.0)) if start else 0.0
            span = min(ctx.epochs_per_round, epochs - epoch) if self.mode == "sync" else 1
            lrs = self._epochs_begin(ctx, epoch, span)
            rl = self._run_epochs(ctx, epoch, span, verbose, start, carry, t0)
            start = 0
            stop = rl.stop
            ctx.history.interrupted = ctx.history.interrupted or stop
            train_time = time.perf_counter() - t0
            val_logs: dict[str, float] = {}
            if ctx.val is not None and not stop:
                tv = time.perf_counter()
                val_logs = ctx.evaluate(ctx.val,
                                        f"sparknet epoch {epoch + span}/{epochs} validation")
                val_logs["val_time"] = time.perf_counter() - tv
            loss, logs = record_epochs(ctx, epoch, span, rl, train_time, val_logs, lrs)
            for i, entry in enumerate(logs):
                ctx.callbacks.on_epoch_end(epoch + i, entry)
            epoch += span
            if stop:
                break
            if not np.isfinite(loss):
                raise TrainingDiverged.describe("loss", loss, lr=self.optimizer.lr, epoch=epoch)
            state.epochs_end(ctx, epoch, rounds=0 if self.mode == "sync" else rl.rounds)
            if ctx.callbacks.stop_training:
                log.info("sparknet: a callback stopped the fit after epoch %d", epoch)
                break

    @staticmethod
    def _epochs_begin(ctx: FitContext, epoch: int, span: int) -> list[float]:
        """``on_epoch_begin`` of the epochs of the next round(s) (a round of several epochs runs at
        the rate set when they all began); the rate of each one's first step."""
        for i in range(span):
            ctx.callbacks.on_epoch_begin(epoch + i)
        return [ctx.epoch_lr(epoch + i) for i in range(span)]

    def _run_epochs(self, ctx: FitContext, epoch: int, span: int, verbose: int, start: int = 0,
                    carry: RoundLog | None = None, t0: float | None = None) -> RoundLog:
        """The rounds of epoch ``epoch`` (``span`` epochs for a multi-epoch round; from round
        ``start`` on, ``carry`` holding the rounds before it), under a progress bar:
        synchronous rounds, or an asynchronous epoch."""
        epochs = ctx.epochs
        desc = (f"epoch {epoch + 1}/{epochs}" if span == 1
                else f"epochs {epoch + 1}-{epoch + span}/{epochs}")
        if ctx.val is not None and self.mode == "sync":  # said above the bar, before it starts
            ctx.progress.validation_every(min(ctx.epochs_per_round, epochs))
        bar = ctx.progress.rounds(ctx.rounds, desc)
        if self.mode == "sync":
            rl = ctx.sync_epoch(epoch, bar, span, start, carry, t0)
            ctx.resize(rl, span)
            return rl
        ctx.bar = bar
        try:
            return async_mode.async_epoch(self, ctx, epoch)
        finally:
            ctx.bar = None

    @staticmethod
    def release_shards() -> int:
        """Delete the training and validation shards kept on the executors for reuse (see
        ``fit``'s ``reuse_data``); returns how many sets were deleted."""
        return release_shards()

    def evaluate(self, data: Any, y: Any = None, features_col: str = "features",
                 label_col: str = "label") -> dict[str, float]:
        """Mean loss (and accuracy) of the model on ``data`` (any input :meth:`fit` takes),
        computed on the executors."""
        model = self.model
        if not model.built:
            raise RuntimeError("the model is not built: fit it first")
        classification = model.loss.is_classification
        key = uuid.uuid4().hex[:12]
        parts = None if self.num_partitions in (None, "auto") else int(self.num_partitions)
        d = fit_data.load(self, data, y, (features_col, label_col), classification, parts,
                          "evaluation data", f"eval-{key}")
        ps = ParameterServer(engine_for(self.spark), model.params, self.reduce, state=model.state)
        try:
            out = evaluate_once(self._spec(key, 1, classification), ps, d, "sparknet evaluate")
            return {k[4:]: v for k, v in out.items()}
        finally:
            ps.close()
            d.close()


def _shape(shape: "tuple[int, ...] | None") -> tuple[int, ...]:
    if shape is None:
        raise RuntimeError("the model is not built")
    return tuple(shape)


#: the keyword arguments ``mode="async"`` takes (``**mode_options``)
_ASYNC_OPTIONS = tuple(p for p in inspect.signature(check_options).parameters if p != "trainer")


def _check_option_names(mode: str, options: dict[str, Any]) -> None:
    """Refuse keyword arguments that are no option of the trainer: an argument of ``fit``
    given to the constructor, a misspelling (naming the closest names), or an option of
    ``mode="async"`` given with another mode."""
    unknown = sorted(set(options) - set(_ASYNC_OPTIONS))
    if unknown:
        fit_args = [p for p in inspect.signature(DataParallelTrainer.fit).parameters
                    if p != "self"]
        known = [p for p in inspect.signature(DataParallelTrainer.__init__).parameters
                 if p not in ("self", "mode_options")] + list(_ASYNC_OPTIONS)
        hints = []
        for name in unknown:
            if name in fit_args:
                hints.append(f"{name} is an argument of fit(): trainer.fit(..., {name}=...)")
            else:
                close = difflib.get_close_matches(name, known, n=2)
                if close:
                    hints.append(f"did you mean {' or '.join(close)} for {name}?")
        raise TypeError(f"DataParallelTrainer got unexpected keyword argument(s) "
                        f"{', '.join(unknown)}" + (f"; {'; '.join(hints)}" if hints else ""))
    if options and mode != "async":
        raise TypeError(f"{', '.join(sorted(options))}: option(s) of mode='async', and "
                        f"mode={mode!r}")

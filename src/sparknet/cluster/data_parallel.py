"""Data-parallel training on Spark with synchronous parameter-server rounds.

The training data is split across Spark partitions and stays resident on the
executors for the whole fit (:mod:`sparknet.cluster.data`,
:mod:`sparknet.cluster.resident`).  The driver is the parameter server
(:mod:`sparknet.cluster.params`): each *round* broadcasts the flat parameter vector,
every partition works on its shard, and one parameter-sized vector per partition comes
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
    delta; the driver adds the row-weighted mean delta to the parameters.  Each
    partition keeps *its own* optimizer state (RMSprop's running squared-gradient
    average, momentum buffers, step count) resident next to its shard across rounds
    and epochs, so the state follows that partition's gradient statistics and is
    never reset or shipped.  ``tau`` defaults to the smallest number of steps that
    keeps Spark's fixed cost at most ``max_overhead`` (10 %) of a round, measured by a
    probe at the start of the fit (:class:`~sparknet.cluster.cost.RoundCostModel`) and
    re-measured from every round (the next rounds are re-sized from them).  When one
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
"""
from __future__ import annotations

import importlib
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sparknet import losses as losses_mod
from sparknet import threads
from sparknet import optim as optim_mod
from sparknet.cluster.cost import RoundCostModel
from sparknet.cluster.data import ShardedData, check_label_range, label_desc, shard_data
from sparknet.cluster.params import STATS, ParameterServer, RoundResult
from sparknet.model import History, Sequential

log = logging.getLogger(__name__)

_SYNC = ("gradient", "average")

# ------------------------------------------------------------------------- executor side
#: fit key -> the worker's copy of the model (rebuilt from its config once per fit).
_MODELS: dict[str, Sequential] = {}


@dataclass
class _FitSpec:
    """What every task of a fit needs (small; travels with each task)."""

    key: str
    config: dict
    loss: str
    optimizer: tuple[str, dict]
    batch_size: int
    seed: int
    input_shape: tuple[int, ...]
    classification: bool
    int_input: bool
    y_shape: tuple[int, ...] = ()


def _worker_model(spec: _FitSpec) -> Sequential:
    model = _MODELS.get(spec.key)
    if model is None:
        _MODELS.clear()  # one fit at a time per worker: free the previous fit's model
        model = Sequential.from_config(spec.config)
        if not model.built:
            model.build(spec.input_shape)
        _MODELS[spec.key] = model
    return model


def _round_rows(n: int, seed: int, epoch: int, index: int, rnd: int, rounds: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch, index]).permutation(n)
    return perm[n * rnd // rounds: n * (rnd + 1) // rounds]


class _RoundTask:
    """One partition's part of a round.  ``kind`` is ``"gradient"``, ``"average"``,
    ``"eval"`` or ``"probe"`` (timed local steps, nothing kept)."""

    def __init__(self, spec: _FitSpec, bc, kind: str, epoch: int = 0, rnd: int = 0,
                 rounds: int = 1, probe_steps: int = 0, span: int = 1) -> None:
        self.spec, self.bc, self.kind = spec, bc, kind
        self.epoch, self.rnd, self.rounds, self.probe_steps = epoch, rnd, rounds, probe_steps
        self.span = max(1, int(span))  # epochs in this round ("average" only; then rounds == 1)

    def _batch(self, x, y, rows):
        spec = self.spec
        xb = x[rows].reshape((len(rows),) + spec.input_shape)
        if spec.int_input:
            xb = xb.astype(np.int64)
        yb = y[rows]
        if spec.y_shape:
            yb = yb.reshape((len(rows),) + spec.y_shape)
        return xb, yb

    def __call__(self, index: int, shard):
        from pyspark import TaskContext

        tc = TaskContext.get()
        threads.set_worker_threads(tc.cpus() if tc is not None else 1)
        spec = self.spec
        x, y = shard["x"], shard["y"]
        n = int(y.shape[0])
        stats = np.zeros(len(STATS))
        if n == 0:
            return [RoundResult(None, stats, [0.0])]
        t0 = time.perf_counter()
        model = _worker_model(spec)
        model.set_params(self.bc.value)
        loss = losses_mod.get(spec.loss)
        for i, layer in enumerate(model.layers):  # dropout & co: seeded per task
            layer.rng = np.random.default_rng([spec.seed, self.epoch, self.rnd, index, i, 7])
        vec = None
        if self.kind == "eval":
            for lo in range(0, n, 1024):
                rows = np.arange(lo, min(n, lo + 1024))
                xb, yb = self._batch(x, y, rows)
                s, w, c = model.loss_and_grad(xb, yb, loss, need_grad=False, training=False)
                stats += (s, w, 0.0 if math.isnan(c) else c, len(rows), 0)
        elif self.kind == "gradient":
            rows = _round_rows(n, spec.seed, self.epoch, index, self.rnd, self.rounds)
            if len(rows) == 0:
                return [RoundResult(None, stats, [time.perf_counter() - t0])]
            xb, yb = self._batch(x, y, rows)
            s, w, c = model.loss_and_grad(xb, yb, loss, scale=1.0)
            vec = np.array(model.grads, copy=True)
            stats += (s, w, 0.0 if math.isnan(c) else c, len(rows), 1)
        else:
            probe = self.kind == "probe"
            if probe:
                rng = np.random.default_rng([spec.seed, 99, index])
                segments = [rng.integers(0, n, size=spec.batch_size * self.probe_steps)]
            elif self.span > 1:  # whole epochs, one after the other
                segments = [_round_rows(n, spec.seed, self.epoch + i, index, 0, 1)
                            for i in range(self.span)]
            else:
                segments = [_round_rows(n, spec.seed, self.epoch, index, self.rnd, self.rounds)]
            n_rows = sum(len(r) for r in segments)
            if n_rows == 0:
                return [RoundResult(None, stats, [time.perf_counter() - t0])]
            opt = optim_mod.from_config(*spec.optimizer)
            if not probe:  # this partition's optimizer state, resident across rounds
                resident = {name: shard.ensure(name, shape, dt)
                            for name, (shape, dt) in opt.state_layout(model.n_params, model.dtype).items()}
                opt.load_state_arrays(resident, copy=False)
            start = np.array(model.params, copy=True)
            b = spec.batch_size
            per_epoch = np.zeros((len(segments), len(STATS)))  # one stats row per epoch
            t_loop = time.perf_counter()
            n_steps = 0
            for e, rows in enumerate(segments):
                for lo in range(0, len(rows), b):
                    xb, yb = self._batch(x, y, rows[lo:lo + b])
                    s, w, c = model.loss_and_grad(xb, yb, loss)
                    opt.step(model.params, model.grads)
                    per_epoch[e] += (s, w, 0.0 if math.isnan(c) else c, xb.shape[0], 1)
                    n_steps += 1
            step_time = (time.perf_counter() - t_loop) / max(1, n_steps)
            if not probe:
                opt.write_step(resident)
            # row-weighted delta: the driver divides the sum by the rows of all partitions
            vec = (model.params - start) * model.dtype.type(n_rows)
            stats = per_epoch if self.span > 1 else per_epoch[0]
            return [RoundResult(vec, stats, [time.perf_counter() - t0], step_time)]
        return [RoundResult(vec, stats, [time.perf_counter() - t0])]


# --------------------------------------------------------------------------- driver side
@dataclass
class _RoundLog:
    wall: float = 0.0
    compute: float = 0.0
    rounds: int = 0
    stats: np.ndarray = field(default_factory=lambda: np.zeros(len(STATS)))


#: Extra training modes registered by other modules: name -> ``f(trainer, ctx, epoch)``
#: running one epoch and returning ``(stats array, wall seconds, compute seconds, rounds)``.
EPOCH_RUNNERS: dict[str, Callable] = {}
#: Option validators of registered modes: name -> ``f(trainer, **mode_options) -> options``.
MODE_OPTIONS: dict[str, Callable] = {}
#: Modes that register themselves when their module is imported.
_BUILTIN_MODES = {"async": "sparknet.cluster.async_ps"}


def register_mode(name: str, runner: Callable, options: Callable | None = None) -> None:
    """Register an epoch runner for ``DataParallelTrainer(mode=name)`` (e.g. asynchronous rounds).

    The runner may return an object with, besides ``stats``/``wall``/``compute``/``rounds``,
    a dict ``logs`` (merged into the epoch's history) and ``stop`` (end the fit after this
    epoch, without validation).  ``options(trainer, **mode_options)`` validates the
    trainer's extra keyword arguments; its result is ``trainer.mode_options``.
    """
    EPOCH_RUNNERS[name] = runner
    if options is not None:
        MODE_OPTIONS[name] = options


def resolve_mode(mode: str) -> str:
    """``mode`` checked against the known training modes (``"sync"`` and every registered
    one), importing a built-in mode's module (``"async"``) on first use."""
    if mode in _BUILTIN_MODES and mode not in EPOCH_RUNNERS:
        importlib.import_module(_BUILTIN_MODES[mode])
    if mode != "sync" and mode not in EPOCH_RUNNERS:
        known = ["sync", *sorted(set(EPOCH_RUNNERS) | set(_BUILTIN_MODES))]
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in known)}, got {mode!r}")
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
            :func:`sparknet.cluster.session.get_spark`).
        num_partitions: shards of the training data; default: the DataFrame's/RDD's
            partitions, or ``defaultParallelism`` for numpy input.
        mode: ``"sync"`` (synchronous rounds) or ``"async"`` (asynchronous Downpour
            rounds, see :mod:`sparknet.cluster.async_ps`); other modes can be added
            with :func:`register_mode`.
        sync: ``"average"`` (default: tau local steps then average the deltas) or
            ``"gradient"`` (exact minibatch SGD, one global step per round).
        local_steps: tau for ``sync="average"``: an int, or ``"auto"`` (default) for
            the fewest steps keeping Spark's fixed cost at most ``max_overhead`` of a
            round (measured).  More steps than an epoch holds make rounds of several
            whole epochs (``local_steps // steps per epoch``, at most
            ``max_epochs_per_round``).
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
        **mode_options: options of a registered mode (``mode="async"``:
            ``max_staleness``, ``stale``, ``on_update``, ``delta_weight``, ``coalesce``;
            see :class:`sparknet.cluster.async_ps.AsyncOptions`).

    Raises:
        ValueError: unknown ``mode``/``sync``/``reduce``, bad ``local_steps`` or
            ``max_overhead``.
    """

    def __init__(self, model: Sequential, spark=None, num_partitions: int | None = None,
                 mode: str = "sync", sync: str = "average", local_steps: "int | str" = "auto",
                 optimizer: "optim_mod.Optimizer | str | None" = None,
                 loss: "losses_mod.Loss | str | None" = None, max_overhead: float = 0.1,
                 reduce: str = "tree", seed: int | None = None, max_epochs_per_round: int = 4,
                 **mode_options: Any) -> None:
        if not isinstance(model, Sequential):
            raise TypeError(f"model must be a sparknet Sequential, got {type(model).__name__}")
        mode = resolve_mode(mode)
        if sync not in _SYNC:
            raise ValueError(f"sync must be 'gradient' or 'average', got {sync!r}")
        if local_steps != "auto" and (isinstance(local_steps, bool) or not isinstance(local_steps, (int, np.integer))
                                      or local_steps <= 0):
            raise ValueError(f"local_steps must be a positive integer or 'auto', got {local_steps!r}")
        if not 0.0 < float(max_overhead) < 1.0:
            raise ValueError(f"max_overhead must be in (0, 1), got {max_overhead!r}")
        if reduce not in ("tree", "accumulator"):
            raise ValueError(f"reduce must be 'tree' or 'accumulator', got {reduce!r}")
        if (isinstance(max_epochs_per_round, bool) or not isinstance(max_epochs_per_round, (int, np.integer))
                or max_epochs_per_round <= 0):
            raise ValueError(f"max_epochs_per_round must be a positive integer, got {max_epochs_per_round!r}")
        if num_partitions is not None and (isinstance(num_partitions, bool) or
                                           not isinstance(num_partitions, (int, np.integer)) or
                                           num_partitions <= 0):
            raise ValueError(f"num_partitions must be a positive integer, got {num_partitions!r}")
        self.model = model
        self._spark = spark
        self.num_partitions = None if num_partitions is None else int(num_partitions)
        self.mode, self.sync, self.local_steps = mode, sync, local_steps
        self.optimizer = optim_mod.get(optimizer)
        if loss is not None:
            model._loss = losses_mod.get(loss)
        self.max_overhead = float(max_overhead)
        self.max_epochs_per_round = int(max_epochs_per_round)
        self.reduce = reduce
        self.seed = model.seed if seed is None else int(seed)
        self.cost: RoundCostModel | None = None
        if mode in MODE_OPTIONS:
            self.mode_options = MODE_OPTIONS[mode](self, **mode_options)
        elif mode_options:
            raise TypeError(f"mode={mode!r} takes no options {sorted(mode_options)}")

    @property
    def spark(self):
        if self._spark is None:
            from sparknet.cluster.session import get_spark
            self._spark = get_spark()
        return self._spark

    # ----------------------------------------------------------------- fit
    def fit(self, data, y=None, epochs: int = 10, batch_size: int = 32, validation_data=None,
            features_col: str = "features", label_col: str = "label",
            verbose: int = 1) -> tuple[Sequential, History]:
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
            verbose: 1 shows a progress bar on the driver (rounds, running loss); 0 none.

        Returns:
            ``(model, history)``: the trained model (the object passed in, updated in
            place) and a :class:`~sparknet.model.History` with, per epoch, ``loss``,
            ``accuracy`` (classifiers), ``val_loss``, ``val_accuracy``, ``val_time``
            (seconds of the validation job), ``time`` (the epoch's seconds, validation
            included), ``rounds`` (rounds of the epoch; ``1/m`` for a round of ``m``
            epochs), ``local_steps`` (per partition per round) and ``spark_overhead``
            (the measured share of the round time not spent computing in the slowest
            task).  Validation runs when a round ends: epochs that end inside a round
            of several epochs have ``NaN`` ``val_*`` values, and the round's training
            time is shared equally by its epochs (the last one adding the validation's).  ``history.setup_time`` holds the seconds
            spent before the first epoch (loading the data onto the executors, checks,
            calibration).

        Raises:
            ValueError: bad arguments or bad data (missing column, ragged vectors, NaN,
                labels out of range, empty data), always before the first round.
        """
        from sparknet.model import _positive
        from sparknet.progress import progress_bar

        epochs = _positive(epochs, "epochs")
        batch_size = _positive(batch_size, "batch_size")
        model = self.model
        sc = self.spark.sparkContext
        classification = _is_classifier(model)
        key = uuid.uuid4().hex[:12]
        t_fit = time.perf_counter()

        # numpy input: build the model from its shape before splitting (labels checked on the driver)
        if not model.built and isinstance(data, np.ndarray) and data.ndim >= 2:
            model.build(data.shape[1:])
        n_classes = model.output_shape[-1] if (model.built and classification) else None
        sc.setJobDescription("sparknet: loading training data onto the executors")
        train = val = None
        ps = None
        try:
            train = shard_data(data, y, sc=sc, num_partitions=self.num_partitions,
                               features_col=features_col, label_col=label_col, dtype=model.dtype,
                               classification=classification, n_classes=n_classes,
                               sample_shape=model.input_shape, seed=self.seed,
                               what="training data", name=f"train-{key}")
            if not model.built:
                model.build((train.dim,))
            loss = model.loss
            if classification:
                check_label_range(train.resident.infos, model.output_shape[-1], "training data",
                                  label_desc(train.source, label_col))
            if validation_data is not None:
                vdata, vy = _split_validation(validation_data)
                sc.setJobDescription("sparknet: loading validation data onto the executors")
                val = shard_data(vdata, vy, sc=sc, num_partitions=train.num_partitions,
                                 features_col=features_col, label_col=label_col, dtype=model.dtype,
                                 classification=classification,
                                 n_classes=model.output_shape[-1] if classification else None,
                                 sample_shape=model.input_shape, seed=self.seed,
                                 what="validation data", name=f"val-{key}")
                if classification:
                    check_label_range(val.resident.infos, model.output_shape[-1], "validation data",
                                      label_desc(val.source, label_col))
            spec = _FitSpec(
                key=key, config=model.get_config(), loss=loss.name,
                optimizer=(self.optimizer.name, self.optimizer.get_config()),
                batch_size=batch_size, seed=self.seed, input_shape=tuple(model.input_shape),
                classification=classification,
                int_input=bool(getattr(model.layers[0], "accepts_int_input", False)),
                y_shape=() if classification else tuple(model.output_shape))
            ps = ParameterServer(sc, model.params, reduce=self.reduce)
            ctx = _FitContext(self, spec, train, val, ps, epochs, batch_size)
            ctx.calibrate()
            self.cost = ctx.cost
            history = History()
            ctx.history = history
            history.setup_time = time.perf_counter() - t_fit
            log.info("sparknet: %s rows in %d partitions (%s), %s rounds of %s, %d rounds/epoch, "
                     "predicted Spark share %.1f%%", train.total, train.num_partitions, train.source,
                     self.sync, ctx.describe_round(), ctx.rounds,
                     100 * ctx.cost.overhead(ctx.steps_per_round))
            epoch = 0
            while epoch < epochs:
                t0 = time.perf_counter()
                span = min(ctx.epochs_per_round, epochs - epoch) if self.mode == "sync" else 1
                desc = (f"epoch {epoch + 1}/{epochs}" if span == 1 else
                        f"epochs {epoch + 1}-{epoch + span}/{epochs}")
                with progress_bar(total=ctx.rounds, desc=desc, unit="round",
                                  disable=not verbose) as bar:
                    if self.mode == "sync":
                        rl = ctx.sync_epoch(epoch, bar, span)
                        ctx.resize(rl, span)
                    else:
                        ctx.bar = bar
                        rl = EPOCH_RUNNERS[self.mode](self, ctx, epoch)
                stop = bool(getattr(rl, "stop", False))
                rows = np.atleast_2d(rl.stats)
                if rows.shape[0] != span:  # a round with no rows anywhere: zeros for each epoch
                    rows = np.broadcast_to(rows.sum(axis=0), (span, len(STATS)))
                train_time = time.perf_counter() - t0
                val_logs: dict[str, float] = {}
                if val is not None and not stop:
                    tv = time.perf_counter()
                    val_logs = ctx.evaluate(val, f"sparknet epoch {epoch + span}/{epochs} validation")
                    val_logs["val_time"] = time.perf_counter() - tv
                shared = {  # the round's figures, the same for each of its epochs
                    "rounds": rl.rounds / span,
                    "local_steps": (rows[:, STATS.index("steps")].sum() /
                                    max(rl.rounds * max(1, train.num_partitions), 1)),
                    "spark_overhead": 1.0 - rl.compute / rl.wall if rl.wall > 0 else 0.0,
                    **getattr(rl, "logs", {})}
                for i in range(span):
                    st = dict(zip(STATS, rows[i]))
                    w = max(st["weight_sum"], 1e-12)
                    logs = {"loss": st["loss_sum"] / w}
                    if classification:
                        logs["accuracy"] = st["correct"] / w
                    if val_logs:
                        logs.update(val_logs if i == span - 1 else dict.fromkeys(val_logs, math.nan))
                    logs["time"] = train_time / span + (val_logs.get("val_time", 0.0) if i == span - 1 else 0.0)
                    logs.update(shared)
                    history.append(epoch + i, **logs)
                    log.info("epoch %d/%d: %s", epoch + i + 1, epochs,
                             ", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
                epoch += span
                if stop:
                    break
                if not np.isfinite(logs["loss"]):
                    raise FloatingPointError(f"training loss became {logs['loss']} in epoch {epoch}; "
                                             f"lower the learning rate (now {self.optimizer.lr})")
            model.optimizer = self.optimizer
            return model, history
        finally:
            sc.setJobDescription(None)
            if ps is not None:
                ps.close()
            for d in (train, val):
                if d is not None:
                    d.close()

    def evaluate(self, data, y=None, features_col: str = "features", label_col: str = "label") -> dict:
        """Mean loss (and accuracy) of the model on ``data`` (any input :meth:`fit` takes),
        computed on the executors."""
        model = self.model
        if not model.built:
            raise RuntimeError("the model is not built: fit it first")
        sc = self.spark.sparkContext
        classification = model.loss.is_classification
        key = uuid.uuid4().hex[:12]
        d = shard_data(data, y, sc=sc, num_partitions=self.num_partitions, features_col=features_col,
                       label_col=label_col, dtype=model.dtype, classification=classification,
                       n_classes=model.output_shape[-1] if classification else None,
                       sample_shape=model.input_shape, seed=self.seed, what="evaluation data",
                       name=f"eval-{key}")
        ps = ParameterServer(sc, model.params, reduce=self.reduce)
        try:
            if classification:
                check_label_range(d.resident.infos, model.output_shape[-1], "evaluation data",
                                  label_desc(d.source, label_col))
            spec = _FitSpec(key=key, config=model.get_config(), loss=model.loss.name,
                            optimizer=(self.optimizer.name, self.optimizer.get_config()), batch_size=1,
                            seed=self.seed, input_shape=tuple(model.input_shape),
                            classification=classification,
                            int_input=bool(getattr(model.layers[0], "accepts_int_input", False)),
                            y_shape=() if classification else tuple(model.output_shape))
            ctx = _FitContext(self, spec, d, None, ps, 1, 1)
            out = ctx.evaluate(d, "sparknet evaluate")
            return {k[4:]: v for k, v in out.items()}
        finally:
            ps.close()
            d.close()


def _is_classifier(model: Sequential) -> bool:
    """Whether the model's loss takes class ids (known before the model is built)."""
    if model.built or model._loss is not None:
        return model.loss.is_classification
    last = model.layers[-1] if model.layers else None
    return getattr(last, "activation", None) == "softmax" and hasattr(last, "emit_logits")


def _split_validation(validation_data):
    from sparknet.cluster.data import _is_dataframe, _is_rdd
    if _is_dataframe(validation_data) or _is_rdd(validation_data):
        return validation_data, None
    if isinstance(validation_data, (tuple, list)) and len(validation_data) == 2:
        return validation_data[0], validation_data[1]
    raise ValueError("validation_data must be a DataFrame, an RDD of (x, y) pairs or a tuple (X_val, y_val)")


class _FitContext:
    """The state of one fit on the driver: rounds, calibration, evaluation."""

    def __init__(self, trainer: DataParallelTrainer, spec: _FitSpec, train: ShardedData,
                 val: ShardedData | None, ps: ParameterServer, epochs: int, batch_size: int) -> None:
        self.trainer, self.spec, self.train, self.val, self.ps = trainer, spec, train, val, ps
        self.epochs, self.batch_size = epochs, batch_size
        self.model = trainer.model
        self.sc = ps.sc
        self.cost: RoundCostModel | None = None
        self.rounds = 1
        self.steps_per_round = 1
        self.epochs_per_round = 1

    def describe_round(self) -> str:
        if self.trainer.sync == "gradient":
            return f"1 global step of {self.batch_size} rows"
        if self.epochs_per_round > 1:
            return (f"{self.epochs_per_round} epochs (~{self.steps_per_round} local steps of "
                    f"{self.batch_size} rows)")
        return f"~{self.steps_per_round} local steps of {self.batch_size} rows"

    def _size(self, steps_epoch: int, tau: int) -> None:
        """Rounds per epoch (or epochs per round) for ``tau`` local steps per round."""
        if tau > steps_epoch and self.trainer.mode == "sync":
            self.rounds = 1
            self.epochs_per_round = max(1, min(self.trainer.max_epochs_per_round,
                                               tau // steps_epoch if self.trainer.local_steps != "auto"
                                               else math.ceil(tau / steps_epoch)))
        else:
            self.rounds = max(1, steps_epoch // tau if self.trainer.local_steps == "auto"
                              else math.ceil(steps_epoch / tau))
            self.epochs_per_round = 1
        self.steps_per_round = math.ceil(steps_epoch / self.rounds) * self.epochs_per_round

    # -- calibration ------------------------------------------------------
    def _probe(self, steps: int) -> tuple[float, float, float]:
        """One timed round that changes nothing: (wall seconds, slowest task's compute,
        seconds of one local step)."""
        t0 = time.perf_counter()
        bc = self.ps.broadcast()
        task = _RoundTask(self.spec, bc, "probe", probe_steps=steps)
        rdd = self.train.resident.mapPartitions(task)
        self.sc.setJobDescription("sparknet: calibrating the round length")
        res = self.train.resident.run_action(lambda: self.ps.gather(rdd))
        return time.perf_counter() - t0, max(res.times) if res.times else 0.0, res.step_time

    def calibrate(self) -> None:
        """Measure Spark's fixed cost and the compute of a local step; size the rounds."""
        tr, sync = self.trainer, self.trainer.sync
        n_max = max(self.train.rows)
        if sync == "gradient":
            per_part = math.ceil(self.batch_size * n_max / max(self.train.total, 1))
            self.rounds = math.ceil(self.train.total / self.batch_size)
        else:
            per_part = self.batch_size
        saved = self.spec.batch_size
        self.spec.batch_size = max(1, per_part)
        try:
            self._probe(2)  # warm-up: worker start, model build, attach
            wall, comp, t_step = self._probe(4)
        finally:
            self.spec.batch_size = saved
        t_step = max(t_step, 1e-6)
        t_fixed = max(wall - comp, 1e-4)
        self.cost = RoundCostModel(t_fixed, t_step, int(self.model.params.nbytes))
        if sync == "gradient":
            self.steps_per_round = 1
            over = self.cost.overhead(1)
            if over > tr.max_overhead:
                log.warning("sync='gradient': each round is one global step of %d rows (%.1f ms of "
                            "compute) against %.0f ms of Spark's fixed cost (predicted share %.0f%%); "
                            "a larger batch_size or sync='average' amortises it", self.batch_size,
                            1e3 * t_step, 1e3 * t_fixed, 100 * over)
            return
        steps_epoch = max(1, math.ceil(n_max / self.batch_size))
        tau = self.cost.steps_for(tr.max_overhead) if tr.local_steps == "auto" else int(tr.local_steps)
        self._size(steps_epoch, tau)
        if self.cost.overhead(self.steps_per_round) > tr.max_overhead:
            log.info("a round of %d epoch(s) holds only %d local steps per partition (%.0f ms); "
                     "Spark's fixed cost of %.0f ms per round stays above %.0f%% of a round "
                     "(max_epochs_per_round=%d)", self.epochs_per_round, self.steps_per_round,
                     1e3 * self.steps_per_round * t_step, 1e3 * t_fixed, 100 * tr.max_overhead,
                     tr.max_epochs_per_round)

    def resize(self, rl: _RoundLog, span: int = 1) -> None:
        """Re-size the next rounds from the ones just measured (``sync="average"`` with
        ``local_steps="auto"``): the probe only sees a few steps, a round sees them all."""
        tr = self.trainer
        if tr.sync != "average" or tr.local_steps != "auto" or rl.rounds == 0 or rl.wall <= 0:
            return
        steps_epoch = max(1, math.ceil(max(self.train.rows) / self.batch_size))
        steps = math.ceil(steps_epoch / self.rounds) * span  # local steps of one measured round
        t_step = rl.compute / (rl.rounds * steps)
        t_fixed = max(rl.wall - rl.compute, 0.0) / rl.rounds
        if t_step <= 0:
            return
        self.cost = RoundCostModel(max(t_fixed, 1e-4), t_step, self.cost.param_bytes if self.cost else 0)
        tr.cost = self.cost
        before = (self.rounds, self.epochs_per_round, self.steps_per_round)
        self._size(steps_epoch, self.cost.steps_for(tr.max_overhead))
        if (self.steps_per_round < before[2]
                and self.cost.overhead(self.steps_per_round) > 0.7 * tr.max_overhead):
            # shorter rounds only with a margin: no flip-flopping on noise
            self.rounds, self.epochs_per_round, self.steps_per_round = before
        if (self.rounds, self.epochs_per_round) != before[:2]:
            log.info("measured round: %.0f ms fixed, %.2f ms per local step: rounds of %s from now on",
                     1e3 * t_fixed, 1e3 * t_step, self.describe_round())

    # -- rounds -----------------------------------------------------------
    def sync_epoch(self, epoch: int, bar, span: int = 1) -> _RoundLog:
        """The rounds of epoch ``epoch`` (or one round of the ``span`` epochs from it)."""
        tr, model = self.trainer, self.model
        rl = _RoundLog()
        E, R = self.epochs, (1 if span > 1 else self.rounds)
        which = f"epoch {epoch + 1}/{E}" if span == 1 else f"epochs {epoch + 1}-{epoch + span}/{E}"
        for r in range(R):
            t0 = time.perf_counter()
            bc = self.ps.broadcast()
            task = _RoundTask(self.spec, bc, tr.sync, epoch=epoch, rnd=r, rounds=R, span=span)
            rdd = self.train.resident.mapPartitions(task)
            self.sc.setJobDescription(f"sparknet {which} round {r + 1}/{R}")
            res = self.train.resident.run_action(lambda: self.ps.gather(rdd))
            if res.vec is not None:
                if tr.sync == "gradient":
                    w = res.stat("weight_sum")
                    grad = res.vec / model.dtype.type(w) if w > 0 else res.vec * 0
                    tr.optimizer.step(model.params, np.ascontiguousarray(grad, dtype=model.dtype))
                else:
                    rows = res.stat("samples")
                    if rows > 0:
                        model.params += (res.vec / model.dtype.type(rows)).astype(model.dtype, copy=False)
            rl.wall += time.perf_counter() - t0
            rl.compute += max(res.times) if res.times else 0.0
            rl.rounds += 1
            rl.stats = rl.stats + res.stats
            bar.update(1)
            run = np.atleast_2d(rl.stats).sum(axis=0)  # running over the epoch(s) so far
            w = max(run[1], 1e-12)
            post = {"loss": f"{run[0] / w:.4f}"}
            if self.spec.classification:
                post["acc"] = f"{run[2] / w:.4f}"
            bar.set_postfix(post, refresh=False)
        return rl

    def evaluate(self, data: ShardedData, description: str) -> dict[str, float]:
        bc = self.ps.broadcast()
        rdd = data.resident.mapPartitions(_RoundTask(self.spec, bc, "eval"))
        self.sc.setJobDescription(description)
        res = data.resident.run_action(lambda: self.ps.gather(rdd))
        w = max(res.stat("weight_sum"), 1e-12)
        out = {"val_loss": res.stat("loss_sum") / w}
        if self.spec.classification:
            out["val_accuracy"] = res.stat("correct") / w
        return out


def demo(spark=None, epochs: int = 35, seed: int = 0, num_partitions: int = 2,
         verbose: "int | bool" = 1) -> float:
    """Train a 64-128-10 MLP on scikit-learn's digits on Spark (tau-averaging rounds) and
    return its accuracy on the held-out quarter.

    Args:
        spark: a SparkSession (default: the active one, or a new ``local[*]`` one; Java
            17+ is checked first).
        epochs: passes over the training set (35 reach 97-98 %).
        seed: seeds the split, the initial weights and the shuffles.
        num_partitions: data shards.
        verbose: show the progress bar (and log each epoch at INFO).

    Returns:
        test accuracy.

    Raises:
        JavaNotFoundError: no Java 17+ when a new session is needed.
    """
    from sparknet.datasets import load_digits
    from sparknet.layers import Dense

    X, y, Xt, yt = load_digits(seed=seed)
    model = Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")], seed=seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=num_partitions, sync="average",
                                  optimizer=optim_mod.RMSprop(lr=3e-3))
    trainer.fit(X, y, epochs=epochs, batch_size=16, verbose=int(bool(verbose)))
    return float(model.evaluate(Xt, yt)["accuracy"])

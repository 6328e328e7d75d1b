"""How to train a model on the cluster at hand: mode, partitions, tau, BLAS threads per
task, blocks and pairing, chosen from measured costs.

How it works
------------
:func:`plan` measures what the cost model (:mod:`sparknet.cluster.planning.cost`) needs --
:meth:`SparkCosts.measure <sparknet.cluster.planning.cost_inputs.SparkCosts.measure>` on the
live session (cached per application) and :meth:`NetworkCosts.measure
<sparknet.cluster.planning.cost_inputs.NetworkCosts.measure>` of the model (cached per
architecture) -- and enumerates the candidates that apply
(:mod:`sparknet.cluster.planning.candidates`): ``"gradient"`` with partitions ``P``; ``"average"``
and ``"async"`` with ``P`` and ``tau``; ``"model_parallel"`` with blocks ``K`` and pairing of the
large dense layers and ``"hybrid"`` with ``D x K``; each with BLAS threads per task ``T`` within
the cores.

Every candidate gets a :class:`~sparknet.cluster.planning.cost.Prediction` (time per epoch and its
breakdown); those that do not fit an executor's memory are set aside with the reason
(:attr:`Plan.ruled_out <sparknet.cluster.planning.ranking.Plan>`); the rest are ranked
by predicted time per epoch (:mod:`sparknet.cluster.planning.ranking`: candidates within
:data:`~sparknet.cluster.planning.ranking.TOLERANCE` of the fastest count as equally fast, and
the one that synchronises most often is taken).  :meth:`Plan.explain
<sparknet.cluster.planning.ranking.Plan.explain>` prints the best and the runner-up (the best
candidate of another configuration), their breakdowns, and the terms that separate them.

The same ranking runs on a simulated cluster: :func:`plan_from_costs` with
``predictor=simulated()`` (:mod:`sparknet.cluster.planning.simulate`).  Example::

    p = sparknet.cluster.plan(model, X, spark, batch_size=128)   # prints p.explain()
    trainer = DataParallelTrainer(model, spark, **p.trainer_kwargs())

:class:`~sparknet.cluster.planning.ranking.Plan`, :func:`~sparknet.cluster.planning.ranking.rank`,
:func:`~sparknet.cluster.planning.ranking.describe`,
:class:`~sparknet.cluster.planning.candidates.DenseLayout` and the other names of those two modules
stay importable from here.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from sparknet.cluster.planning import cost
from sparknet.cluster.planning.candidates import (  # noqa: F401 - MODES: re-exported
    MIN_BLOCKED_PARAMS,
    MODES,
    DenseLayout,
    check_modes,
    dense_layout,
    enumerate_candidates,
)
from sparknet.cluster.planning.memory import memory_need, memory_per_executor
from sparknet.cluster.planning.ranking import (  # noqa: F401 - the result's names, re-exported
    TOLERANCE,
    Plan,
    RuledOut,
    config_key,
    describe,
    rank,
)

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel.block_partition import BlockPlan
    from sparknet.cluster.planning.cost import NetworkCosts, Prediction, SparkCosts
    from sparknet.model import Sequential

#: a predictor: ``(mode, net, spark_costs, samples, settings) -> Prediction``
Predictor = Callable[[str, "NetworkCosts", "SparkCosts", int, dict], "Prediction"]
#: models whose parameters exceed this are costed from their FLOPs, not timed in this process
MEASURE_LIMIT = 256 << 20

_SPARK_CACHE: dict[tuple, "SparkCosts"] = {}
_NET_CACHE: dict[tuple, "NetworkCosts"] = {}


# ------------------------------------------------------------------ predictors
def modelled(mode: str, net: "NetworkCosts", spark_costs: "SparkCosts", samples: int,
             settings: dict) -> "Prediction":
    """The cost model's prediction (:func:`sparknet.cluster.planning.cost.predict`) of a candidate;
    ``settings["threads"]`` becomes the costs' BLAS threads per task."""
    kw = dict(settings)
    threads = int(kw.pop("threads", 1))
    sc = dataclasses.replace(spark_costs, blas_threads=threads)
    tasks = int(kw.get("partitions", kw.get("blocks", 1) * kw.get("replicas", 1)))
    # job_s was measured with probe_tasks tasks: fewer cost between it and the one-task job
    # (measured too)
    if sc.single_job_s is not None and tasks < sc.probe_tasks:
        w = (tasks - 1) / (sc.probe_tasks - 1)
        sc = dataclasses.replace(sc, job_s=sc.single_job_s + w * (sc.job_s - sc.single_job_s),
                                 probe_tasks=tasks)
    p = cost.predict(mode, net, sc, samples, **kw)
    p.settings["threads"] = threads
    return p


def simulated(stragglers: Any = None, seed: int = 0) -> Predictor:
    """A predictor running :func:`sparknet.cluster.planning.simulate.simulate` (with ``stragglers``,
    a :class:`~sparknet.cluster.planning.simulate.Stragglers`) instead of the closed-form model."""
    from sparknet.cluster.planning import simulate as sim

    strag = stragglers if stragglers is not None else sim.NO_STRAGGLERS

    def predictor(mode: str, net: "NetworkCosts", spark_costs: "SparkCosts", samples: int,
                  settings: dict) -> "Prediction":
        return sim.simulate(mode, net, spark_costs, samples, stragglers=strag, seed=seed,
                            **settings)

    return predictor


# ------------------------------------------------------------------ planning

def plan_from_costs(net: "NetworkCosts", spark_costs: "SparkCosts", samples: int, *,
                    modes: Sequence[str] | None = None, layout: DenseLayout | None = None,
                    max_partitions: int | None = None, taus: Sequence[int] | None = None,
                    threads: Sequence[int] | None = None, predictor: Predictor = modelled,
                    memory: float | None = None, sample_bytes: float = 0.0,
                    why_not_blocked: str = "it has no dense layer to block") -> Plan:
    """Rank the candidates on costs already known (measured, or a simulated cluster's):
    ``layout`` gives an all-dense model's model-parallel candidates, ``taus`` and ``threads``
    replace the default local steps and BLAS threads per task, ``predictor`` is
    :func:`modelled` (the cost model) or :func:`simulated`, ``memory`` the bytes per
    executor (``None``: not checked) and ``sample_bytes`` those of one row of a shard.

    Raises:
        ValueError: bad samples, modes, partitions, taus or threads; no candidate fits.
    """
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if max_partitions is not None and (isinstance(max_partitions, bool)
                                       or not isinstance(max_partitions, int)
                                       or max_partitions < 1):
        raise ValueError("max_partitions must be a positive integer or None, got "
                         f"{max_partitions!r}")
    if taus is not None and (not taus or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                                             for t in taus)):
        raise ValueError("taus must be a non-empty list of positive local step counts, got "
                         f"{taus!r}")
    slots = spark_costs.hosts * spark_costs.cores_per_host
    if max_partitions is not None:
        slots = min(slots, max_partitions)
    wanted = check_modes(modes, layout, slots, why_not_blocked)
    feasible: list["Prediction"] = []
    out: list[RuledOut] = []
    for mode, settings in enumerate_candidates(wanted, spark_costs, int(samples), net.batch_size,
                                               max_partitions=max_partitions, taus=taus,
                                               threads=threads, layout=layout):
        p = predictor(mode, net, spark_costs, int(samples), dict(settings))
        if layout is not None and mode in ("model_parallel", "hybrid"):
            from sparknet.cluster.model_parallel.block_partition import BlockPlan
            p.settings["plan"] = BlockPlan({i: int(settings["blocks"]) for i in layout.blocked},
                                           pair=bool(settings["paired"]))
        need = memory_need(mode, net, settings, int(samples), sample_bytes, spark_costs, layout)
        if memory is not None and need > memory:
            out.append(RuledOut(p, f"needs {need / 2**30:.3g} GiB per executor, "
                                   f"{memory / 2**30:.3g} GiB available"))
        else:
            feasible.append(p)
    if not feasible:
        raise ValueError(f"no candidate fits: every one needs more memory per executor than "
                         f"{(memory or 0) / 2**30:.3g} GiB (the smallest: "
                         f"{min(out, key=lambda r: r.prediction.epoch_s).reason})")
    return Plan(rank(feasible), out, int(samples), spark_costs, net, memory)



def measured_costs(model: "Sequential", spark: Any, batch_size: int,
                   input_shape: Sequence[int] | None = None) -> tuple["SparkCosts", "NetworkCosts"]:
    """The session's :class:`~sparknet.cluster.planning.cost_inputs.SparkCosts` (measured once
    per application) and the model's :class:`~sparknet.cluster.planning.cost_inputs.NetworkCosts`
    at ``batch_size`` (timed on a copy, once per architecture; from FLOPs past
    :data:`MEASURE_LIMIT`)."""
    from sparknet.model import Sequential

    cfg = model.get_config()
    if cfg.get("input_shape") is None:
        if input_shape is None:
            raise ValueError("the model is not built and the data's row shape is unknown: build "
                             "the model first")
        cfg["input_shape"] = [int(d) for d in input_shape]
    nkey = (repr(cfg), int(batch_size))
    if nkey not in _NET_CACHE:
        layout, _ = dense_layout(model, cfg["input_shape"], min_params=0)
        if layout is not None and 4 * layout.blocked_params() > MEASURE_LIMIT:
            _NET_CACHE[nkey] = _dense_costs(layout, batch_size)
        else:
            _NET_CACHE[nkey] = cost.NetworkCosts.measure(Sequential.from_config(cfg),
                                                         int(batch_size))
    return _spark_costs(spark), _NET_CACHE[nkey]


def _session_key(spark: Any) -> tuple:
    sc = spark.sparkContext
    return (sc.applicationId, sc.master, int(sc.defaultParallelism))


def _spark_costs(spark: Any) -> "SparkCosts":
    """The session's Spark costs, measured once per application."""
    key = _session_key(spark)
    if key not in _SPARK_CACHE:
        _SPARK_CACHE[key] = cost.SparkCosts.measure(spark)
    return _SPARK_CACHE[key]


def _dense_costs(layout: DenseLayout, batch_size: int, efficiency: float = 0.6) -> "NetworkCosts":
    """Costs of an all-dense model from its FLOPs at the measured sgemm rate (no weights
    allocated)."""
    from sparknet.cluster.planning.probes import dense_flops, gemm_gflops

    w = layout.widths
    flops = sum(dense_flops(a, b, input_grad=i > 0) for i, (a, b) in enumerate(zip(w, w[1:])))
    n = sum(a * b + b for a, b in zip(w, w[1:]))
    return cost.NetworkCosts.from_counts(flops, n, 4 * n, [4 * b for b in w[1:]], batch_size,
                                         gemm_gflops(), efficiency)


def _data_shape(data: Any) -> tuple[int, tuple[int, ...] | None, float]:
    """``(rows, per-row shape or None, bytes per row)`` of numpy, ``(X, y)``, DataFrame or RDD
    data."""
    if isinstance(data, tuple) and len(data) == 2:
        data = data[0]
    if isinstance(data, np.ndarray):
        if data.ndim < 1 or data.shape[0] < 1:
            raise ValueError(f"data must hold at least one row, got an array of shape {data.shape}")
        row = tuple(int(d) for d in data.shape[1:])
        # float32 rows and an int64 label
        return int(data.shape[0]), row, 4.0 * int(np.prod(row)) + 8
    if hasattr(data, "rdd") and hasattr(data, "count"):  # a DataFrame
        return int(data.count()), None, 0.0
    if hasattr(data, "getNumPartitions") and hasattr(data, "count"):  # an RDD
        return int(data.count()), None, 0.0
    raise ValueError("data must be a numpy array, an (X, y) tuple, a DataFrame or an RDD, got "
                     f"{type(data).__name__}")


def plan(model: "Sequential", data: Any, spark: Any, *, samples: int | None = None,
         modes: Sequence[str] | None = None, max_partitions: int | None = None,
         batch_size: int = 128, verbose: bool = True, taus: Sequence[int] | None = None,
         threads: Sequence[int] | None = None, spark_costs: "SparkCosts | None" = None) -> Plan:
    """Choose how to train ``model`` on ``data`` with the session ``spark``.

    Args:
        model: a :class:`~sparknet.model.Sequential` (built, or built from ``data``'s rows).
        data: the training data (numpy, ``(X, y)``, DataFrame or RDD), for its rows and shape.
        spark: the ``SparkSession`` the training will run on (its costs are measured).
        samples: rows per epoch (default: ``data``'s).
        modes: among ``"gradient"``, ``"average"``, ``"async"``, ``"model_parallel"``,
            ``"hybrid"`` (default: every one that applies to the model).
        max_partitions: the most partitions or slots (default: the cores Spark has).
        batch_size: the minibatch rows (local minibatch; the global one for ``"gradient"``).
        verbose: print :meth:`Plan.explain`.
        taus: local steps to consider (default: powers of two, and 1, 2, 4 epochs' steps).
        threads: BLAS threads per task to consider (default: the session's ``spark.task.cpus``).
        spark_costs: the session's costs when already measured (then kept for its later plans).

    Raises:
        ValueError: bad arguments (each names the value), a model it cannot cost, or no
            candidate fitting an executor's memory.
    """
    from sparknet.model import Sequential

    if not isinstance(model, Sequential):
        raise TypeError(f"model must be a sparknet Sequential, got {type(model).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)
                                or samples < 1):
        raise ValueError(f"samples must be a positive integer or None, got {samples!r}")
    rows, row_shape, row_bytes = _data_shape(data)
    # kept for the session's later plans (and auto_partitions, auto_blocks)
    if spark_costs is not None:
        _SPARK_CACHE[_session_key(spark)] = spark_costs
    spark_costs, net = measured_costs(model, spark, batch_size, row_shape)
    layout, why = dense_layout(model, model.input_shape or row_shape)
    if threads is None:  # a session's tasks take spark.task.cpus cores (their BLAS threads)
        threads = [min(int(spark.sparkContext.getConf().get("spark.task.cpus", "1")),
                       spark_costs.cores_per_host)]
    p = plan_from_costs(net, spark_costs, samples or rows, modes=modes, layout=layout,
                        max_partitions=max_partitions, taus=taus, threads=threads,
                        memory=memory_per_executor(spark), sample_bytes=row_bytes,
                        why_not_blocked=why)
    if verbose:
        print(p.explain())
    return p


def auto_partitions(model: "Sequential", data: Any, spark: Any, *, batch_size: int = 32,
                    mode: str = "sync", sync: str = "average", local_steps: "int | str" = "auto",
                    verbose: bool = False) -> int:
    """Partitions for ``DataParallelTrainer(num_partitions="auto")``: the planner's best
    for the trainer's mode (``local_steps`` fixed when given)."""
    want = "async" if mode == "async" else sync
    taus = None if local_steps in ("auto", "timed") else [int(local_steps)]
    best = plan(model, data, spark, modes=[want], batch_size=batch_size, verbose=verbose,
                taus=taus).best
    return int(best.settings["partitions"])


def auto_blocks(layers: Any, input_shape: Sequence[int], spark: Any, *, batch_size: int = 128,
                replicas: int = 1, verbose: bool = False) -> "BlockPlan":
    """A :class:`~sparknet.cluster.model_parallel.block_partition.BlockPlan` for
    ``ModelParallel(plan="auto")``: the planner's best ``K`` and pairing for the large dense layers
    (of an unbuilt Sequential or a layer list; nothing is allocated; the largest when none has
    :data:`~sparknet.cluster.planning.candidates.MIN_BLOCKED_PARAMS`), ``replicas`` replicas."""
    from sparknet.model import Sequential

    seq = layers if isinstance(layers, Sequential) else Sequential(list(layers))
    every, why = dense_layout(seq, input_shape, min_params=0)
    if every is None:
        raise ValueError(f"blocks='auto': {why}")
    w = every.widths
    largest = max(w[i] * w[i + 1] for i in every.blocked)
    layout, _ = dense_layout(seq, input_shape, min_params=min(MIN_BLOCKED_PARAMS, largest))
    assert layout is not None
    spark_costs = _spark_costs(spark)
    mode = "hybrid" if replicas > 1 else "model_parallel"
    p = plan_from_costs(_dense_costs(layout, batch_size), spark_costs, 100 * batch_size,
                        modes=[mode], layout=layout, threads=[1], memory=memory_per_executor(spark))
    if replicas > 1:
        p.candidates = rank([c for c in p.candidates if c.settings.get("D") == replicas])
        if not p.candidates:
            raise ValueError(f"replicas={replicas}: no D x K layout of {replicas} replicas fits "
                             "the cluster's slots")
    if verbose:
        print(p.explain())
    return p.best.settings["plan"]

"""How to train a model on the cluster at hand: mode, partitions, tau, BLAS threads per
task, blocks and pairing, chosen from measured costs.

How it works
------------
:func:`plan` measures what the cost model (:mod:`sparknet.cluster.planning.cost`) needs --
:meth:`SparkCosts.measure <sparknet.cluster.planning.cost.SparkCosts.measure>` on the live session
(cached per application) and :meth:`NetworkCosts.measure
<sparknet.cluster.planning.cost.NetworkCosts.measure>` of the model (cached per architecture) -- and
enumerates the candidates that apply: ``"gradient"`` with partitions ``P``; ``"average"``
and ``"async"`` with ``P`` and ``tau`` (powers of two, and one, two and four epochs'
steps: the trainer's longest round is four epochs); ``"model_parallel"`` with blocks ``K``
and pairing of the large dense layers (:data:`MIN_BLOCKED_PARAMS` parameters or more) and
``"hybrid"`` with ``D x K``; each with BLAS threads per task ``T`` within the cores.

Every candidate gets a :class:`~sparknet.cluster.planning.cost.Prediction` (time per epoch and its
breakdown); those that do not fit an executor's memory are set aside with the reason
(:attr:`Plan.ruled_out`); the rest are ranked by predicted time per epoch.  Candidates
within :data:`TOLERANCE` of the fastest count as equally fast, and among them the plan
takes the one that synchronises most often (fewest local steps, then fewest partitions or
blocks), because more averaging converges in fewer epochs.  :meth:`Plan.explain` prints
the best and the runner-up (the best candidate of another configuration), their
breakdowns, and the terms that separate them.

The same ranking runs on a simulated cluster: :func:`plan_from_costs` with
``predictor=simulated()`` (:mod:`sparknet.cluster.planning.simulate`).  Example::

    p = sparknet.cluster.plan(model, X, spark, batch_size=128)   # prints p.explain()
    trainer = DataParallelTrainer(model, spark, **p.trainer_kwargs())
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from sparknet.cluster.planning import cost
from sparknet.cluster.planning.memory import DATA_PARALLEL as _DATA_PARALLEL
from sparknet.cluster.planning.memory import memory_need, memory_per_executor

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel.block_partition import BlockPlan
    from sparknet.cluster.planning.cost import NetworkCosts, Prediction, SparkCosts
    from sparknet.model import Sequential

MODES = ("gradient", "average", "async", "model_parallel", "hybrid")
#: candidates predicted within this share of the fastest count as equally fast
TOLERANCE = 0.05
#: a dense layer is worth cutting into blocks from this many parameters on
MIN_BLOCKED_PARAMS = 1 << 20
#: a predictor: ``(mode, net, spark_costs, samples, settings) -> Prediction``
Predictor = Callable[[str, "NetworkCosts", "SparkCosts", int, dict], "Prediction"]
#: models whose parameters exceed this are costed from their FLOPs, not timed in this process
MEASURE_LIMIT = 256 << 20

_SPARK_CACHE: dict[tuple, "SparkCosts"] = {}
_NET_CACHE: dict[tuple, "NetworkCosts"] = {}


# ------------------------------------------------------------------ the plan
@dataclass
class RuledOut:
    """A candidate set aside, and why (its memory per executor)."""
    prediction: "Prediction"
    reason: str


@dataclass
class Plan:
    """Ranked candidates (:attr:`candidates`, :attr:`best` first, then by predicted time per
    epoch), those that do not fit an executor's memory (:attr:`ruled_out`, with the
    reason), the rows per epoch, and the costs and memory the predictions used."""

    candidates: list["Prediction"]
    ruled_out: list[RuledOut]
    samples: int
    spark_costs: "SparkCosts"
    net_costs: "NetworkCosts"
    memory_per_executor: float | None = None

    @property
    def best(self) -> "Prediction":
        """The chosen candidate."""
        return self.candidates[0]

    @property
    def runner_up(self) -> "Prediction | None":
        """The fastest candidate of another configuration than the best (another mode, or
        other partitions, blocks or replicas), or ``None`` when there is none."""
        key = _config_key(self.best)
        return next((p for p in self.candidates[1:] if _config_key(p) != key), None)

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the trainer of the best candidate:
        :class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` (``num_partitions``,
        ``mode``, ``sync``, ``local_steps``) or
        :class:`~sparknet.cluster.model_parallel.ModelParallel` (``plan``, ``replicas``)."""
        b, s = self.best, self.best.settings
        if b.mode in _DATA_PARALLEL:
            kw: dict[str, Any] = {"num_partitions": s["partitions"],
                                  "mode": "async" if b.mode == "async" else "sync"}
            if b.mode != "async":
                kw["sync"] = b.mode
            if "tau" in s:
                kw["local_steps"] = s["tau"]
            return kw
        return {"plan": s["plan"], "replicas": s.get("D", 1)}

    def __repr__(self) -> str:
        """A few lines: the best candidate and the runner-up; :meth:`explain` gives their
        breakdowns, :meth:`table` every candidate."""
        ru = self.runner_up
        counts = f"{len(self.candidates)} candidates" + (f", {len(self.ruled_out)} ruled out"
                                                         if self.ruled_out else "")
        return "\n".join([f"Plan({self.samples:,} samples per epoch, {counts};",
                          f"  best:      {describe(self.best)}",
                          f"  runner-up: {'none' if ru is None else describe(ru)};",
                          "  .explain(): why, .table(): every candidate, .trainer_kwargs(): the "
                          "settings)"])

    def __str__(self) -> str:
        return self.explain()

    def table(self) -> str:
        """Every candidate, one line each, best first, then those ruled out with the reason."""
        lines = [f"{i + 1:>4}. {describe(p)}" for i, p in enumerate(self.candidates)]
        lines += [f"   -. {describe(r.prediction)}: ruled out, {r.reason}" for r in self.ruled_out]
        return "\n".join(lines)

    def explain(self) -> str:
        """The best candidate and the runner-up, their breakdowns, and why the best wins."""
        sc = self.spark_costs
        lines = [f"plan for {self.samples:,} samples per epoch, batch {self.net_costs.batch_size} "
                 f"({sc.hosts} host(s) x {sc.cores_per_host} cores, "
                 f"{sc.bandwidth_bytes_s * 8 / 1e9:.3g} Gb/s); {len(self.candidates)} candidates"
                 + (f", {len(self.ruled_out)} ruled out" if self.ruled_out else "")]
        lines.append("best:      " + describe(self.best))
        lines += _breakdown_lines(self.best)
        ru = self.runner_up
        if ru is None:
            lines.append("runner-up: none (a single configuration applies)")
        else:
            lines.append("runner-up: " + describe(ru))
            lines += _breakdown_lines(ru)
            lines.append("why: " + _why(self.best, ru))
        near = sum(1 for p in self.candidates[1:] if _config_key(p) == _config_key(self.best)
                   and p.epoch_s <= self.candidates[0].epoch_s * (1 + TOLERANCE))
        if near and self.best.mode in ("average", "async"):
            lines.append(f"     ({near} with more local steps are within {100 * TOLERANCE:.0f}%: "
                         "fewer is taken)")
        per_mode: dict[str, "Prediction"] = {}
        for c in self.candidates:
            per_mode.setdefault(c.mode, c)
        if len(per_mode) > 1:
            lines.append("best per mode: " + "; ".join(f"{m} {c.epoch_s:.3g} s"
                                                       for m, c in per_mode.items()))
        lines += [f"ruled out: {describe(r.prediction)}: {r.reason}" for r in self.ruled_out[:3]]
        lines += [f"ruled out: {len(self.ruled_out) - 3} more"] if len(self.ruled_out) > 3 else []
        return "\n".join(lines)


def describe(p: "Prediction") -> str:
    """One line: mode, settings, predicted seconds per epoch and speedup."""
    s = p.settings
    if p.mode in _DATA_PARALLEL:
        what = f"{s['partitions']} partition(s)" + (f", tau={s['tau']}" if "tau" in s else "")
    else:
        what = f"K={s['K']}" + (" paired" if s.get("paired")
                                else "") + (f", D={s['D']}" if s.get("D", 1) > 1 else "")
    what += f", {s.get('threads', 1)} thread(s)/task"
    return (f"{p.mode} ({what}): {p.epoch_s:.4g} s/epoch, {p.speedup:.2f}x one process "
            f"({p.one_process_epoch_s:.4g} s)")


def _breakdown_lines(p: "Prediction") -> list[str]:
    total = sum(v for v in p.breakdown.values() if v > 0) or 1.0
    parts = sorted(((k, v) for k, v in p.breakdown.items() if v > 0), key=lambda kv: -kv[1])
    return ["           " + ", ".join(f"{k} {v:.3g} s ({100 * v / total:.0f}%)" for k, v in parts)]


def _why(best: "Prediction", other: "Prediction") -> str:
    """The terms of the breakdown that separate two candidates, largest first."""
    gap = other.epoch_s - best.epoch_s
    keys = set(best.breakdown) | set(other.breakdown)
    diff = sorted(((k, other.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0)) for k in keys),
                  key=lambda kv: -abs(kv[1]))
    terms = ", ".join(f"{k} {d:+.3g} s" for k, d in diff[:3] if abs(d) > 1e-9)
    if gap <= best.epoch_s * TOLERANCE:
        return (f"the runner-up is within {100 * TOLERANCE:.0f}% ({gap:+.3g} s/epoch: {terms}); "
                f"the best synchronises more often or uses fewer tasks")
    return (f"the runner-up needs {gap:.3g} s more per epoch ({100 * gap / best.epoch_s:.0f}%): "
            f"{terms}")


def _config_key(p: "Prediction") -> tuple:
    s = p.settings
    return (p.mode, s.get("partitions"), s.get("K"), s.get("D"), s.get("paired"), s.get("threads"))


def _preference(p: "Prediction") -> tuple:
    """Among equally fast candidates: fewest local steps, then fewest tasks."""
    s = p.settings
    tasks = s.get("partitions") or s.get("K", 1) * s.get("D", 1)
    return (s.get("tau", 0), tasks, s.get("threads", 1))


def rank(predictions: Sequence["Prediction"]) -> list["Prediction"]:
    """``predictions`` best first: the preferred one among those within :data:`TOLERANCE`
    of the fastest (:func:`_preference`), then the rest by predicted time per epoch."""
    if not predictions:
        return []
    ordered = sorted(predictions, key=lambda p: p.epoch_s)
    limit = ordered[0].epoch_s * (1 + TOLERANCE)
    best = min((p for p in ordered if p.epoch_s <= limit), key=_preference)
    return [best] + [p for p in ordered if p is not best]


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


# ------------------------------------------------------------------ candidates
@dataclass(frozen=True)
class DenseLayout:
    """The dense layers of an all-dense model, as the cost model's model-parallel terms
    take them: ``widths`` ``[in, h1, ..., out]`` and the ``blocked`` layer indices."""

    widths: tuple[int, ...]
    blocked: tuple[int, ...]

    @property
    def pairable(self) -> bool:
        """Two consecutive layers are blocked (a Megatron pair is possible)."""
        return any(b == a + 1 for a, b in zip(self.blocked, self.blocked[1:]))

    @property
    def max_blocks(self) -> int:
        """The most blocks every blocked layer can be cut into (its fewest neurons)."""
        return min(self.widths[i + 1] for i in self.blocked)

    def blocked_params(self) -> int:
        """Parameters of the blocked layers."""
        return sum(self.widths[i] * self.widths[i + 1] + self.widths[i + 1] for i in self.blocked)


def _grid(n: int) -> list[int]:
    """1..n when small; else powers of two, their halves between, and n."""
    if n <= 16:
        return list(range(1, n + 1))
    out = {1, n}
    k = 1
    while k <= n:
        out.update({k, k + k // 2})
        k *= 2
    return sorted(x for x in out if 1 <= x <= n)


def _thread_options(sc: "SparkCosts", threads: Sequence[int] | None) -> list[int]:
    if threads is not None:
        bad = [t for t in threads if isinstance(t, bool) or not isinstance(t, int)
               or not 1 <= t <= sc.cores_per_host]
        if bad or not threads:
            raise ValueError(f"threads must be BLAS thread counts in [1, {sc.cores_per_host}], got "
                             f"{threads!r}")
        return sorted(set(threads))
    return sorted({t for t in (1, 2, 4, 8, 16, 32, 64)
                   if t <= sc.cores_per_host} | {sc.cores_per_host})


def _taus(samples: int, partitions: int, batch_size: int, taus: Sequence[int] | None) -> list[int]:
    if taus is not None:
        return list(taus)  # checked by plan_from_costs
    steps = max(1, math.ceil(math.ceil(samples / partitions) / batch_size))
    out = {steps, 2 * steps, 4 * steps}
    k = 1
    while k < steps:
        out.add(k)
        k *= 2
    return sorted(out)


def enumerate_candidates(modes: Sequence[str], sc: "SparkCosts", samples: int, batch_size: int, *,
                         max_partitions: int | None = None, taus: Sequence[int] | None = None,
                         threads: Sequence[int] | None = None,
                         layout: DenseLayout | None = None) -> Iterator[tuple[str, dict]]:
    """Every ``(mode, settings)`` worth predicting on the cluster ``sc``: partitions (and
    tau) for the data-parallel modes, ``K``/pairing and ``D x K`` for the blocked ones,
    each with the BLAS threads per task that fit the cores."""
    for t in _thread_options(sc, threads):
        slots = sc.hosts * (sc.cores_per_host // t)
        top = slots if max_partitions is None else min(slots, max_partitions)
        for P in _grid(top):
            if "gradient" in modes:
                yield "gradient", {"partitions": P, "threads": t}
            for mode in ("average", "async"):
                if mode in modes:
                    for tau in _taus(samples, P, batch_size, taus):
                        yield mode, {"partitions": P, "tau": tau, "threads": t}
        if layout is None:
            continue
        lay = {"layer_sizes": list(layout.widths), "blocked": list(layout.blocked)}
        pairs = (False, True) if layout.pairable else (False,)
        for K in _grid(min(top, layout.max_blocks)):
            for paired in pairs:
                if "model_parallel" in modes:
                    yield "model_parallel", {"blocks": K, "paired": paired, "threads": t, **lay}
                if "hybrid" in modes and K >= 2:
                    for D in _grid(top // K)[1:]:
                        yield "hybrid", {"blocks": K, "paired": paired, "replicas": D, "threads": t,
                                         **lay}


# ------------------------------------------------------------------ planning
def _check_modes(modes: Sequence[str] | None, layout: DenseLayout | None, slots: int,
                 why_not_blocked: str) -> list[str]:
    """The modes to consider (``None``: every one that applies), checked."""
    if modes is None:
        blocked = (["model_parallel"] + (["hybrid"] if slots >= 4
                                         else [])) if layout is not None else []
        return list(_DATA_PARALLEL) + blocked
    if isinstance(modes, str) or not modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(map(repr, MODES))}, got "
                         f"{modes!r}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {bad!r}: modes must be among "
                         f"{', '.join(map(repr, MODES))}")
    if layout is None and any(m in ("model_parallel", "hybrid") for m in modes):
        raise ValueError(f"modes {list(modes)!r}: model parallelism does not apply to this model: "
                         f"{why_not_blocked}")
    if "hybrid" in modes and slots < 4:
        raise ValueError("mode 'hybrid' needs at least 4 task slots (D >= 2 x K >= 2), the "
                         f"cluster has {slots}")
    return list(modes)


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
    wanted = _check_modes(modes, layout, slots, why_not_blocked)
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


def dense_layout(model: "Sequential", input_shape: Sequence[int] | None = None,
                 min_params: int = MIN_BLOCKED_PARAMS) -> tuple[DenseLayout | None, str]:
    """The :class:`DenseLayout` of an all-dense model (its layers with at least
    ``min_params`` parameters and an elementwise activation blocked), or ``None`` and why not."""
    from sparknet.cluster.model_parallel.block_partition import ELEMENTWISE
    from sparknet.layers.core import Dense

    shape = tuple(model.input_shape or input_shape or ())
    if not shape:
        return None, "its input shape is unknown"
    widths = [int(shape[-1])]
    for i, layer in enumerate(model.layers):
        if type(layer) is not Dense:
            return None, (f"layer {i} is {type(layer).__name__}; the cost model blocks all-dense "
                          "models only")
        widths.append(int(layer.units))
    last = len(model.layers) - 1
    acts = [getattr(layer, "activation", "identity") for layer in model.layers]
    blocked = tuple(i for i, act in enumerate(acts) if widths[i] * widths[i + 1] >= min_params
                    and (act in ELEMENTWISE or (i == last and act == "softmax")))
    if not blocked:
        return None, f"no dense layer has {min_params:,} parameters or more (the largest: " \
                     f"{max(a * b for a, b in zip(widths, widths[1:])):,})"
    return DenseLayout(tuple(widths), blocked), ""


def measured_costs(model: "Sequential", spark: Any, batch_size: int,
                   input_shape: Sequence[int] | None = None) -> tuple["SparkCosts", "NetworkCosts"]:
    """The session's :class:`~sparknet.cluster.planning.cost.SparkCosts` (measured once per
    application) and the model's :class:`~sparknet.cluster.planning.cost.NetworkCosts` at
    ``batch_size`` (timed on a copy, once per architecture; from FLOPs past
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
    from sparknet.cluster.planning.probes import gemm_gflops

    w = layout.widths
    flops = sum(2.0 * a * b * (3.0 if i else 2.0) for i, (a, b) in enumerate(zip(w, w[1:])))
    n = sum(a * b + b for a, b in zip(w, w[1:]))
    g = gemm_gflops()
    return cost.NetworkCosts(sample_s=flops / (g * 1e9 * efficiency),
                             eval_sample_s=flops / 3 / (g * 1e9 * efficiency),
                             param_bytes=4 * n, activation_bytes=[4 * b for b in w[1:]],
                             flops_per_sample=flops, gemm_gflops=g, batch_size=int(batch_size),
                             update_s=16.0 * n / 8e9, n_params=n)


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
    :data:`MIN_BLOCKED_PARAMS`), ``replicas`` replicas."""
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

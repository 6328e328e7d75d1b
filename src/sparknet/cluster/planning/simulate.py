"""Training on a cluster we do not have, simulated from costs measured on this one.

The inputs are the cost model's (:mod:`sparknet.cluster.planning.cost_inputs`): a
:class:`~sparknet.cluster.planning.cost_inputs.NetworkCosts` (seconds per sample on one core,
parameter and activation bytes, FLOPs, the one-thread GEMM rate) and a
:class:`~sparknet.cluster.planning.cost_inputs.SparkCosts` whose per-job, per-task and per-MiB
costs were measured on a live session and whose cluster -- ``hosts``, ``cores_per_host``,
``bandwidth_bytes_s`` and ``latency_s`` between hosts -- is given
(:meth:`SparkCosts.assumed <sparknet.cluster.planning.cost_inputs.SparkCosts.assumed>`).  The
terms of a round (job, tasks, broadcast, results, the driver's update, the bytes between hosts,
the compute of ``T`` BLAS threads) are the cost model's (:mod:`sparknet.cluster.planning.cost`),
one place for each; what the simulation adds is what a closed form cannot say:

How it works
------------
* **Placement.** ``P`` tasks of ``T`` BLAS threads each spread over the hosts round robin
  (Spark's standalone default, ``spreadOut``): ``min(hosts, P)`` hosts take part, and
  ``P * T`` may not exceed ``hosts * cores_per_host`` (no second wave on a cluster).
* **Stragglers.** Every round each task draws a relative speed from :class:`Stragglers`
  (1.0 nominal) and the round is the cost model's round at those speeds: a synchronous
  round (and a model-parallel job) waits for its slowest task.  The prediction is the mean
  over :data:`ROUNDS` drawn rounds; ``stragglers`` in its breakdown is what the slowest
  task costs beyond nominal.
* **Asynchronous rounds** are an event simulation: each partition computes its round at
  a speed drawn anew each round, then queues its delta at the driver, which receives it,
  applies it and broadcasts the new parameters one delta at a time.  That serial work
  (``task_s`` plus the per-MiB costs of the delta in, its apply and the parameters out,
  and between hosts both over the driver's link) caps the deltas per second however many
  partitions run; a straggler only does less of the epoch's work.

Example::

    from sparknet.cluster.planning.cost import SparkCosts, NetworkCosts
    from sparknet.cluster.planning.simulate import Stragglers, simulate
    here = SparkCosts.measure(spark)
    paper = SparkCosts.assumed(hosts=5, cores_per_host=18, bandwidth_gbit=1.0, like=here)
    p = simulate("average", NetworkCosts.measure(model, 128), paper, 5_000_000, partitions=88,
                 tau=64, stragglers=Stragglers(sigma=0.1))
    p.speedup, p.breakdown
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet.cluster.planning import cost

if TYPE_CHECKING:
    from sparknet.cluster.planning.cost import NetworkCosts, Prediction, SparkCosts

#: drawn rounds per synchronous simulation (task speeds drawn anew for each)
ROUNDS = 64


@dataclass(frozen=True)
class Stragglers:
    """A distribution of task speeds (1.0 = nominal).

    Each task of each round runs at ``exp(N(0, sigma))`` times the nominal speed, and a
    ``fraction`` of them (drawn at random) a further ``slowdown`` times slower: a noisy
    neighbour, a slow disk, a host with an older CPU.

    Raises:
        ValueError: ``sigma < 0``, ``fraction`` outside [0, 1] or ``slowdown < 1``.
    """

    sigma: float = 0.0
    fraction: float = 0.0
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.sigma >= 0.0:
            raise ValueError(f"Stragglers sigma must be >= 0, got {self.sigma!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"Stragglers fraction must be in [0, 1], got {self.fraction!r}")
        if not self.slowdown >= 1.0:
            raise ValueError("Stragglers slowdown must be >= 1 (times slower), got "
                             f"{self.slowdown!r}")

    @property
    def none(self) -> bool:
        """Every task runs at nominal speed."""
        return self.sigma == 0.0 and (self.fraction == 0.0 or self.slowdown == 1.0)

    def speeds(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Relative speeds of ``n`` tasks."""
        s = np.exp(rng.normal(0.0, self.sigma, n)) if self.sigma > 0 else np.ones(n)
        if self.fraction > 0 and self.slowdown > 1:
            s = np.where(rng.random(n) < self.fraction, s / self.slowdown, s)
        return s

    def describe(self) -> str:
        """A short text (printed beside the figures made with it)."""
        if self.none:
            return "no stragglers"
        out = f"speeds lognormal(sigma={self.sigma:g})" if self.sigma > 0 else "nominal speeds"
        if self.fraction > 0 and self.slowdown > 1:
            out += f", {100 * self.fraction:g}% of tasks {self.slowdown:g}x slower"
        return out


NO_STRAGGLERS = Stragglers()


def hosts_used(spark: "SparkCosts", tasks: int, threads: int = 1) -> int:
    """Hosts that ``tasks`` tasks of ``threads`` BLAS threads occupy (spread round robin).

    Raises:
        ValueError: a count below 1, or the tasks need more cores than the cluster has.
    """
    for name, v in (("tasks", tasks), ("threads", threads)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    per_host = spark.cores_per_host // int(threads)
    if per_host < 1 or tasks > spark.hosts * per_host:
        raise ValueError(f"{tasks} tasks of {threads} BLAS threads need {tasks * threads} cores "
                         f"({threads} per task on one host); the cluster has {spark.hosts} host(s) "
                         f"x {spark.cores_per_host} cores")
    return min(spark.hosts, int(tasks))


def slowest(stragglers: Stragglers, tasks: int, rounds: int = ROUNDS, seed: int = 0) -> float:
    """Mean over ``rounds`` drawn rounds of ``1 / (the slowest of the tasks' speeds)``: the
    factor by which a synchronous round's compute exceeds nominal."""
    if stragglers.none:
        return 1.0
    rng = np.random.default_rng(seed)
    return float(np.mean([1.0 / stragglers.speeds(rng, tasks).min() for _ in range(rounds)]))


def _costs(spark: "SparkCosts", tasks: int, threads: int) -> tuple["SparkCosts", int]:
    """The cluster's costs with ``threads`` BLAS threads per task, and the hosts used."""
    h = hosts_used(spark, tasks, threads)
    return dataclasses.replace(spark, blas_threads=int(threads)), h


def _mean_of(mode: str, make: Any, partitions: int, stragglers: Stragglers, seed: int,
             extra: dict[str, Any]) -> "Prediction":
    """The cost model's prediction ``make(speeds)`` averaged over drawn rounds (one
    prediction when there are no stragglers)."""
    if stragglers.none:
        preds = [make(None)]
    else:
        rng = np.random.default_rng(seed)
        preds = [make(list(stragglers.speeds(rng, partitions))) for _ in range(ROUNDS)]
    first = preds[0]
    n = float(len(preds))
    breakdown = {k: sum(p.breakdown.get(k, 0.0) for p in preds) / n for k in first.breakdown}
    settings = {k: v for k, v in first.settings.items() if k != "speeds"}
    settings.update(extra, stragglers=stragglers.describe())
    step = None if first.step_s is None else sum(p.step_s or 0.0 for p in preds) / n
    return cost.Prediction(mode, settings, sum(p.round_s for p in preds) / n,
                           sum(p.epoch_s for p in preds) / n,
                           step, breakdown, first.one_process_epoch_s)


# ------------------------------------------------------------------ the modes
def simulate_sync_gradient(net: "NetworkCosts", spark: "SparkCosts", samples: int, partitions: int,
                           threads: int = 1, stragglers: Stragglers = NO_STRAGGLERS,
                           seed: int = 0) -> "Prediction":
    """``sync="gradient"``: one round per global minibatch, each partition computing the
    gradient of its slice; every round waits for its slowest task."""
    sc, h = _costs(spark, partitions, threads)
    return _mean_of("gradient", lambda sp: cost.predict_sync_gradient(net, sc, samples, partitions,
                                                                      speeds=sp),
                    partitions, stragglers, seed, {"hosts": h})


def simulate_sync_average(net: "NetworkCosts", spark: "SparkCosts", samples: int, partitions: int,
                          tau: int, threads: int = 1, stragglers: Stragglers = NO_STRAGGLERS,
                          seed: int = 0) -> "Prediction":
    """``sync="average"``: rounds of ``tau`` local steps on every partition, then the mean
    delta; every round waits for its slowest task."""
    sc, h = _costs(spark, partitions, threads)
    return _mean_of("average",
                    lambda sp: cost.predict_sync_average(net, sc, samples, partitions, tau,
                                                         speeds=sp),
                    partitions, stragglers, seed, {"hosts": h})


def _async_terms(net: "NetworkCosts", sc: "SparkCosts", samples: int, partitions: int,
                 tau: int) -> tuple[float, float, float, float]:
    """``(rows per round, compute seconds of a round at nominal speed, launch seconds, the
    driver's serial seconds per delta)``, with the cost model's terms (the rounds cut as
    :func:`~sparknet.cluster.planning.cost.predict_async` cuts them)."""
    n_p = math.ceil(samples / partitions)
    rows = n_p / max(1, math.ceil(max(1, math.ceil(n_p / net.batch_size)) / int(tau)))
    work = net.local_steps_s(rows) / (sc.task_speed * sc.thread_speedup)
    mib = net.param_mib
    delta = (sc.driver_delta_s_per_mib if sc.driver_delta_s_per_mib is not None
             else sc.driver_update_s_per_mib)
    serve = sc.task_s + mib * (delta + sc.broadcast_s_per_mib + sc.result_s_per_mib)
    launch = sc.single_job_s if sc.single_job_s is not None else sc.job_s
    # the delta in and the parameters out on the driver's link
    if sc.hosts > 1 and not sc.network_measured:
        serve += 2 * net.param_bytes / sc.bandwidth_bytes_s
        launch += 2 * sc.latency_s
    return rows, work, launch, serve


def simulate_async(net: "NetworkCosts", spark: "SparkCosts", samples: int, partitions: int,
                   tau: int, threads: int = 1, stragglers: Stragglers = NO_STRAGGLERS,
                   seed: int = 0) -> "Prediction":
    """Asynchronous rounds, as an event simulation of one epoch (a budget of ``samples``
    rows): each partition's round at a freshly drawn speed, then its delta queued at the
    driver and served one at a time, then the partition's relaunch.  A round is at most one
    pass over the partition's shard, as the trainer cuts them."""
    sc, h = _costs(spark, partitions, threads)
    rows, work, launch, serve = _async_terms(net, sc, samples, partitions, tau)
    rng = np.random.default_rng(seed)
    events = [(launch + work / s, p, work / s)
              for p, s in enumerate(stragglers.speeds(rng, partitions))]
    heapq.heapify(events)
    driver_free, done, deltas, computed = 0.0, 0.0, 0, 0.0
    while done < samples - 1e-9:
        t, p, took = heapq.heappop(events)
        driver_free = max(t, driver_free) + serve
        done += rows
        deltas += 1
        computed += took
        took = work / float(stragglers.speeds(rng, 1)[0])
        heapq.heappush(events, (driver_free + launch + took, p, took))
    epoch = driver_free
    per = deltas / partitions  # rounds per partition, on average
    breakdown = {"compute": work * per, "job": launch * per,
                 "stragglers": max((computed - work * deltas) / partitions, 0.0)}
    breakdown["driver"] = max(epoch - sum(breakdown.values()), 0.0)  # queueing and serial service
    scale = epoch / sum(breakdown.values())
    breakdown = {k: v * scale for k, v in breakdown.items()}
    settings = {"partitions": partitions, "tau": int(tau), "threads": int(threads), "hosts": h,
                "batch_size": net.batch_size, "stragglers": stragglers.describe(),
                "driver_busy": deltas * serve / epoch}
    return cost.Prediction("async", settings, launch + work + serve, epoch, None, breakdown,
                           net.one_process_epoch_s(samples))


def simulate_model_parallel(net: "NetworkCosts", spark: "SparkCosts", samples: int, blocks: int,
                            paired: bool = False, replicas: int = 1, threads: int = 1,
                            stragglers: Stragglers = NO_STRAGGLERS, seed: int = 0,
                            **layout: Any) -> "Prediction":
    """Model-parallel (``replicas=1``) or hybrid ``D x K`` steps: the cost model's step
    (:func:`~sparknet.cluster.planning.cost.predict_model_parallel`; ``layout`` holds its
    ``layer_sizes``, ``blocked``, ``lookahead``...) with every job waiting for the slowest
    of its ``K * D`` slots."""
    sc, h = _costs(spark, int(blocks) * int(replicas), threads)
    p = cost.predict_model_parallel(net, sc, samples, blocks, paired=paired, replicas=replicas,
                                    **layout)
    slow = slowest(stragglers, int(blocks) * int(replicas), ROUNDS, seed)
    extra = p.breakdown.get("compute", 0.0) * (slow - 1.0)
    breakdown = dict(p.breakdown, stragglers=extra)
    steps = p.epoch_s / p.round_s if p.round_s > 0 else 1.0
    settings = dict(p.settings, threads=int(threads), hosts=h, stragglers=stragglers.describe())
    return cost.Prediction(p.mode, settings, p.round_s + extra / steps, p.epoch_s + extra,
                           (p.step_s or p.round_s) + extra / steps, breakdown,
                           p.one_process_epoch_s)


_SIMULATORS = {"gradient": simulate_sync_gradient, "average": simulate_sync_average,
               "async": simulate_async, "model_parallel": simulate_model_parallel,
               "hybrid": simulate_model_parallel}


def simulate(mode: str, net: "NetworkCosts", spark: "SparkCosts", samples: int,
             **settings: Any) -> "Prediction":
    """Simulate ``mode`` (``"gradient"``, ``"average"``, ``"async"``, ``"model_parallel"``,
    ``"hybrid"``) with its settings: ``partitions`` (and ``tau``) for the data-parallel
    modes; ``blocks``/``K``, ``paired``, ``replicas``/``D``, ``layer_sizes`` (and the cost
    model's other layout arguments) for the blocked ones; ``threads``, ``stragglers`` and
    ``seed`` for all.

    Raises:
        ValueError: an unknown mode, settings the mode does not take, or a cluster too
            small for them.
    """
    if mode not in _SIMULATORS:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _SIMULATORS))}, got {mode!r}")
    kw = dict(settings)
    if "K" in kw:
        kw["blocks"] = kw.pop("K")
    if "D" in kw:
        kw["replicas"] = kw.pop("D")
    if mode == "model_parallel" and int(kw.get("replicas", 1)) != 1:
        raise ValueError("mode='model_parallel' has one replica; use mode='hybrid' for "
                         f"D={kw['replicas']}")
    if mode == "hybrid" and int(kw.get("replicas", 1)) < 2:
        raise ValueError(f"mode='hybrid' needs replicas (D) >= 2, got {kw.get('replicas', 1)!r}")
    try:
        # one signature per mode
        return _SIMULATORS[mode](net, spark, samples, **kw)  # type: ignore[operator]
    except TypeError as exc:
        raise ValueError(f"simulate({mode!r}): {exc}") from exc

"""Cost models of every training mode, fed by measured (or given) costs
(:mod:`~sparknet.cluster.planning.cost_inputs`).

The paper models ``K`` rounds as ``T = K [T_lat + N T_data]``.  Here the fixed term is what
Spark pays per round and the data term compute and bytes, for each mode as the code runs it
(:class:`~sparknet.cluster.planning.cost_inputs.SparkCosts`,
:class:`~sparknet.cluster.planning.cost_inputs.NetworkCosts`; ``M`` parameter MiB, ``b`` batch,
``P`` partitions, ``c`` task slots, ``t(r)`` a forward+backward of ``r`` rows on one core, ``u``
an optimizer step, ``s`` the task speed under contention, ``w = ceil(P / c)`` waves):
``job(P) = job_s + task_s max(0, P - probe_tasks)``; ``bytes(M, P) = M broadcast_s_per_mib
+ P_d M result_s_per_mib``, ``P_d`` results reaching the driver (fewer than ``P`` once
``treeAggregate`` adds a shuffle level, :func:`tree_levels`); ``net``: ``M / bw`` out and
``P_d M / bw`` in between hosts, zero when the per-MiB figures crossed the same links.

**sync gradient** (one job per global step, :mod:`~sparknet.cluster.data_parallel.fit_context`)::

    T_round = job(P) + bytes(M, P) + net + M driver_update_s_per_mib + w t(b / P) / s
    T_epoch = ceil(N / b) T_round

**sync average** (``tau`` local steps per partition, deltas back, one update)::

    R = ceil(ceil(N / P b) / tau)           rounds per epoch (1/m for rounds of m epochs)
    T_round = job(P) + bytes(M, P) + net + M driver_delta_s_per_mib
              + w [N / (P R) rows in steps of t(b) + u] / (s min speed)
    T_epoch = R T_round

**async** (single-task jobs per partition, :mod:`~sparknet.cluster.data_parallel.async_mode`)::

    T_p = single_job_s + M (broadcast + result + delta) + net + compute_p / (s speed_p)
    T_epoch = max(N / sum_p (rows / T_p), (N / rows) M (delta + broadcast + result),
                  [shared cores] (N / rows) (compute + single_job_s) / c) + (max T_p - min T_p) / 2

(the driver applies, re-broadcasts and receives every delta serially; on the executors'
own cores a job's fixed cost is CPU taken from compute; the epoch waits for the rounds in
flight).

**model parallel** (per step, ``K`` blocks of each blocked layer, ``S`` blocked stages, a
pair of layers one stage, :mod:`~sparknet.cluster.model_parallel`)::

    jobs = 2 S (- 1 with lookahead when the net starts blocked)
    T_step = sum_jobs [job(K) + bc_j broadcast + res_j result + net] + F_blocked b / (K s r)
             + driver layers + u_blocked / K

``bc_j``/``res_j``: the activation MiB a job moves (a block returns its ``1/K`` of the
output, a pair's block a full-width partial sum: a pair halves the round trips, not every
byte); ``F`` training flops per sample, ``r`` the net's measured flop rate.  With ``D``
replicas (hybrid) a slot computes ``b / D`` rows and each stage's gradients (``L_s`` MiB)
cross the driver, ``D L_s`` in and ``L_s`` out, in ``ceil(D L_s / combine)`` more jobs.
The paper's ``T = K [T_lat + N T_data]`` is sync average with ``K`` equal rounds:
``T_lat = job + M (broadcast + result + driver_delta)``, ``N T_data = tau (t(b) + u)``.

:class:`RoundCostModel` is the trainers' own round model (used to size tau, see
:mod:`~sparknet.cluster.planning.rounds`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from sparknet.cluster.planning.cost_inputs import (  # noqa: F401 - REFERENCE: re-exported
    MIB,
    REFERENCE,
    NetworkCosts,
    SparkCosts,
)
from sparknet.cluster.planning.probes import dense_flops, dense_stages, tree_levels
from sparknet.cluster.planning.rounds import RoundCostModel, size_rounds  # noqa: F401 - re-exported


@dataclass
class Prediction:
    """A mode's predicted times.

    Attributes:
        mode: ``"gradient"``, ``"average"``, ``"async"``, ``"model_parallel"`` or ``"hybrid"``.
        settings: partitions, tau, threads, K, paired, D... the prediction is for.
        round_s: seconds of one round (a model-parallel step).
        epoch_s: seconds of one pass over ``samples``.
        step_s: seconds per optimizer step (``None`` where steps are not synchronous).
        breakdown: where ``epoch_s`` goes, seconds per epoch (adds up to it).
        one_process_epoch_s: the same epoch in one process on one core.
    """

    mode: str
    settings: dict[str, Any]
    round_s: float
    epoch_s: float
    step_s: float | None
    breakdown: dict[str, float]
    one_process_epoch_s: float

    @property
    def speedup(self) -> float:
        """One process's epoch over this mode's."""
        return self.one_process_epoch_s / self.epoch_s if self.epoch_s > 0 else math.inf

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        parts = ", ".join(f"{k} {v:.3g}" for k, v in self.breakdown.items() if v > 0)
        step = "" if self.step_s is None else f", step {1e3 * self.step_s:.1f} ms"
        return (f"{self.mode} ({opts}): epoch {self.epoch_s:.3g} s, "
                f"round {1e3 * self.round_s:.1f} ms{step}, "
                f"speedup {self.speedup:.2f}x over one process ({self.one_process_epoch_s:.3g} s); "
                f"per epoch: {parts}")


def _net_s(sc: SparkCosts, mib_out: float, mib_in: float) -> float:
    """Seconds on the links between hosts (0 when measured, or on one host)."""
    if sc.network_measured or sc.hosts <= 1:
        return 0.0
    return 2 * sc.latency_s + (mib_out + mib_in) * MIB / sc.bandwidth_bytes_s


def _round_comm(sc: SparkCosts, mib: float, partitions: int) -> dict[str, float]:
    """Seconds of one synchronous round's job, broadcast, results and network."""
    to_driver, levels = tree_levels(partitions)
    shuffle = 0.0
    if levels:  # each shuffle level: a stage, every reducer receiving P / P_d vectors
        fan = partitions / to_driver
        shuffle = levels * (0.5 * sc.job_s + fan * mib * sc.result_s_per_mib)
    shuffled = _net_s(sc, 0, levels * partitions / to_driver * mib)
    return {"job": sc.job_s, "tasks": sc.job(partitions) - sc.job_s,
            "broadcast": mib * sc.broadcast_s_per_mib,
            "results": to_driver * mib * sc.result_s_per_mib + shuffle,
            "network": _net_s(sc, mib, to_driver * mib) + max(0.0, shuffled - 2 * sc.latency_s)}


def _speeds(speeds: Sequence[float] | None, partitions: int) -> list[float]:
    out = [1.0] * partitions if speeds is None else [float(s) for s in speeds]
    if len(out) != partitions or not all(0 < s < math.inf for s in out):
        raise ValueError(f"speeds must hold {partitions} positive numbers (one per partition), "
                         f"got {speeds!r}")
    return out


def _check(samples: int, partitions: int, tau: int = 1) -> None:
    for name, v in (("samples", samples), ("partitions", partitions), ("tau", tau)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")


def _speed(sc: SparkCosts, net: NetworkCosts) -> float:
    """A task's compute speed relative to the network's figures."""
    return (1.0 if net.in_tasks else sc.task_speed) * sc.thread_speedup


def _per_epoch(per_round: dict[str, float], rounds: float) -> dict[str, float]:
    return {k: v * rounds for k, v in per_round.items()}


def _rounds_of(net: NetworkCosts, samples: int, partitions: int, tau: int,
               max_epochs_per_round: int = 4) -> tuple[float, float]:
    """``(rounds per epoch, rows per partition and round)`` as the trainer sizes them with a
    given ``local_steps`` (:func:`~sparknet.cluster.planning.rounds.size_rounds`)."""
    n_p = math.ceil(samples / partitions)
    size = size_rounds(max(1, math.ceil(n_p / net.batch_size)), int(tau), sized=False,
                       max_epochs_per_round=max_epochs_per_round)
    if size.rounds == 1:
        return 1.0 / size.epochs_per_round, float(n_p * size.epochs_per_round)
    return float(size.rounds), n_p / size.rounds


# --------------------------------------------------------------------- data parallel
def predict_sync_gradient(net: NetworkCosts, spark_costs: SparkCosts, samples: int, partitions: int,
                          speeds: Sequence[float] | None = None) -> Prediction:
    """``sync="gradient"``: one job per global minibatch of ``batch_size`` rows."""
    _check(samples, partitions)
    sc, P = spark_costs, int(partitions)
    sp = _speeds(speeds, P)
    rounds = math.ceil(samples / net.batch_size)
    waves = math.ceil(P / sc.slots)
    rows = net.batch_size / P
    nominal = waves * net.compute_s(rows) / _speed(sc, net)
    slowest = nominal / min(sp)
    per = _round_comm(sc, net.param_mib, P)
    per.update(compute=nominal, stragglers=slowest - nominal,
               driver=net.param_mib * sc.driver_update_s_per_mib)
    round_s = sum(per.values())
    settings = {"partitions": P, "threads": sc.blas_threads, "batch_size": net.batch_size}
    return Prediction("gradient", settings, round_s, round_s * rounds, round_s,
                      _per_epoch(per, rounds), net.one_process_epoch_s(samples))


def predict_sync_average(net: NetworkCosts, spark_costs: SparkCosts, samples: int,
                         partitions: int, tau: int, speeds: Sequence[float] | None = None,
                         max_epochs_per_round: int = 4) -> Prediction:
    """``sync="average"``: rounds of ``tau`` local steps on every partition, the deltas
    averaged by the driver."""
    _check(samples, partitions, tau)
    sc, P = spark_costs, int(partitions)
    sp = _speeds(speeds, P)
    rounds, rows = _rounds_of(net, samples, P, int(tau), max_epochs_per_round)
    waves = math.ceil(P / sc.slots)
    nominal = waves * net.local_steps_s(rows) / _speed(sc, net)
    slowest = nominal / min(sp)
    per = _round_comm(sc, net.param_mib, P)
    per.update(compute=nominal, stragglers=slowest - nominal,
               driver=net.param_mib * sc.delta_s_per_mib)
    round_s = sum(per.values())
    return Prediction("average", {"partitions": P, "tau": int(tau), "threads": sc.blas_threads,
                                  "batch_size": net.batch_size, "rounds_per_epoch": rounds},
                      round_s, round_s * rounds, None, _per_epoch(per, rounds),
                      net.one_process_epoch_s(samples))


def predict_async(net: NetworkCosts, spark_costs: SparkCosts, samples: int, partitions: int,
                  tau: int, speeds: Sequence[float] | None = None) -> Prediction:
    """``mode="async"``: every partition runs its own single-task jobs; the driver applies
    each delta as it arrives.  ``speeds``: relative speed per partition (1.0 nominal)."""
    _check(samples, partitions, tau)
    sc, P = spark_costs, int(partitions)
    sp = _speeds(speeds, P)
    n_p = math.ceil(samples / P)
    steps_epoch = max(1, math.ceil(n_p / net.batch_size))
    rounds = max(1, math.ceil(steps_epoch / int(tau)))
    rows = n_p / rounds
    mib = net.param_mib
    delta = sc.delta_s_per_mib
    single = sc.single_job_s if sc.single_job_s is not None else sc.job_s
    share = max(1.0, P / sc.slots)      # partitions beyond the slots share them
    base = net.local_steps_s(rows) * share / _speed(sc, net)
    comm = {"job": single, "broadcast": mib * sc.broadcast_s_per_mib,
            "results": mib * sc.result_s_per_mib, "driver": mib * delta,
            "network": _net_s(sc, mib, mib)}
    fixed = sum(comm.values())
    T = [fixed + base / s for s in sp]
    X = sum(rows / t for t in T)                       # rows per second, all partitions busy
    updates = samples / rows
    driver_serial = updates * mib * (delta + sc.broadcast_s_per_mib + sc.result_s_per_mib)
    busy = samples / X
    cpu = 0.0
    # shared cores: the jobs' fixed cost is CPU on the tasks' cores, it does not overlap compute
    if sc.shared_cores:
        w = [1.0 / t for t in T]
        per_round = sum(wi * (base / share) / s for wi, s in zip(w, sp)) / sum(w)
        cpu = updates * (per_round + single) / min(sc.slots, P)
    tail = 0.5 * (max(T) - min(T))
    epoch = max(busy, driver_serial, cpu) + tail
    # per epoch, one partition's share of the rounds; contention: the driver's or the cores' bound
    bd = {k: v * updates / P for k, v in {**comm, "compute": base}.items()}
    bd["stragglers"] = tail + max(busy - sum(bd.values()), 0.0)
    bd["contention"] = max(epoch - sum(bd.values()), 0.0)
    bd = {k: v * epoch / sum(bd.values()) for k, v in bd.items()}
    return Prediction("async", {"partitions": P, "tau": int(tau), "threads": sc.blas_threads,
                                "batch_size": net.batch_size, "speeds": list(sp)},
                      float(sum(T) / P), epoch, None, bd, net.one_process_epoch_s(samples))


def predict_model_parallel(net: NetworkCosts, spark_costs: SparkCosts, samples: int, blocks: int,
                           paired: bool = False, replicas: int = 1, layer_sizes: Sequence[int] = (),
                           blocked: Sequence[int] | None = None, lookahead: bool = True,
                           combine_bytes: int = 32 << 20, itemsize: int = 4) -> Prediction:
    """Model parallelism: ``blocks`` (K) blocks of every blocked dense layer, paired or not,
    ``replicas`` (D) data-parallel copies (hybrid).

    Args:
        net: the whole network's costs in one process (its ``sample_s`` and
            ``flops_per_sample`` give the flop rate the blocks compute at).
        layer_sizes: the dense widths, input first: ``[in, h1, ..., out]``.
        blocked: indices of the blocked layers (default: all but the last).
        lookahead: the first stage's forward of the next batch rides in its backward job.
        combine_bytes: bytes of partial gradients per piece of the replicas' combine.
    """
    K, D = int(blocks), int(replicas)
    if K < 1 or D < 1:
        raise ValueError(f"blocks and replicas must be >= 1, got {blocks!r}, {replicas!r}")
    sizes = [int(s) for s in layer_sizes]
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"layer_sizes must be the dense widths [in, ..., out], "
                         f"got {layer_sizes!r}")
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    n_layers = len(sizes) - 1
    blocked = list(range(n_layers - 1)) if blocked is None else [int(i) for i in blocked]
    if any(not 0 <= i < n_layers for i in blocked):
        raise ValueError(f"blocked layer indices must be in [0, {n_layers}), got {blocked!r}")
    sc, b = spark_costs, net.batch_size
    stages = dense_stages(blocked, paired)
    flops_all = sum(dense_flops(sizes[i], sizes[i + 1], i > 0) for i in range(n_layers))
    rate = (net.flops_per_sample or flops_all) / net.sample_s    # flop/s of this net on one core
    params = [sizes[i] * sizes[i + 1] + sizes[i + 1] for i in range(n_layers)]
    upd_per_param = net.update_s / max(net.n_params or sum(params), 1)
    mib = float(itemsize) / MIB
    slots = K * D
    share = max(1.0, slots / sc.slots) / _speed(sc, net)
    bd = dict.fromkeys(("job", "tasks", "broadcast", "results", "network", "compute", "driver",
                        "combine"), 0.0)
    jobs = 0

    def job(bc_mib: float, res_mib: float) -> None:
        nonlocal jobs
        jobs += 1
        bd["job"] += sc.job_s
        bd["tasks"] += sc.job(slots) - sc.job_s
        bd["broadcast"] += bc_mib * sc.broadcast_s_per_mib
        bd["results"] += res_mib * sc.result_s_per_mib
        bd["network"] += _net_s(sc, bc_mib * min(sc.hosts, slots), res_mib)

    starts_blocked = bool(stages) and stages[0][0] == 0
    for j, st in enumerate(stages):
        a, z = st[0], st[-1]
        n_in, n_out = sizes[a], sizes[z + 1]
        part = K if len(st) == 2 else 1             # a pair's blocks return full-width partial sums
        need_dx = a > 0
        ahead = lookahead and j == 0 and starts_blocked
        if not ahead:
            job(b * n_in * mib, part * b * n_out * mib)             # forward
        # backward (+ the next batch's forward)
        job(b * n_out * mib + (b * n_in * mib if ahead else 0.0),
            (K * b * n_in * mib if need_dx else 0.0) + (part * b * n_out * mib if ahead else 0.0))
        f = sum(dense_flops(sizes[i], sizes[i + 1], i > 0) for i in st)
        upd_s = upd_per_param * sum(params[i] for i in st) / K
        bd["compute"] += (f * b / (K * D) / rate + upd_s) * share
        if D > 1:   # the partial gradients through the driver, in pieces
            L = sum(params[i] for i in st) * mib
            pieces = max(1, math.ceil(D * L * MIB / combine_bytes))
            for _ in range(pieces):
                job(L / pieces, D * L / pieces)
            bd["combine"] += D * L * sc.delta_s_per_mib
    if D > 1 and stages:
        jobs -= 1          # the last apply rides in the next job
        bd["job"] -= sc.job_s
    driver_layers = [i for i in range(n_layers) if i not in set(blocked)]
    driver_flops = sum(dense_flops(sizes[i], sizes[i + 1], i > 0) for i in driver_layers)
    bd["driver"] = driver_flops * b / rate + upd_per_param * sum(params[i] for i in driver_layers)
    step = sum(bd.values())
    steps = math.ceil(samples / b)
    one = net.one_process_epoch_s(samples)
    mode = "hybrid" if D > 1 else "model_parallel"
    settings = {"K": K, "paired": bool(paired), "D": D, "jobs_per_step": jobs, "batch_size": b,
                "lookahead": bool(lookahead)}
    return Prediction(mode, settings, step, step * steps, step, _per_epoch(bd, steps), one)


def predict(mode: str, net: NetworkCosts, spark_costs: SparkCosts, samples: int,
            **settings: Any) -> Prediction:
    """The prediction of ``mode`` (``"gradient"``, ``"average"``, ``"async"``,
    ``"model_parallel"``, ``"hybrid"``) with its settings as keyword arguments
    (``partitions``, ``tau``, ``speeds``; ``blocks``, ``paired``, ``replicas``, ``layer_sizes``)."""
    if mode == "gradient":
        return predict_sync_gradient(net, spark_costs, samples, **settings)
    if mode == "average":
        return predict_sync_average(net, spark_costs, samples, **settings)
    if mode == "async":
        return predict_async(net, spark_costs, samples, **settings)
    if mode in ("model_parallel", "hybrid"):
        if mode == "hybrid" and int(settings.get("replicas", 1)) < 2:
            raise ValueError(f"mode='hybrid' needs replicas >= 2, "
                             f"got {settings.get('replicas', 1)!r}")
        return predict_model_parallel(net, spark_costs, samples, **settings)
    raise ValueError("mode must be one of 'gradient', 'average', 'async', 'model_parallel', "
                     f"'hybrid'; got {mode!r}")

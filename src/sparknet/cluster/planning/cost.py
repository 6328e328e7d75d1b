"""Cost models of every training mode, fed by measured (or given) costs.

The paper models ``K`` rounds as ``T = K [T_lat + N T_data]``.  Here the fixed term is what
Spark pays per round and the data term compute and bytes, for each mode as the code runs it
(:class:`SparkCosts`, :class:`NetworkCosts`; ``M`` parameter MiB, ``b`` batch, ``P``
partitions, ``c`` task slots, ``t(r)`` a forward+backward of ``r`` rows on one core, ``u``
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
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from sparknet.cluster.planning import probes as probe
from sparknet.cluster.planning.probes import dense_flops, dense_stages, tree_levels
from sparknet.cluster.planning.rounds import RoundCostModel, size_rounds  # noqa: F401 - re-exported

MIB = float(1 << 20)


@dataclass
class SparkCosts:
    """What Spark and the cluster cost, measured on a live session or assumed.

    Attributes:
        job_s: fixed seconds of a round job over ``probe_tasks`` resident tasks (submit,
            schedule, run, ``treeAggregate`` back): its wall time less its slowest task's
            compute (an empty job's, when given by hand).
        task_s: extra seconds per task beyond the probe's (a later wave, or a larger job).
        broadcast_s_per_mib: seconds per MiB broadcast (made on the driver, read by the tasks).
        result_s_per_mib: seconds per MiB of task results reaching the driver (serial there).
        driver_update_s_per_mib: the driver's ``sync="gradient"`` step per MiB of parameters.
        hosts: hosts; cores_per_host: task slots per host.
        bandwidth_bytes_s: bytes/s between hosts (loopback when measured here).
        latency_s: one network round trip between hosts.
        blas_threads: BLAS threads per task (a task then takes that many cores).
        single_job_s: seconds of a one-task job (``mode="async"``); ``None``: ``job_s``.
        driver_delta_s_per_mib: the driver's apply of a delta (average, async); ``None``:
            ``driver_update_s_per_mib``.
        task_speed: compute speed of a task while every slot computes, relative to this
            process alone: below 1 with contention for cores, caches, memory bandwidth or a
            shared machine's scheduler share; above 1 where executors get a scheduler share of
            their own (a standalone cluster on a busy host); 1.0: none.
        probe_tasks: tasks of the probe job ``job_s`` was measured with.
        executors: executor processes.
        network_measured: the per-MiB figures were measured across the links the runs use
            (no separate network term); ``False`` for :meth:`assumed` clusters.
        thread_efficiency: speed-up per doubling of BLAS threads, as a fraction of 2x.
        shared_cores: the driver runs on the executors' cores (local mode, or executors on
            the driver's host): a job's fixed cost is CPU time taken from the tasks when
            jobs overlap compute (``mode="async"``).
        probe_s: seconds the probes took (0 when not measured).
        empty_job_s: seconds of an empty round job (``job_s`` is a working round's fixed
            cost, its wall time less its slowest task's compute, which is less: part of the
            per-task work overlaps the other tasks' compute).
    """

    job_s: float
    task_s: float
    broadcast_s_per_mib: float
    result_s_per_mib: float
    driver_update_s_per_mib: float
    hosts: int = 1
    cores_per_host: int = 1
    bandwidth_bytes_s: float = 1.25e8
    latency_s: float = 2e-4
    blas_threads: int = 1
    single_job_s: float | None = None
    driver_delta_s_per_mib: float | None = None
    task_speed: float = 1.0
    probe_tasks: int = 1
    executors: int = 1
    network_measured: bool = True
    thread_efficiency: float = 0.9
    shared_cores: bool = False
    probe_s: float = 0.0
    empty_job_s: float | None = None

    def __post_init__(self) -> None:
        seconds = ("job_s", "task_s", "broadcast_s_per_mib", "result_s_per_mib",
                   "driver_update_s_per_mib")
        bad = [n for n in seconds
               if not (isinstance(getattr(self, n), (int, float))
                       and 0 <= getattr(self, n) < math.inf)]
        bad += [n for n in ("hosts", "cores_per_host", "blas_threads", "probe_tasks")
                if int(getattr(self, n)) < 1]
        bad += [n for n, ok in (("bandwidth_bytes_s", self.bandwidth_bytes_s > 0),
                                ("task_speed", 0 < self.task_speed <= 1.5)) if not ok]
        if bad:
            raise ValueError("SparkCosts: " + ", ".join(f"{n}={getattr(self, n)!r}" for n in bad)
                             + " out of range (seconds >= 0, counts >= 1, bandwidth > 0, "
                             "task_speed in (0, 1.5])")

    @property
    def cores(self) -> int:
        """Cores of the cluster (hosts x cores per host)."""
        return self.hosts * self.cores_per_host

    @property
    def slots(self) -> int:  # tasks that run at once
        return max(1, self.cores // self.blas_threads)

    @property
    def thread_speedup(self) -> float:
        """How much faster one task computes with ``blas_threads`` threads than with one."""
        t = self.blas_threads
        return 1.0 if t <= 1 else t * self.thread_efficiency ** math.log2(t)

    @property
    def delta_s_per_mib(self) -> float:  # the driver's apply of a delta per MiB
        d = self.driver_delta_s_per_mib
        return self.driver_update_s_per_mib if d is None else d

    def job(self, tasks: int) -> float:
        """Seconds of an empty job of ``tasks`` tasks."""
        return self.job_s + self.task_s * max(0, int(tasks) - self.probe_tasks)

    @classmethod
    def measure(cls, spark: Any, repeats: int = 3) -> "SparkCosts":
        """Measure the live session with short probe jobs (a few seconds in all; see
        :mod:`sparknet.cluster.planning.probes`)."""
        got = probe.spark_probe(spark, repeats=repeats)
        return cls(**{k: v for k, v in got.items() if k in cls.__dataclass_fields__},
                   probe_tasks=int(got["hosts"] * got["cores_per_host"]), network_measured=True)

    @classmethod
    def assumed(cls, hosts: int, cores_per_host: int, bandwidth_gbit: float = 1.0,
                latency_ms: float = 0.2, like: "SparkCosts | None" = None) -> "SparkCosts":
        """A cluster we do not have: Spark's per-job, per-task and per-MiB costs from
        ``like`` (default: figures measured on this project's reference machine), the
        network given (``bandwidth_gbit`` Gbit/s, ``latency_ms``) and charged on top."""
        if int(hosts) < 1 or int(cores_per_host) < 1:
            raise ValueError(f"hosts and cores_per_host must be >= 1, "
                             f"got {hosts!r}, {cores_per_host!r}")
        if not bandwidth_gbit > 0:
            raise ValueError(f"bandwidth_gbit must be positive, got {bandwidth_gbit!r}")
        base = like if like is not None else REFERENCE
        return replace(base, hosts=int(hosts), cores_per_host=int(cores_per_host),
                       bandwidth_bytes_s=bandwidth_gbit * 1e9 / 8, latency_s=latency_ms / 1e3,
                       network_measured=False, executors=int(hosts), shared_cores=False)


#: Spark's costs on the project's reference machine (local[2], Unix socket to the Python
#: workers; see benchmarks/README.md): the default of :meth:`SparkCosts.assumed`.
REFERENCE = SparkCosts(job_s=0.05, task_s=0.01, broadcast_s_per_mib=0.004, result_s_per_mib=0.005,
                       driver_update_s_per_mib=0.002, hosts=1, cores_per_host=2, single_job_s=0.04,
                       driver_delta_s_per_mib=0.001, probe_tasks=2)


@dataclass
class NetworkCosts:
    """What one network costs per sample and per step on one core.

    Attributes:
        sample_s: forward+backward seconds per sample on one core at ``batch_size``.
        eval_sample_s: forward-only seconds per sample.
        param_bytes: bytes of the flat parameter vector.
        activation_bytes: bytes per sample at each layer's output.
        flops_per_sample: training flops per sample (forward + backward).
        gemm_gflops: the one-thread sgemm rate measured with it.
        batch_size: the batch size it was measured at.
        update_s: seconds of one optimizer step (RMSprop) over all parameters.
        step_fixed_s: seconds of a forward+backward that do not grow with its rows (how a
            smaller minibatch, e.g. a partition's slice of a global one, is extrapolated).
        n_params: parameters.
        in_tasks: measured inside Spark tasks running at once (``SparkCosts.task_speed`` is
            then already in the figures).
    """

    sample_s: float
    eval_sample_s: float
    param_bytes: int
    activation_bytes: list[int] = field(default_factory=list)
    flops_per_sample: float = 0.0
    gemm_gflops: float = 0.0
    batch_size: int = 128
    update_s: float = 0.0
    step_fixed_s: float = 0.0
    n_params: int = 0
    in_tasks: bool = False

    def __post_init__(self) -> None:
        if not (self.sample_s > 0 and math.isfinite(self.sample_s)) or int(self.batch_size) < 1:
            raise ValueError(f"NetworkCosts needs sample_s > 0 and batch_size >= 1, "
                             f"got {self.sample_s!r}, {self.batch_size!r}")

    param_mib = property(lambda self: self.param_bytes / MIB)

    def compute_s(self, rows: float) -> float:
        """Seconds of one forward+backward of ``rows`` rows on one core."""
        if rows <= 0:
            return 0.0
        b = self.batch_size
        fixed = min(self.step_fixed_s, 0.9 * self.sample_s * b)
        return fixed + (self.sample_s * b - fixed) / b * rows

    def local_steps_s(self, rows: float) -> float:
        """Seconds of the local steps of ``batch_size`` over ``rows`` rows (compute + updates)."""
        b = self.batch_size
        full = math.floor(rows / b)
        rest = rows - full * b
        updates = math.ceil(rows / b - 1e-9)
        return full * self.compute_s(b) + self.compute_s(rest) + updates * self.update_s

    def one_process_epoch_s(self, samples: int) -> float:
        """An epoch of ``samples`` in one process on one core."""
        return self.local_steps_s(samples)

    @classmethod
    def measure(cls, model: Any, batch_size: int, steps: int = 6, dtype: Any = None,
                min_seconds: float = 0.0, spark: Any = None) -> "NetworkCosts":
        """Time real training steps of a copy of ``model`` (built), one BLAS thread: ``steps``
        of them, more until ``min_seconds`` passed, in this process, or with ``spark`` in one
        task per slot of that session at once (``in_tasks``: the executors' own speed, the
        predictions then leave ``SparkCosts.task_speed`` out).  See
        :func:`sparknet.cluster.planning.probes.step_probe`."""
        net = _built(model, dtype)
        b = int(batch_size)
        got = (probe.step_probe(net, b, steps=steps, min_seconds=min_seconds) if spark is None else
               probe.step_probe_in_tasks(spark, net, b, steps=steps, min_seconds=min_seconds))
        flops, acts = probe.network_shape(net)
        half = max(1, b // 2)
        # t(b) = fixed + b p, t(b/2) = fixed + (b/2) p
        per = max(got["compute_s"] - got["half_s"], 0.0) / max(b - half, 1)
        fixed = max(got["compute_s"] - per * b, 0.0)
        return cls(sample_s=got["compute_s"] / b, eval_sample_s=got["eval_s"] / b,
                   param_bytes=int(net.params.nbytes), activation_bytes=acts,
                   flops_per_sample=flops, gemm_gflops=probe.gemm_gflops(), batch_size=b,
                   update_s=got["update_s"], step_fixed_s=fixed,
                   n_params=int(net.n_params), in_tasks=spark is not None)

    @classmethod
    def from_flops(cls, model: Any, batch_size: int, gemm_gflops: float, efficiency: float = 0.6,
                   update_bytes_s: float = 8e9) -> "NetworkCosts":
        """Costs from the network's flops at ``efficiency`` of the sgemm rate (and an
        optimizer step moving 16 bytes per parameter at ``update_bytes_s``), no timing."""
        if not gemm_gflops > 0:
            raise ValueError(f"gemm_gflops must be positive, got {gemm_gflops!r}")
        net = _built(model, None)
        flops, acts = probe.network_shape(net)
        rate = gemm_gflops * 1e9 * efficiency
        fwd = flops / 3.0   # forward: a third of training (two GEMMs per layer backward)
        return cls(sample_s=max(flops / rate, 1e-9), eval_sample_s=max(fwd / rate, 1e-9),
                   param_bytes=int(net.params.nbytes), activation_bytes=acts,
                   flops_per_sample=flops, gemm_gflops=gemm_gflops, batch_size=int(batch_size),
                   update_s=16.0 * net.n_params / update_bytes_s, n_params=int(net.n_params))


def _built(model: Any, dtype: Any) -> Any:
    net = model.clone(dtype=dtype) if dtype is not None else model
    if not net.built:
        raise ValueError("the model must be built (pass input_shape to Sequential) "
                         "to measure its costs")
    return net


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

"""What the cost model (:mod:`~sparknet.cluster.planning.cost`) is fed, measured or assumed:
:class:`SparkCosts`, what Spark and the cluster cost per job, task and MiB (probed on the live
session, or a cluster we do not have: :meth:`SparkCosts.assumed`, from the reference machine's
:data:`REFERENCE`), and :class:`NetworkCosts`, what one network costs per sample and per step on
one core (timed training steps, or its flops at a given sgemm rate).  The probes themselves are
in :mod:`~sparknet.cluster.planning.probes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from sparknet.cluster.planning import probes as probe

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
        return cls.from_counts(flops, int(net.n_params), int(net.params.nbytes), acts,
                               batch_size, gemm_gflops, efficiency, update_bytes_s)

    @classmethod
    def from_counts(cls, flops: float, n_params: int, param_bytes: int,
                    activation_bytes: list[int], batch_size: int, gemm_gflops: float,
                    efficiency: float = 0.6, update_bytes_s: float = 8e9) -> "NetworkCosts":
        """Costs of a network known by its counts alone (training ``flops`` per sample,
        parameters, activation bytes per sample and layer) at ``efficiency`` of the sgemm
        rate: the one rule of :meth:`from_flops` and of the planner's networks that are not
        built."""
        rate = gemm_gflops * 1e9 * efficiency
        fwd = flops / 3.0   # forward: a third of training (two GEMMs per layer backward)
        return cls(sample_s=max(flops / rate, 1e-9), eval_sample_s=max(fwd / rate, 1e-9),
                   param_bytes=int(param_bytes), activation_bytes=list(activation_bytes),
                   flops_per_sample=flops, gemm_gflops=gemm_gflops, batch_size=int(batch_size),
                   update_s=16.0 * n_params / update_bytes_s, n_params=int(n_params))


def _built(model: Any, dtype: Any) -> Any:
    net = model.clone(dtype=dtype) if dtype is not None else model
    if not net.built:
        raise ValueError("the model must be built (pass input_shape to Sequential) "
                         "to measure its costs")
    return net

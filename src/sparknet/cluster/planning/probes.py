"""Short probes behind :class:`~sparknet.cluster.planning.cost_inputs.SparkCosts` and
:class:`~sparknet.cluster.planning.cost_inputs.NetworkCosts`: what a job, a task, a MiB of
broadcast or of results and the driver's update cost on the live session, and what one training
step of a network costs on one core in this process.

Every Spark probe runs the code paths a training round runs: a
:class:`~sparknet.cluster.resident.driver.Resident` anchor with one partition per core, tasks
built like :class:`~sparknet.cluster.data_parallel.round_task.RoundTask` (they read a
:class:`~sparknet.cluster.data_parallel.parameter_server.ParameterServer` broadcast and return a
:class:`~sparknet.cluster.data_parallel.parameter_server.RoundResult`), summed by ``treeAggregate``
(:meth:`ParameterServer.gather`) inside :meth:`Resident.run_action`; the single-task
job of ``mode="async"`` is ``SparkContext.runJob`` over one partition.  Each figure is
the median of ``repeats`` jobs after one untimed job.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from sparknet.cluster.data_parallel.parameter_server import STATS, ParameterServer, RoundResult

if TYPE_CHECKING:
    from sparknet.model import Sequential

MIB = float(1 << 20)
#: the GEMM a compute probe repeats (float32, one thread): 2 * 192^3 flops each
_GEMM_N = 192


def tree_levels(partitions: int, depth: int = 2) -> tuple[int, int]:
    """``(results reaching the driver, shuffle levels)`` of ``treeAggregate(depth)`` over
    ``partitions`` partitions (PySpark's rule: add a level while
    ``n > scale + n / scale``, ``scale = max(ceil(P^(1/depth)), 2)``)."""
    n = max(1, int(partitions))
    scale = max(int(math.ceil(n ** (1.0 / depth))), 2)
    levels = 0
    x = float(n)
    while x > scale + x / scale:
        x /= scale
        levels += 1
    return max(1, int(x)), levels


def _median(xs: Iterable[float]) -> float:
    return float(statistics.median(list(xs)))


def _gemm_work(reps: int) -> float:
    """Seconds of ``reps`` one-thread float32 GEMMs of ``_GEMM_N``^3 in this process."""
    from threadpoolctl import threadpool_limits

    a = np.full((_GEMM_N, _GEMM_N), 0.5, dtype=np.float32)
    out = np.empty_like(a)
    with threadpool_limits(1):
        np.matmul(a, a, out=out)
        t0 = time.perf_counter()
        for _ in range(reps):
            np.matmul(a, a, out=out)
        return time.perf_counter() - t0


def gemm_times(n: int = 512, repeats: int = 5) -> list[float]:
    """Seconds of each of ``repeats`` one-thread float32 ``n x n`` GEMMs through the BLAS
    sparknet's kernels call (after one untimed)."""
    from threadpoolctl import threadpool_limits

    import sparknet._blas as _blas

    A = np.random.default_rng(0).random((n, n), dtype=np.float32)
    C = np.empty_like(A)
    times = []
    with threadpool_limits(1):
        _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
        for _ in range(repeats):
            t0 = time.perf_counter()
            _blas.py_gemm(False, False, 1.0, A, A, 0.0, C)
            times.append(time.perf_counter() - t0)
    return times


def gemm_gflops(n: int = 512, repeats: int = 5) -> float:
    """This process's one-thread float32 GEMM rate (GFLOP/s, median of ``repeats``) through
    the BLAS sparknet's kernels call."""
    return 2.0 * n ** 3 / _median(gemm_times(n, repeats)) / 1e9


def _slot(index: int, iterator: Iterable) -> tuple[dict, dict]:
    for _ in iterator:
        pass
    return {"slot": np.array([index], dtype=np.int64)}, {"pid": os.getpid()}


class _ProbeTask:
    """A probe round's task: read the broadcast (a parameter vector), optionally copy it and
    return a vector of ``out`` values (as an averaging round returns its delta), optionally
    run ``work`` GEMMs and report their seconds."""

    def __init__(self, bc: Any, out: int = 0, work: int = 0) -> None:
        self.bc, self.out, self.work = bc, int(out), int(work)

    def __call__(self, index: int, shard: Any) -> list[RoundResult]:
        p = self.bc.value
        vec = None
        if self.out:
            start = np.array(p[: self.out], copy=True)
            vec = np.ascontiguousarray(p[: self.out]) - start * np.float32(0.5)
        t = _gemm_work(self.work) if self.work else 0.0
        return [RoundResult(vec, np.zeros(len(STATS)), [t])]


def _identity(it: Iterable) -> Iterable:
    return it


def _noop_partition(it: Iterable) -> Iterable:
    for _ in it:
        pass
    return iter(())


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return _median(times)


def executor_layout(sc: Any) -> tuple[int, int, int]:
    """``(hosts, cores per host, executor processes)`` of the live session: local mode is
    one host with ``defaultParallelism`` cores."""
    cores = max(1, int(sc.defaultParallelism))
    master = sc.master or ""
    if master.startswith("local"):
        return 1, cores, 1
    try:
        status = sc._jsc.sc().getExecutorMemoryStatus()
        converters = sc._jvm.scala.collection.JavaConverters
        keys = [str(k) for k in converters.asJavaCollection(status.keys())]
    except Exception:  # pragma: no cover - an unusual gateway
        keys = []
    driver = sc.getConf().get("spark.driver.host", "")
    driver_port = sc.getConf().get("spark.driver.port", "")
    execs = [k for k in keys if k != f"{driver}:{driver_port}"] or keys
    hosts = max(1, len({k.rsplit(":", 1)[0] for k in execs}))
    return hosts, max(1, cores // hosts), max(1, len(execs))


def spark_probe(spark: Any, repeats: int = 3, bc_mib: float = 16.0, result_mib: float = 8.0,
                work: int = 1000) -> dict[str, Any]:
    """Measure the per-job, per-task and per-MiB costs of the live session (a few seconds).

    ``job_s`` is the fixed cost of a working round (wall time less the slowest task's
    compute), ``empty_job_s`` that of an empty one.

    Returns the fields of :class:`~sparknet.cluster.planning.cost_inputs.SparkCosts` (``job_s``,
    ``empty_job_s``, ``single_job_s``, ``task_s``, ``broadcast_s_per_mib``,
    ``result_s_per_mib``, ``driver_update_s_per_mib``, ``driver_delta_s_per_mib``,
    ``task_speed``, ``hosts``, ``cores_per_host``, ``executors``, ``bandwidth_bytes_s``,
    ``shared_cores``, ``probe_s``).
    """
    from sparknet.cluster.resident.driver import Resident

    t_start = time.perf_counter()
    sc = getattr(spark, "sparkContext", spark)
    hosts, per_host, executors = executor_layout(sc)
    c = hosts * per_host
    res = Resident(sc.parallelize(range(c), c), _slot, name="costprobe", cut_lineage=False,
                   on_lost="rebuild")
    n_bc, n_out = int(bc_mib * MIB / 4), int(result_mib * MIB / 4)
    tiny = ParameterServer(sc, np.zeros(1, dtype=np.float32))
    big = ParameterServer(sc, np.ones(n_bc, dtype=np.float32))
    try:
        def round_of(ps: ParameterServer, out: int = 0, w: int = 0) -> Callable[[], RoundResult]:
            def go() -> RoundResult:
                bc = ps.broadcast()
                return res.run_action(lambda: ps.gather(res.mapPartitions(_ProbeTask(bc, out, w))))
            return go

        def single() -> Any:
            bc = tiny.broadcast()
            return sc.runJob(res.mapPartitions(_ProbeTask(bc)), _identity, partitions=[0])

        def plain(n: int) -> Callable[[], Any]:
            return lambda: sc.parallelize(range(n), n).mapPartitions(_noop_partition).collect()

        # the empty jobs first, on their own: the large broadcasts and results of the others
        # leave the JVMs work (unpersisting, collecting) that would slow the next job
        light: dict[str, Callable[[], Any]] = {"job": round_of(tiny), "single": single,
                                               "c": plain(c), "2c": plain(2 * c)}
        heavy: dict[str, Callable[[], Any]] = {"bc": round_of(big),
                                               "res_small": round_of(big, out=n_out // 4),
                                               "res": round_of(big, out=n_out)}
        times: dict[str, list[float]] = {k: [] for k in (*light, *heavy)}
        speeds = []
        for kinds in (light, heavy):
            # interleaved, so that every kind sees the same load
            for _ in range(max(1, repeats) + 1):
                for k, fn in kinds.items():
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
        # compute: every task runs the same GEMMs at once (about half a second: a burst
        # after a sleep runs faster on a shared machine than sustained work); this process
        # runs them alone before and after, to follow a changing load.  The same rounds
        # give the fixed cost a working round pays: its wall time less its slowest task's
        # compute, as the trainers measure it (part of an empty job's per-task work overlaps
        # the other tasks' compute in a real round)
        fixed = []
        for _ in range(3):
            alone = _gemm_work(work)
            t0 = time.perf_counter()
            out = round_of(tiny, w=work)()
            fixed.append(time.perf_counter() - t0 - max(out.times))
            alone = 0.5 * (alone + _gemm_work(work))
            speeds.append(alone / max(_median(out.times), 1e-9))
        t = {k: v[1:] for k, v in times.items()}       # the first pass is a warm-up
        t_job, t_single = _median(t["job"]), _median(t["single"])
        t_fixed = min(_median(fixed), t_job)
        d_bc = _median(t["bc"]) - t_job
        # results: the least-squares slope through 0, a quarter and all of result_mib per task
        xs = np.array([0.0, 0.25 * c * result_mib, c * result_mib])
        slopes = [float(np.polyfit(xs, np.array([b, q, r]), 1)[0])
                  for b, q, r in zip(t["bc"], t["res_small"], t["res"])]
        d_task = _median(x - y for x, y in zip(t["2c"], t["c"]))
    finally:
        tiny.close()
        big.close()
        res.close()
    upd, delta = driver_update_probe()
    return {
        "job_s": max(t_fixed, 1e-4), "empty_job_s": max(t_job, 1e-4),
        "single_job_s": max(t_single, 1e-4),
        "task_s": max(d_task / c, 0.0),
        "broadcast_s_per_mib": max(d_bc / bc_mib, 0.0),
        "result_s_per_mib": max(_median(slopes), 0.0),
        "driver_update_s_per_mib": upd, "driver_delta_s_per_mib": delta,
        "task_speed": float(min(1.5, _median(speeds))),
        "hosts": hosts, "cores_per_host": per_host, "executors": executors,
        "bandwidth_bytes_s": loopback_bandwidth(),
        "shared_cores": _on_driver_host(sc), "probe_s": time.perf_counter() - t_start,
    }


def _on_driver_host(sc: Any) -> bool:
    """Whether the executors run on the driver's machine (local mode, or a cluster on it)."""
    if (sc.master or "").startswith("local"):
        return True
    driver = sc.getConf().get("spark.driver.host", "")
    try:
        status = sc._jsc.sc().getExecutorMemoryStatus()
        converters = sc._jvm.scala.collection.JavaConverters
        keys = [str(k) for k in converters.asJavaCollection(status.keys())]
    except Exception:  # pragma: no cover - an unusual gateway
        return False
    local = {driver, "127.0.0.1", "localhost", socket.gethostname()}
    return all(k.rsplit(":", 1)[0] in local for k in keys)


def driver_update_probe(mib: float = 8.0, repeats: int = 3) -> tuple[float, float]:
    """Seconds per MiB of parameters of the driver's work on a round's result: the
    ``sync="gradient"`` step (checks, mean, RMSprop step, the copy kept for the divergence
    check) and the ``sync="average"``/async apply (checks, ``params += w * delta``)."""
    from threadpoolctl import threadpool_limits

    from sparknet import optim as optim_mod
    from sparknet.cluster.data_parallel import guards

    n = int(mib * MIB / 4)
    params = np.zeros(n, dtype=np.float32)
    res = RoundResult(np.full(n, 1e-3, dtype=np.float32), np.ones(len(STATS)))
    opt = optim_mod.RMSprop(lr=1e-3)

    def gradient() -> None:
        guards.check_result(res, "gradient")
        assert res.vec is not None
        before = np.array(params, copy=True)
        opt.step(params, np.ascontiguousarray(res.vec / np.float32(2.0)))
        guards.check_params(params, before)

    def average() -> None:
        guards.check_result(res, "delta")
        assert res.vec is not None
        before = np.array(params, copy=True)
        params.__iadd__((res.vec / np.float32(2.0)).astype(np.float32, copy=False))
        guards.check_params(params, before)

    with threadpool_limits(1):
        return _timed(gradient, repeats) / mib, _timed(average, repeats) / mib


def loopback_bandwidth(mib: int = 32) -> float:
    """Bytes per second one TCP connection over 127.0.0.1 carries here (the local stand-in
    for the network between hosts)."""
    payload = b"\0" * (1 << 20)
    total = mib * len(payload)
    srv = socket.socket()
    try:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]

        def send() -> None:
            with socket.create_connection(("127.0.0.1", port)) as s:
                for _ in range(mib):
                    s.sendall(payload)
        th = threading.Thread(target=send, daemon=True)
        t0 = time.perf_counter()
        th.start()
        conn, _ = srv.accept()
        got = 0
        with conn:
            while got < total:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
        dt = time.perf_counter() - t0
        th.join(timeout=5)
    finally:
        srv.close()
    return got / max(dt, 1e-9)


# ------------------------------------------------------------------------ the network
def dense_flops(n_in: int, n_out: int, input_grad: bool) -> float:
    """Training flops per sample of a dense layer: forward, weight gradient (and input gradient)."""
    return 2.0 * n_in * n_out * (3.0 if input_grad else 2.0)


def dense_stages(blocked: Sequence[int], paired: bool) -> list[tuple[int, ...]]:
    """The blocked stages: tuples of one layer index (a block) or two (a pair)."""
    out: list[tuple[int, ...]] = []
    todo = sorted(set(int(i) for i in blocked))
    i = 0
    while i < len(todo):
        a = todo[i]
        if paired and i + 1 < len(todo) and todo[i + 1] == a + 1:
            out.append((a, a + 1))
            i += 2
        else:
            out.append((a,))
            i += 1
    return out


def layer_flops(layer: Any) -> float:
    """Forward flops (2 per multiply-add) of one built layer for one sample."""
    name = type(layer).__name__
    in_shape: tuple[int, ...] = tuple(layer.input_shape or ())
    out_shape: tuple[int, ...] = tuple(layer.output_shape or ())
    if name == "Dense":
        lead = int(np.prod(in_shape[:-1])) if len(in_shape) > 1 else 1
        return 2.0 * lead * layer.in_features * layer.units
    if name == "Conv2D":
        kh, kw = layer.kernel_size
        oh, ow = out_shape[0], out_shape[1]
        return 2.0 * oh * ow * kh * kw * layer.in_channels * layer.filters
    if name == "Conv1D":
        return 2.0 * out_shape[0] * layer.kernel_size * layer.in_channels * layer.filters
    if name in ("LSTM", "SimpleRNN", "GRU"):
        gates = {"LSTM": 4, "GRU": 3}.get(name, 1)
        T = int(in_shape[0])
        return 2.0 * T * gates * layer.units * (int(in_shape[-1]) + layer.units)
    if name == "MultiHeadAttention":
        T, D = layer.steps, layer.width
        return 2.0 * (4 * T * D * D + 2 * T * T * D)  # q, k, v, out projections; scores and mix
    children = getattr(layer, "children", None)
    if children:  # Residual, Bidirectional, TransformerEncoder: their layers' sum
        return float(sum(layer_flops(c) for c in children.values()))
    return 0.0


def network_shape(model: "Sequential") -> tuple[float, list[int]]:
    """``(training flops per sample, activation bytes per sample at each layer boundary)``:
    training is counted as forward + twice the forward for the backward (the first layer's
    input gradient skipped)."""
    itemsize = model.dtype.itemsize
    total, acts = 0.0, []
    for i, layer in enumerate(model.layers):
        f = layer_flops(layer)
        total += f * (2.0 if i == 0 else 3.0)
        acts.append(int(np.prod(layer.output_shape or (1,))) * itemsize)
    return total, acts


def random_batch(model: "Sequential", rows: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels/targets of ``rows`` samples shaped for ``model`` (token ids for an
    embedding, class ids for a classifier)."""
    assert model.input_shape is not None and model.output_shape is not None
    first = model.layers[0]
    if getattr(first, "accepts_int_input", False):
        vocab = int(getattr(first, "vocab", 2))
        x = rng.integers(0, vocab, size=(rows,) + tuple(model.input_shape))
    else:
        x = rng.random((rows,) + tuple(model.input_shape), dtype=np.float64).astype(model.dtype)
        try:
            first.check_input(x)
        except ValueError:  # values the first layer refuses (category ids): zeros are valid ids
            x = np.zeros_like(x)
    out = tuple(model.output_shape)
    if model.loss.is_classification:
        y = rng.integers(0, out[-1], size=(rows,) + out[:-1])
    else:
        y = rng.random((rows,) + out).astype(model.dtype)
    return x, y


def step_probe(model: "Sequential", batch_size: int, steps: int = 6, warmup: int = 2,
               threads: int = 1, min_seconds: float = 0.0) -> dict[str, float]:
    """Time real training steps of a copy of ``model`` in this process (``threads`` BLAS
    threads): each step gathers ``batch_size`` random rows from a pool (as a task's
    minibatch does), runs forward + backward, then the optimizer step (RMSprop), timed apart;
    at least ``steps`` timed steps, and more until ``min_seconds`` have passed (on a shared
    machine a short burst runs faster than the sustained work of a fit: the scheduler credits
    a thread that slept).

    Returns ``{"compute_s": s per forward+backward at batch_size, "half_s": the same at half
    the batch, "update_s": s per optimizer step, "eval_s": s per forward at batch_size}``
    (medians).
    """
    from threadpoolctl import threadpool_limits

    from sparknet import optim as optim_mod

    net = model.clone()
    rng = np.random.default_rng(0)
    pool_x, pool_y = random_batch(net, batch_size * 8, rng)
    opt = optim_mod.RMSprop(lr=1e-6)
    half = max(1, batch_size // 2)
    comp, halves, upd, ev = [], [], [], []
    t_end = time.perf_counter() + max(0.0, float(min_seconds))
    with threadpool_limits(threads):
        s = 0
        while s < warmup + steps or time.perf_counter() < t_end:
            idx = rng.integers(0, pool_x.shape[0], size=batch_size)
            t0 = time.perf_counter()
            xb, yb = pool_x[idx], pool_y[idx]
            net.loss_and_grad(xb, yb)
            t1 = time.perf_counter()
            opt.step(net.params, net.grads)
            t2 = time.perf_counter()
            net.loss_and_grad(xb[:half], yb[:half])
            t3 = time.perf_counter()
            net.loss_and_grad(xb, yb, need_grad=False, training=False)
            t4 = time.perf_counter()
            if s >= warmup:
                comp.append(t1 - t0)
                upd.append(t2 - t1)
                halves.append(t3 - t2)
                ev.append(t4 - t3)
            s += 1
    return {"compute_s": _median(comp), "half_s": _median(halves), "update_s": _median(upd),
            "eval_s": _median(ev)}


class _StepsInTask:
    """A task that rebuilds the network from its config and times its steps (:func:`step_probe`)."""

    def __init__(self, config: dict, input_shape: tuple, params: np.ndarray, batch_size: int,
                 steps: int, min_seconds: float) -> None:
        self.config, self.input_shape, self.params = config, input_shape, params
        self.batch_size, self.steps, self.min_seconds = batch_size, steps, min_seconds

    def __call__(self, it: Iterable) -> Iterable:
        from sparknet.model import Sequential

        for _ in it:
            pass
        net = Sequential.from_config(self.config)
        if not net.built:
            net.build(self.input_shape)
        net.set_params(self.params)
        yield step_probe(net, self.batch_size, steps=self.steps, min_seconds=self.min_seconds)


def step_probe_in_tasks(spark: Any, model: "Sequential", batch_size: int, steps: int = 6,
                        min_seconds: float = 0.0) -> dict[str, float]:
    """:func:`step_probe` run inside one Spark task per slot, all at once (so the figures hold
    whatever the executors' compute suffers beside each other and on a shared machine);
    the mean over the tasks of each figure."""
    sc = getattr(spark, "sparkContext", spark)
    c = max(1, int(sc.defaultParallelism))
    assert model.input_shape is not None
    task = _StepsInTask(model.get_config(), tuple(model.input_shape), np.asarray(model.params),
                        int(batch_size), int(steps), float(min_seconds))
    got = sc.parallelize(range(c), c).mapPartitions(task).collect()
    return {k: float(np.mean([g[k] for g in got])) for k in got[0]}

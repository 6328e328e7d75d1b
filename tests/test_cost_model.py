"""The cost model of every training mode (sparknet.cluster.planning.cost): the structure of its
equations, its probes on the live session, and one prediction against a real fit."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sparknet.cluster.planning.cost import (
    NetworkCosts,
    Prediction,
    RoundCostModel,
    SparkCosts,
    predict,
    predict_async,
    predict_model_parallel,
    predict_sync_average,
    predict_sync_gradient,
    tree_levels,
)

# one core's costs of a small MLP and a local[2]-like Spark, as the probes give them here
NET = NetworkCosts(sample_s=40e-6, eval_sample_s=15e-6, param_bytes=2_143_272, batch_size=128,
                   update_s=5e-4, step_fixed_s=3e-4, n_params=535_818, flops_per_sample=2.4e6)
SPARK = SparkCosts(job_s=0.06, task_s=0.01, broadcast_s_per_mib=0.004, result_s_per_mib=0.006,
                   driver_update_s_per_mib=0.002, hosts=1, cores_per_host=2, probe_tasks=2,
                   single_job_s=0.05, driver_delta_s_per_mib=0.001, shared_cores=True)


def _compute(p: Prediction) -> float:
    return p.breakdown["compute"] + p.breakdown.get("stragglers", 0.0)


@pytest.mark.parametrize("cores", [2, 8])
def test_more_partitions_never_predict_less_compute_per_partition_than_total_over_p(cores):
    spark = SparkCosts.assumed(1, cores, like=SPARK)
    N = 60_000
    one = NET.one_process_epoch_s(N)
    for P in (1, 2, 3, 4, 8, 16, 32):
        for p in (predict_sync_average(NET, spark, N, P, tau=50), predict_async(NET, spark, N, P, tau=50)):
            # a partition computes its N / P rows, and P > cores partitions wait for a core
            assert _compute(p) >= one / P * 0.999, (p.mode, P, _compute(p), one / P)
            assert _compute(p) >= one / cores * 0.999, (p.mode, P)
        g = predict_sync_gradient(NET, spark, N, P)
        assert _compute(g) >= math.ceil(N / NET.batch_size) * NET.compute_s(NET.batch_size / P) * 0.999
        for p in (g, predict_sync_average(NET, spark, N, P, tau=50)):
            assert p.epoch_s == pytest.approx(sum(p.breakdown.values()))


def test_average_is_the_papers_formula_with_a_fixed_latency_and_a_data_term():
    """T = K [T_lat + tau T_data]: the fixed part of a round does not depend on tau, the rest
    grows linearly with it."""
    N, P = 40_960, 2
    rounds = {}
    for tau in (10, 20, 40, 80):
        p = predict_sync_average(NET, SPARK, N, P, tau=tau)
        k = p.settings["rounds_per_epoch"]
        assert k == math.ceil(N / P / NET.batch_size / tau)
        assert p.epoch_s == pytest.approx(k * p.round_s)
        rounds[tau] = p
    per_round = {tau: _compute(p) / p.settings["rounds_per_epoch"] for tau, p in rounds.items()}
    fixed = {tau: p.round_s - per_round[tau] for tau, p in rounds.items()}
    assert max(fixed.values()) == pytest.approx(min(fixed.values()))
    step = NET.local_steps_s(NET.batch_size)
    for tau in rounds:
        assert per_round[tau] == pytest.approx(tau * step)
    # fewer, longer rounds pay the fixed latency less often
    assert rounds[80].epoch_s < rounds[10].epoch_s


def test_gradient_mode_pays_a_job_per_global_step():
    N = 12_800
    g = predict_sync_gradient(NET, SPARK, N, 2)
    a = predict_sync_average(NET, SPARK, N, 2, tau=50)
    assert g.step_s == g.round_s
    assert g.breakdown["job"] == pytest.approx(SPARK.job_s * N / NET.batch_size)
    assert g.epoch_s > 5 * a.epoch_s


def test_paired_blocks_halve_the_round_trips():
    sizes = [4096, 16384, 16384, 10]
    net = NetworkCosts(sample_s=2.5 / 256, eval_sample_s=0.8 / 256, param_bytes=4 * 335_700_000,
                       batch_size=256, update_s=0.3, n_params=335_700_000)
    for lookahead in (False, True):
        un = predict_model_parallel(net, SPARK, 256, 2, paired=False, layer_sizes=sizes, lookahead=lookahead)
        pa = predict_model_parallel(net, SPARK, 256, 2, paired=True, layer_sizes=sizes, lookahead=lookahead)
        # two blocked layers: 2 stages x (forward, backward) unpaired, one stage paired
        assert un.settings["jobs_per_step"] == (3 if lookahead else 4)
        assert pa.settings["jobs_per_step"] == (1 if lookahead else 2)
        if not lookahead:
            assert pa.breakdown["job"] == pytest.approx(un.breakdown["job"] / 2)
        assert pa.step_s < un.step_s
        # the blocks' compute is the same work either way: half the blocked flops per slot
        assert pa.breakdown["compute"] == pytest.approx(un.breakdown["compute"], rel=1e-6)
    # K blocks on K free cores: the blocked compute is cut K ways
    k4 = predict_model_parallel(net, SparkCosts.assumed(1, 4, like=SPARK), 256, 4, paired=True, layer_sizes=sizes)
    k2 = predict_model_parallel(net, SparkCosts.assumed(1, 4, like=SPARK), 256, 2, paired=True, layer_sizes=sizes)
    assert k4.breakdown["compute"] == pytest.approx(k2.breakdown["compute"] / 2, rel=1e-6)
    # hybrid: every replica's gradients cross the driver
    hy = predict("hybrid", net, SparkCosts.assumed(1, 4, like=SPARK), 256, blocks=2, paired=True, replicas=2,
                 layer_sizes=sizes)
    assert hy.mode == "hybrid" and hy.breakdown["combine"] > 0 and hy.settings["jobs_per_step"] > 2


def test_stragglers_slow_async_less_than_sync():
    N, P = 60_000, 4
    spark = SparkCosts.assumed(1, 4, like=SPARK)
    slow = [1.0, 1.0, 1.0, 0.5]
    sync_equal = predict_sync_average(NET, spark, N, P, tau=50)
    sync_slow = predict_sync_average(NET, spark, N, P, tau=50, speeds=slow)
    async_equal = predict_async(NET, spark, N, P, tau=50)
    async_slow = predict_async(NET, spark, N, P, tau=50, speeds=slow)
    assert sync_slow.epoch_s > 1.5 * sync_equal.epoch_s        # every round waits for the straggler
    assert async_slow.epoch_s / async_equal.epoch_s < sync_slow.epoch_s / sync_equal.epoch_s
    assert sync_slow.breakdown["stragglers"] > 0


def test_tree_aggregate_levels_and_the_network_of_an_assumed_cluster():
    assert tree_levels(1) == (1, 0) and tree_levels(2) == (2, 0) and tree_levels(4) == (4, 0)
    to_driver, levels = tree_levels(88)
    assert levels == 1 and to_driver < 88
    slow = SparkCosts.assumed(5, 16, bandwidth_gbit=1.0, like=SPARK)
    fast = SparkCosts.assumed(5, 16, bandwidth_gbit=10.0, like=SPARK)
    one_host = SparkCosts.assumed(1, 16, bandwidth_gbit=1.0, like=SPARK)
    a, b, c = (predict_sync_average(NET, s, 1_000_000, 80, tau=20) for s in (slow, fast, one_host))
    assert a.breakdown["network"] > b.breakdown["network"] > 0 == c.breakdown["network"]
    assert a.speedup < b.speedup


def test_bad_settings_are_refused_with_the_value():
    with pytest.raises(ValueError, match="partitions.*0"):
        predict_sync_average(NET, SPARK, 1000, 0, tau=5)
    with pytest.raises(ValueError, match="tau.*0"):
        predict("async", NET, SPARK, 1000, partitions=2, tau=0)
    with pytest.raises(ValueError, match="speeds"):
        predict_async(NET, SPARK, 1000, 2, tau=5, speeds=[1.0])
    with pytest.raises(ValueError, match="'sideways'"):
        predict("sideways", NET, SPARK, 1000)
    with pytest.raises(ValueError, match="job_s"):
        SparkCosts(job_s=-1, task_s=0, broadcast_s_per_mib=0, result_s_per_mib=0, driver_update_s_per_mib=0)
    assert RoundCostModel(0.5, 0.25).steps_for(0.5) == 2     # the trainers' model is unchanged


def _digits_model(seed: int = 0):
    from sparknet import Dense, Sequential
    return Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")], input_shape=(64,),
                      seed=seed)


def test_network_costs_measure_times_real_steps(digits):
    model = _digits_model()
    net = NetworkCosts.measure(model, 32)
    assert net.param_bytes == model.params.nbytes and net.n_params == model.n_params
    assert net.flops_per_sample == pytest.approx(2 * (2 * 64 * 128) + 3 * (2 * 128 * 10))
    assert 0 < net.eval_sample_s < net.sample_s < 1e-3
    assert 0 <= net.step_fixed_s < net.sample_s * 32 and net.update_s > 0
    ff = NetworkCosts.from_flops(model, 32, gemm_gflops=max(net.gemm_gflops, 1.0))
    assert ff.sample_s > 0 and ff.flops_per_sample == net.flops_per_sample


@pytest.mark.slow
def test_spark_costs_measure_and_a_real_fit_within_a_factor_of_2_5(spark, digits):
    """The probes on the local session are positive and plausible, and the prediction of a
    short synchronous fit on local[2] (job-dominated: digits) is of its size: within a factor
    of 2.5 either way.  How close it comes (-12% on a quiet machine, alone) is measured by
    ``benchmarks/bench_cost_model.py``, not here: inside the whole suite the shared session
    has run hundreds of jobs and the same fit took 2.2x the probes' prediction."""
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer

    X, y, _, _ = digits
    sc = SparkCosts.measure(spark, repeats=5)
    assert sc.hosts == 1 and sc.cores_per_host == 2 and sc.shared_cores and sc.network_measured
    assert 1e-3 < sc.job_s < 5.0 and 1e-3 < sc.single_job_s < 5.0
    for v in (sc.task_s, sc.broadcast_s_per_mib, sc.result_s_per_mib, sc.driver_update_s_per_mib):
        assert 0.0 <= v < 1.0
    assert 0.0 < sc.task_speed <= 1.5 and sc.bandwidth_bytes_s > 1e7  # the probe caps noise at 1.5
    # a few seconds on a quiet machine; the session's first jobs also start its Python workers
    assert 0 < sc.probe_s < 60.0, f"the probes took {sc.probe_s:.1f} s"

    model = _digits_model()
    net = NetworkCosts.measure(model, 16)
    pred = predict("average", net, sc, X.shape[0], partitions=2, tau=15)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, sync="average", local_steps=15, outer=None,
                                  optimizer=RMSprop(lr=3e-3))
    _, h = trainer.fit(X, y, epochs=5, batch_size=16, verbose=0, reuse_data=False)
    measured = float(np.median(h["time"][1:]))
    assert h["rounds"][-1] == pred.settings["rounds_per_epoch"]
    err = (pred.epoch_s - measured) / measured
    print(f"digits, local[2], sync average tau 15: predicted {pred.epoch_s:.3f} s/epoch, measured "
          f"{measured:.3f} ({100 * err:+.0f}%); {pred}")
    assert 1 / 2.5 <= pred.epoch_s / measured <= 2.5, f"predicted {pred.epoch_s:.3f} s, measured {measured:.3f} s; {pred}"
